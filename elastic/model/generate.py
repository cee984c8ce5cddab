"""Batched autoregressive generation with a KV cache, in plain PyTorch (no Ray, no process group).

`generate(model, prompts, max_new_tokens, ...)` returns, per prompt, the new token ids, the
log-probability of each under the model's own distribution and why it stopped:

* **Log-probabilities** are `log_softmax` of the raw logits (fp32), before temperature,
  top-k or top-p: the quantity a policy-gradient loss recomputes in its training forward
  pass, whatever sampling settings produced the tokens.
* **Batching.** Prompts of any lengths share a batch: they are left-padded, each row's
  positions start at 0 at its first real token and the padding is masked out
  (elastic/model/kv_cache.py). One prefill forward, then one [rows, 1] forward per step.
  A row that emits a stop token or reaches `max_new_tokens` leaves the batch, so finished
  rows stop costing compute.
* **Seeds.** Each row samples with its own `torch.Generator` (seeded from `seed`: one int per
  prompt, or `seed + i` for prompt i when a single int is given). Sampling is the
  exponential race (argmax of p / E with E ~ Exp(1) drawn from the row's generator: an exact
  draw from p), and every row draws the same amount of noise per step, so a prompt's sample
  depends on its seed alone, not on what else is in the batch. (Logits themselves may differ
  in the last bits between batch shapes; a sample flips only on such a near-tie.)
* **Stop tokens** end a row and are kept as its last token (finish reason `stop`);
  otherwise the row ends after `max_new_tokens` (finish reason `length`). `on_finish` is
  called for each row as it ends, so a caller can stream completions onward.
* `use_cache=False` recomputes the full sequence every step (a reference and a benchmark
  baseline); it gives the same tokens.

Runs on a plain model or on an FSDP2-sharded one: it only calls `model(...)` (the root
forward, which runs every block's forward and so every FSDP hook). To avoid one all-gather
per block per step, and the collective mismatch that would cause when ranks run different
numbers of steps, gather the parameters once around the call: elastic/train/fsdp_generate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from elastic.model.kv_cache import KVCache


@dataclass
class Completion:
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)  # log p(token) under the raw logits
    finish_reason: str = "length"  # "stop" | "length"


def _row_seeds(seed: Union[int, Sequence[int], None], n: int) -> List[int]:
    if seed is None:  # follows torch's global RNG, so torch.manual_seed makes it repeatable
        return torch.randint(0, 2**62, (n,)).tolist()
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"seed: {len(seeds)} seeds for {n} prompts")
    return seeds


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), as Hugging Face's logits warpers do."""
    x = logits / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[..., -1] = False  # always keep the most likely token
        x = x.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return x


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generators: Sequence[torch.Generator]) -> torch.Tensor:
    """logits: [B, V] fp32 → next token ids [B]. Greedy when temperature == 0."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
    V = probs.shape[-1]
    noise = torch.stack([torch.empty(V, device=probs.device).exponential_(generator=g) for g in generators])
    # An exact 0 draw would make 0/0 = NaN for a filtered-out token, and argmax picks NaN.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(-1)


def _model_device(model: nn.Module) -> torch.device:
    return model.tok_embeddings.weight.device  # also for FSDP's DTensor parameters


def _left_pad(seqs: List[List[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, L - len(s):] = torch.tensor(s, dtype=torch.long)
    start = torch.tensor([L - len(s) for s in seqs], dtype=torch.long)
    return tokens.to(device), start.to(device)


@torch.no_grad()
def generate(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] = (),
             seed: Union[int, Sequence[int], None] = None, use_cache: bool = True,
             on_finish: Optional[Callable[[int, Completion], None]] = None) -> List[Completion]:
    """Generate up to `max_new_tokens` after each prompt; see the module docstring.

    `on_finish(i, completion)` is called once per prompt as soon as prompt i's row finishes
    (e.g. to stream it to a reward service while the others are still decoding)."""
    n = len(prompts)
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0 or max_new_tokens < 0:
        raise ValueError(f"generate: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, max_new_tokens >= 0 "
                         f"(got {temperature}, {top_p}, {top_k}, {max_new_tokens})")
    vocab = model.args.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"generate: prompts[{i}] is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"generate: prompts[{i}] has token id {bad[0]} outside the vocabulary [0, {vocab})")
    out = [Completion() for _ in range(n)]
    if n == 0 or max_new_tokens == 0:
        return out
    device = _model_device(model)
    gens = []
    for s in _row_seeds(seed, n):
        g = torch.Generator(device=device)
        g.manual_seed(s)
        gens.append(g)
    stops = torch.tensor(sorted(set(int(t) for t in stop_token_ids)), dtype=torch.long, device=device)
    longest = max(len(p) for p in prompts)
    model.rope_table(device, longest + max_new_tokens)

    active = list(range(n))  # prompt index of each row of the current batch
    if use_cache:
        tokens, start = _left_pad(prompts, 0, device)
        cache = KVCache(model.args.n_layers, start, capacity=longest + max_new_tokens)
        logits = model(tokens, cache=cache, last_only=True)[:, -1].float()
    else:
        seqs = [list(p) for p in prompts]
        logits = _recompute_last(model, seqs)
    for step in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, top_p, [gens[i] for i in active])
        logp = torch.log_softmax(logits, -1).gather(-1, nxt[:, None])[:, 0]
        stopped = torch.isin(nxt, stops) if len(stops) else torch.zeros_like(nxt, dtype=torch.bool)
        nxt_l, logp_l, stopped_l = nxt.tolist(), logp.tolist(), stopped.tolist()
        keep = []
        for r, i in enumerate(active):
            out[i].tokens.append(nxt_l[r])
            out[i].logprobs.append(logp_l[r])
            if stopped_l[r]:
                out[i].finish_reason = "stop"
            elif step + 1 < max_new_tokens:
                keep.append(r)
                continue
            if on_finish is not None:
                on_finish(i, out[i])
        if not keep:
            break
        if len(keep) < len(active):  # drop finished rows
            rows = torch.tensor(keep, device=device)
            nxt = nxt[rows]
            if use_cache:
                cache.keep(rows)
            active = [active[r] for r in keep]
        if use_cache:
            logits = model(nxt[:, None], cache=cache, last_only=True)[:, -1].float()
        else:
            for i in active:
                seqs[i].append(out[i].tokens[-1])
            logits = _recompute_last(model, [seqs[i] for i in active])
    return out


def _recompute_last(model: nn.Module, seqs: List[List[int]]) -> torch.Tensor:
    """Last-position logits of each (left-padded) sequence, by a full forward without cache."""
    device = _model_device(model)
    tokens, start = _left_pad(seqs, 0, device)
    cols = torch.arange(tokens.shape[1], device=device)[None]
    positions = (cols - start[:, None]).clamp(min=0)
    doc_ids = (cols >= start[:, None]).long()  # padding is its own document
    return model(tokens, positions, doc_ids, last_only=True)[:, -1].float()
