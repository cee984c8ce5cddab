"""Speculative decoding: a drafter proposes k tokens per row, the policy verifies them in one
forward over [last token + k drafts] (elastic/generation/chunk.py, on the static KV cache), and
each round emits the accepted drafts plus one policy token (the correction, or a bonus token
when all were accepted): between 1 and k + 1 tokens per policy forward.

Acceptance (Leviathan et al. 2023, Chen et al. 2023), on the device for the whole batch:

* greedy (temperature 0): accept drafts while each equals the policy's argmax at its position;
  the emitted token after them is the policy's argmax there. The output is the policy's greedy
  output token for token (up to floating-point near-ties between a [b, k+1] forward and the
  [b, 1] decode step; tests/test_speculative.py checks equality on CPU).
* sampling: p = the policy's filtered distribution (temperature, top-k, top-p, as sampling.py),
  q = the drafter's (a point mass for prompt lookup). Draft x is accepted with probability
  min(1, p(x)/q(x)); at the first rejection the token is drawn from norm(max(0, p - q)) (for a
  point mass: p without x, renormalised), and after k acceptances a bonus token is drawn from p.
  Every emitted token is then distributed as the policy's (tests/test_speculative.py checks it
  with a chi-square test, with a deliberately bad draft too).

Randomness: the acceptance test of token index t uses counter_uniform(seed ^ SALT_ACCEPT, t) and
the draw of a corrected/bonus token counter_uniform(seed, t) (the engine's own uniform for that
index); a draft model samples with counter_uniform(seed ^ SALT_DRAFT, t). So a completion is a
fixed function of (seed, drafter) and does not depend on the batch (up to near-ties), but it is
not the completion the engine samples without drafting: same distribution, different draws
(they coincide for a token the drafter proposed nothing for).

Log-probabilities are the policy's log_softmax of raw fp32 logits at each emitted token, as the
engine returns them.

Scope: eager only (no CUDA graphs; `mode` other than eager/auto is refused), continuous batching
(rows finishing free slots for waiting prompts; live rows compacted to the front), stops and
on_finish as in generate. `SpecStats` counts proposals, acceptances, forwards and time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from elastic.generation.chunk import chunk_logits
from elastic.generation.completion import Completion
from elastic.generation.decoder import model_device
from elastic.generation.draft import ModelDrafter, NgramDrafter, draw
from elastic.generation.prefill import prefill_slots
from elastic.generation.sampling import SamplingParams, counter_uniform, filter_logits, sample
from elastic.generation.static_cache import StaticKVCache

SALT_ACCEPT = 0x2545F4914F6CDD1D & ((1 << 62) - 1)


@dataclass
class SpecStats:
    """Counters of one or more speculative generate calls (pass the same object to add up)."""

    proposed: int = 0   # draft tokens proposed (rows with no n-gram match propose none)
    accepted: int = 0   # of them accepted by the policy
    emitted: int = 0    # tokens emitted by verify rounds (accepted + one policy token per row-round; stops truncate)
    tokens: int = 0     # tokens returned (prefill's first token included)
    rounds: int = 0     # verify forwards (one per round for the whole batch)
    row_rounds: int = 0  # rows verified, summed over rounds
    seconds: float = 0.0  # wall clock of the calls

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens a row gains per policy forward (1 without drafting)."""
        return self.emitted / self.row_rounds if self.row_rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"proposed": self.proposed, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
                "tokens": self.tokens, "rounds": self.rounds, "tokens_per_round": self.tokens_per_round,
                "seconds": self.seconds, "tokens_per_s": self.tokens_per_s}


def load_draft(path: str, device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None) -> nn.Module:
    """A draft model from a Hugging Face directory or an elastic checkpoint step directory
    (elastic/model/hf.py from_pretrained)."""
    from elastic.model.hf import from_pretrained

    return from_pretrained(path, device=device, dtype=dtype).eval()


def make_drafter(draft, ngram: int = 3):
    """`draft`: "ngram" (prompt lookup), a model (nn.Module), a path (loaded by load_draft) or a
    drafter object (start/admit/propose/commit/move/release)."""
    if isinstance(draft, str):
        return NgramDrafter(ngram) if draft == "ngram" else ModelDrafter(load_draft(draft))
    if isinstance(draft, nn.Module):
        return ModelDrafter(draft)
    return draft


