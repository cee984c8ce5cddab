"""The reference generation path (the pre-engine `generate()`), kept for the tests and the
benchmark to compare the engine (elastic/generation/generate.py) with. Nothing else calls it.

Left-padded batch through `Transformer.forward(..., cache=KVCache)` (elastic/generation/kv_cache.py):
one prefill forward, then one [rows, 1] forward per step with a dense [rows, 1, 1, S] mask
whose key length S grows every step; finished rows leave the batch (a copy of the cache).
Each row samples with its own `torch.Generator`: the exponential race (argmax of p / E,
E ~ Exp(1) from the row's generator), so its sampled tokens differ from the engine's
counter-based ones (same distribution, different draws); greedy tokens and log-probabilities
are the same. `use_cache=False` recomputes the full left-padded sequence every step.
It calls the root `model(...)`, so on an FSDP2 model FSDP's hooks run (one all-gather per block
per step unless the parameters are gathered around the call).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from elastic.generation.completion import Completion, check_inputs, row_seeds
from elastic.generation.kv_cache import KVCache
from elastic.generation.sampling import filter_logits


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
def generate_reference(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, temperature: float = 0.0,
                       top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] = (),
                       seed: Union[int, Sequence[int], None] = None, use_cache: bool = True,
                       on_finish: Optional[Callable[[int, Completion], None]] = None) -> List[Completion]:
    """The reference generation (see the module docstring); same arguments and results as
    elastic.generation.generate.generate, except for which tokens a seed samples.

    `on_finish(i, completion)` is called once per prompt as soon as prompt i's row finishes
    (e.g. to stream it to a reward service while the others are still decoding)."""
    n = len(prompts)
    check_inputs(model, prompts, max_new_tokens, temperature, top_p, top_k)
    out = [Completion() for _ in range(n)]
    if n == 0 or max_new_tokens == 0:
        return out
    device = _model_device(model)
    gens = []
    for s in row_seeds(seed, n):
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
