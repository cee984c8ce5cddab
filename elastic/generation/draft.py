"""Drafters for speculative decoding (elastic/generation/speculative.py): who proposes the next k
tokens of each row for the policy to verify in one forward.

* `NgramDrafter` (prompt lookup, no model): find the most recent earlier occurrence of the row's
  last n tokens (n = `ngram` down to 1) in its prompt + generated context that k tokens follow
  (else the one most tokens follow) and propose those tokens. No match: no proposal (the round emits one policy token). Its
  proposal distribution is a point mass (q = None).
* `ModelDrafter` (a smaller plain `Transformer` with the policy's vocabulary): its own static
  KV cache, one slot per policy slot; it samples k tokens autoregressively with the same
  sampling settings (greedy: argmax) and returns its filtered distributions q [b, k, V] for
  the rejection test. Its cache keeps what it has seen of each row; after a verify round the
  rejected tail is dropped by moving the row's cached length back (positions past it are
  masked and later overwritten: nothing is copied).

Interface (duck-typed; the verifier calls, in order): `start(slots, capacity, device)` once per
call, `admit(slots, prompts)` when rows are prefilled, `propose(ctxs, k, params, seed, gen)` ->
(drafts [b, k] int64, n_prop [b] int64, q [b, k, V] fp32 or None) for rows [0, b), `commit(accepted)`
after the verify, and `move(src, dst)` / `release(slots)` as rows are compacted or finish.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from elastic.generation.chunk import chunk_logits
from elastic.generation.decoder import check_unsharded, model_device
from elastic.generation.prefill import prefill_slots
from elastic.generation.sampling import SamplingParams, counter_uniform, filter_logits
from elastic.generation.static_cache import StaticKVCache

# The draft model's draws use their own stream of (seed ^ SALT, token index) uniforms.
SALT_DRAFT = 0x5DEECE66D2F1B3A7 & ((1 << 62) - 1)

Proposal = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [b, V] (unnormalised, >= 0), u [b] float64 in (0, 1) -> [b] int64
    (as sampling.sample draws: fp64 cumulative sum, first index whose cdf exceeds u x total)."""
    cdf = probs.double().cumsum(-1)
    target = u * cdf[:, -1]
    return torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def lookup(ctx: List[int], k: int, ngram: int) -> List[int]:
    """Prompt lookup: the k tokens after the most recent earlier occurrence of ctx's last n tokens
    that has k tokens after it (else the occurrence with the most tokens after it: a match close
    to the end, as in a repeating loop, has fewer), for n = ngram down to 1; [] when none occurs."""
    L = len(ctx)
    for n in range(min(ngram, L - 1), 0, -1):
        tail, last, best = ctx[L - n:], ctx[-1], []
        for i in range(L - n - 1, -1, -1):  # the occurrence must end before the tail's last token
            if ctx[i + n - 1] == last and ctx[i:i + n] == tail:
                follow = ctx[i + n:i + n + k]
                if len(follow) == k:
                    return follow
                best = follow if len(follow) > len(best) else best
        if best:
            return best
    return []


class NgramDrafter:
    """Prompt-lookup drafting (see the module docstring); stateless."""

    def __init__(self, ngram: int = 3):
        if ngram < 1:
            raise ValueError(f"NgramDrafter: ngram must be >= 1, got {ngram}")
        self.ngram = ngram

    def start(self, slots: int, capacity: int, device: torch.device) -> None:
        self.device = device

    def admit(self, slots: List[int], prompts: List[List[int]]) -> None:
        pass

    def propose(self, ctxs: List[List[int]], k: int, params: SamplingParams, seed: torch.Tensor,
                gen: torch.Tensor) -> Proposal:
        drafts = torch.zeros(len(ctxs), k, dtype=torch.long)
        n_prop = torch.zeros(len(ctxs), dtype=torch.long)
        for r, ctx in enumerate(ctxs):
            d = lookup(ctx, k, self.ngram)
            drafts[r, :len(d)] = torch.tensor(d, dtype=torch.long)
            n_prop[r] = len(d)
        return drafts.to(self.device), n_prop.to(self.device), None

    def commit(self, accepted: List[int]) -> None:
        pass

    def move(self, src: List[int], dst: List[int]) -> None:
        pass

    def release(self, slots: List[int]) -> None:
        pass