def accept(logits: torch.Tensor, drafts: torch.Tensor, n_prop: torch.Tensor, q: Optional[torch.Tensor],
           params: SamplingParams, seed: torch.Tensor, gen: torch.Tensor):
    """The verify rule for rows [0, b). logits [b, k+1, V] fp32 of the policy at [last, d1..dk];
    drafts [b, k]; n_prop [b] (drafts beyond it are padding); q [b, k, V] (None: point masses);
    seed [b]; gen [b] = token index of d1. Returns (tokens [b, k+1], log p [b, k+1], accepted [b]):
    row r emits tokens[r, :accepted[r] + 1]."""
    b, K1, V = logits.shape
    k = K1 - 1
    dev = logits.device
    rows = torch.arange(b, device=dev)
    j = torch.arange(k, device=dev)
    if params.temperature == 0:
        target = logits.argmax(-1)  # [b, k+1]
        ok = drafts == target[:, :k]
    else:
        p = filter_logits(logits.reshape(b * K1, V), params.temperature, params.top_k, params.top_p)
        p = p.softmax(-1).reshape(b, K1, V)
        px = p[:, :k].gather(-1, drafts[..., None])[..., 0].double()
        qx = q.gather(-1, drafts[..., None])[..., 0].double() if q is not None else torch.ones_like(px)
        u = counter_uniform((seed ^ SALT_ACCEPT)[:, None].expand(b, k).reshape(-1), (gen[:, None] + j).reshape(-1))
        ok = u.view(b, k) * qx < px  # u < p/q: probability min(1, p/q)
    ok = ok & (j[None] < n_prop[:, None])
    a = ok.long().cumprod(-1).sum(-1)  # drafts accepted
    if params.temperature == 0:
        nxt = target[rows, a]
    else:
        pa = p[rows, a]  # [b, V]
        ja = a.clamp(max=k - 1)
        qa = q[rows, ja] if q is not None else torch.nn.functional.one_hot(drafts[rows, ja], V).to(pa.dtype)
        resid = torch.where((a < n_prop)[:, None], (pa - qa).clamp_min(0), pa)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, pa)  # p == q to rounding: nothing left
        nxt = draw(resid, counter_uniform(seed, gen + a))
    toks = torch.cat((drafts, torch.zeros_like(drafts[:, :1])), 1)
    toks[rows, a] = nxt
    logp = logits.gather(-1, toks[..., None])[..., 0] - torch.logsumexp(logits, -1)
    return toks, logp, a


def generate_speculative(model: nn.Module, drafter, prompts: List[List[int]], seeds: List[int], max_new_tokens: int,
                         params: SamplingParams, draft_tokens: int, stop_token_ids: Sequence[int] = (),
                         stop_sequences: Sequence[List[int]] = (),
                         on_finish: Optional[Callable[[int, Completion], None]] = None, max_batch: int = 256,
                         out: Optional[List[Completion]] = None, stats: Optional[SpecStats] = None) -> List[Completion]:
    """Speculative generation (module docstring); `generate(..., draft=...)` calls this after
    checking its inputs."""
    if draft_tokens < 1:
        raise ValueError(f"generate: draft_tokens must be >= 1, got {draft_tokens}")
    t0 = time.perf_counter()
    stats = stats if stats is not None else SpecStats()
    out = out if out is not None else [Completion() for _ in prompts]
    run = _Spec(model, drafter, prompts, seeds, max_new_tokens, params, draft_tokens, stop_token_ids,
                stop_sequences, on_finish, max_batch, out, stats)
    run.run()
    stats.seconds += time.perf_counter() - t0
    return out