class ModelDrafter:
    """A small draft model with its own static cache (see the module docstring)."""

    def __init__(self, model: nn.Module):
        check_unsharded(model)
        self.model = model.eval()

    def start(self, slots: int, capacity: int, device: torch.device) -> None:
        a = self.model.args
        device = model_device(self.model) if model_device(self.model).type == device.type else device
        self.model.to(device)  # no-op when already there
        self.device = device
        self.cache = StaticKVCache(a.n_layers, slots, a.n_kv_heads, capacity, a.head_dim,
                                   self.model.tok_embeddings.weight.dtype, device)
        self.rope = self.model.rope_table(device, capacity)
        self.cached = [0] * slots  # tokens of each slot's context whose keys/values are in the cache
        self._base: List[int] = []

    def admit(self, slots: List[int], prompts: List[List[int]]) -> None:
        prefill_slots(self.model, self.cache, self.rope, slots, prompts)
        for s, p in zip(slots, prompts):
            self.cached[s] = len(p)

    def _dist(self, logits: torch.Tensor, params: SamplingParams, seed: torch.Tensor, idx: torch.Tensor):
        if params.temperature == 0:
            return logits.argmax(-1), None
        q = filter_logits(logits, params.temperature, params.top_k, params.top_p).softmax(-1)
        return draw(q, counter_uniform(seed ^ SALT_DRAFT, idx)), q

    def propose(self, ctxs: List[List[int]], k: int, params: SamplingParams, seed: torch.Tensor,
                gen: torch.Tensor) -> Proposal:
        b = len(ctxs)
        # Catch up on what the draft has not seen (the last policy token; after a fully accepted
        # round also the k-th draft), right-padded: the padding's writes land past the context
        # and are overwritten by the first draft step.
        tail = [c[self.cached[r]:] for r, c in enumerate(ctxs)]
        m = max(len(t) for t in tail)
        toks = torch.tensor([t + [0] * (m - len(t)) for t in tail], dtype=torch.long, device=self.device)
        pos = torch.tensor(self.cached[:b], dtype=torch.long, device=self.device)
        logits = chunk_logits(self.model, self.cache, self.rope, toks, pos)
        last = torch.tensor([len(t) - 1 for t in tail], device=self.device)
        logits = logits[torch.arange(b, device=self.device), last]
        drafts, qs = [], []
        pos = torch.tensor([len(c) for c in ctxs], dtype=torch.long, device=self.device)
        for j in range(k):
            tok, q = self._dist(logits, params, seed, gen + j)
            drafts.append(tok)
            qs.append(q)
            if j + 1 < k:
                logits = chunk_logits(self.model, self.cache, self.rope, tok[:, None], pos + j)[:, 0]
        self._base, self._kmax = [len(c) for c in ctxs], k
        n_prop = torch.full((b,), k, dtype=torch.long, device=self.device)
        return torch.stack(drafts, 1), n_prop, (None if params.temperature == 0 else torch.stack(qs, 1))

    def commit(self, accepted: List[int]) -> None:
        """Rows [0, b) accepted `accepted[r]` drafts: the draft cache holds the context and drafts
        1..k-1, so min(accepted, k-1) of them stay."""
        for r, a in enumerate(accepted):
            self.cached[r] = self._base[r] + min(a, self._kmax - 1)

    def move(self, src: List[int], dst: List[int]) -> None:
        if src:
            self.cache.move(torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device))
            for s, d in zip(src, dst):
                self.cached[d] = self.cached[s]

    def release(self, slots: List[int]) -> None:
        pass