class _Spec:
    def __init__(self, model, drafter, prompts, seeds, max_new, params, k, stop_ids, stop_seqs, on_finish,
                 max_batch, out, stats):
        a = model.args
        self.model, self.drafter, self.prompts, self.seeds = model, drafter, prompts, seeds
        self.max_new, self.params, self.k, self.out, self.stats = max_new, params, k, out, stats
        self.stop_ids = set(int(t) for t in stop_ids)
        self.stop_seqs = [list(q) for q in stop_seqs]
        self.on_finish = on_finish
        self.dev = model_device(model)
        self.slots = min(len(prompts), max_batch)
        capacity = max(len(p) for p in prompts) + max_new + k + 2
        self.cache = StaticKVCache(a.n_layers, self.slots, a.n_kv_heads, capacity, a.head_dim,
                                   model.tok_embeddings.weight.dtype, self.dev)
        self.rope = model.rope_table(self.dev, capacity)
        dm = getattr(drafter, "model", None)
        if dm is not None and dm.args.vocab_size != a.vocab_size:
            raise ValueError(f"generate: the draft model's vocabulary ({dm.args.vocab_size}) is not the policy's ({a.vocab_size})")
        drafter.start(self.slots, capacity, self.dev)
        self.queue = deque(range(len(prompts)))
        self.row: List[Optional[int]] = [None] * self.slots  # prompt index in each slot
        self.ctx: List[Optional[List[int]]] = [None] * self.slots  # prompt + generated (last one not cached)

    def run(self) -> None:
        self._admit()
        while any(r is not None for r in self.row):
            self._round()
            self._admit()

    def _record(self, s: int, toks: List[int], lps: List[float]) -> bool:
        """Append tokens to slot s's completion up to a stop or the length limit; True if finished."""
        i = self.row[s]
        c = self.out[i]
        for t, lp in zip(toks, lps):
            c.tokens.append(t)
            c.logprobs.append(lp)
            self.ctx[s].append(t)
            self.stats.tokens += 1
            if t in self.stop_ids or any(c.tokens[-len(q):] == q for q in self.stop_seqs):
                c.finish_reason = "stop"
            elif len(c.tokens) < self.max_new:
                continue
            if self.on_finish is not None:
                self.on_finish(i, c)
            return True
        return False

    def _finish(self, slots: List[int]) -> None:
        for s in slots:
            self.row[s], self.ctx[s] = None, None
        self.drafter.release(slots)

    def _admit(self) -> None:
        """Pack live rows to the front, then prefill waiting prompts into the free slots."""
        live = [s for s in range(self.slots) if self.row[s] is not None]
        n = len(live)
        src = [s for s in live if s >= n]
        if src:
            dst = [s for s in range(n) if self.row[s] is None]
            st, dt = torch.tensor(src, device=self.dev), torch.tensor(dst, device=self.dev)
            self.cache.move(st, dt)
            self.drafter.move(src, dst)
            for a, d in zip(src, dst):
                self.row[d], self.ctx[d], self.row[a], self.ctx[a] = self.row[a], self.ctx[a], None, None
        while self.queue and n < self.slots:
            take = list(range(n, min(self.slots, n + len(self.queue))))
            idx = [self.queue.popleft() for _ in take]
            ps = [self.prompts[i] for i in idx]
            logits = prefill_slots(self.model, self.cache, self.rope, take, ps)
            seed = torch.tensor([self.seeds[i] for i in idx], dtype=torch.long, device=self.dev)
            tok, lp = sample(logits, self.params, seed, torch.zeros_like(seed))
            self.drafter.admit(take, ps)
            for s, i in zip(take, idx):
                self.row[s], self.ctx[s] = i, list(self.prompts[i])
            done = [s for s, t, l in zip(take, tok.tolist(), lp.tolist()) if self._record(s, [t], [l])]
            self._finish(done)
            if done:
                self._admit()
                return
            n = len(take) + n

    def _round(self) -> None:
        b = sum(r is not None for r in self.row)
        ctxs = self.ctx[:b]
        seed = torch.tensor([self.seeds[self.row[s]] for s in range(b)], dtype=torch.long, device=self.dev)
        gen = torch.tensor([len(self.out[self.row[s]].tokens) for s in range(b)], dtype=torch.long, device=self.dev)
        drafts, n_prop, q = self.drafter.propose(ctxs, self.k, self.params, seed, gen)
        tokens = torch.cat((torch.tensor([c[-1] for c in ctxs], device=self.dev)[:, None], drafts), 1)
        pos = torch.tensor([len(c) - 1 for c in ctxs], dtype=torch.long, device=self.dev)
        logits = chunk_logits(self.model, self.cache, self.rope, tokens, pos)
        toks, logp, a = accept(logits, drafts, n_prop, q, self.params, seed, gen)
        toks, logp, a, n_prop = toks.tolist(), logp.double().tolist(), a.tolist(), n_prop.tolist()
        self.drafter.commit(a)
        self.stats.rounds += 1
        self.stats.row_rounds += b
        self.stats.proposed += sum(n_prop)
        self.stats.accepted += sum(a)
        self.stats.emitted += sum(a) + b
        done = [s for s in range(b) if self._record(s, toks[s][:a[s] + 1], logp[s][:a[s] + 1])]
        self._finish(done)
