"""The decode step: one token for each live slot, with shapes fixed by (b, kv_len), eager or
compiled with inductor. It is the unit CUDA captures as a graph (cuda_graphs.py), driven by
`CachedDecoder` (decoder.py), which owns the state tensors and the static cache it reads.

Why compile this function with symbolic sizes: the compile cache is per process, so later calls
only capture. It is compiled with symbolic sizes (batch bucket, slots, capacity), so three
compiles per sampling setting cover every call: batch >= 2, batch 1 and slots 1 (dynamo
specialises sizes 0 and 1), instead of one per bucket and capacity (checked on CPU:
tests/test_generate_engine.py). Sampling settings are Python constants of the graph (greedy and
sampled compile apart).
"""

from __future__ import annotations

import functools
from typing import Callable, List, NamedTuple

import torch
import torch.nn as nn

from elastic.generation.sampling import SamplingParams, sample
from elastic.generation.static_cache import DecodeAttention

def _unhooked(block: nn.Module) -> Callable:
    """The block's own forward: skips module hooks (FSDP's) and an activation-checkpoint wrapper."""
    return getattr(block, "_checkpoint_wrapped_module", block).forward


def forward_hidden(model: nn.Module, tokens: torch.Tensor, freqs: torch.Tensor, att) -> torch.Tensor:
    """tokens [B, T], freqs [B or 1, T, D/2] complex → final-normed hidden states [B, T, dim].
    Mirrors Transformer.forward's layer loop (the exactness tests compare the two)."""
    h = model.tok_embeddings(tokens)
    for layer in model.layers:
        h = _unhooked(layer)(h, freqs, None, att)
    return model.norm(h)


class Rotation(NamedTuple):
    """RoPE angles as cos (`real`) and sin (`imag`) [b, 1, D/2]: the two attributes
    llama.apply_rope reads of its complex table, without a complex tensor in the compiled step."""

    real: torch.Tensor
    imag: torch.Tensor


def decode_step(model: nn.Module, tok: torch.Tensor, pos: torch.Tensor, seed: torch.Tensor, gen: torch.Tensor,
                live: torch.Tensor, k: List[torch.Tensor], v: List[torch.Tensor], rope_real: torch.Tensor,
                b: int, kv_len: int, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One token for slots [0, b), reading kv_len cache entries. State tensors are [slots] (tok,
    pos, seed, gen int64; live int64 0/1), k/v per layer [slots, Hkv, capacity, D], rope_real
    [n, D/2, 2] fp32 (the RoPE table as `view_as_real`: inductor leaves any complex value in the
    graph to eager). Writes each slot's key/value at pos, samples token `gen` of each slot, then
    in place: tok = sampled, pos += live, gen += live. Returns [2, b] float64: the sampled tokens
    (exact: ids < 2^53) and their log-probabilities."""
    att = DecodeAttention([t[:b] for t in k], [t[:b] for t in v], pos[:b], kv_len)
    return decode_rows(model, att, tok, pos, seed, gen, live, rope_real, b, temperature, top_k, top_p)


def decode_rows(model: nn.Module, att, tok: torch.Tensor, pos: torch.Tensor, seed: torch.Tensor, gen: torch.Tensor,
                live: torch.Tensor, rope_real: torch.Tensor, b: int, temperature: float, top_k: int,
                top_p: float) -> torch.Tensor:
    """A decode step once its attention is made (`att`: the static cache's DecodeAttention, or
    paged_cache's, built for slots [0, b) at pos[:b]): the model on each slot's input token at
    its position, sampling, and the in-place state update. Arguments and result as decode_step."""
    tok_b, pos_b, live_b, gen_b = tok[:b], pos[:b], live[:b], gen[:b]
    rot = rope_real[pos_b][:, None]  # [b, 1, D/2, 2]
    freqs = Rotation(rot[..., 0], rot[..., 1])  # what apply_rope reads of a complex table, as real tensors
    h = forward_hidden(model, tok_b[:, None], freqs, att)
    logits = model.output(h)[:, 0].float()
    nxt, logp = sample(logits, SamplingParams(temperature, top_k, top_p), seed[:b], gen_b)
    tok_b.copy_(nxt)
    pos_b.add_(live_b)
    gen_b.add_(live_b)
    return torch.stack((nxt.double(), logp.double()))


# Compiles per process before dynamo falls back to eager: a few per sampling setting.
RECOMPILE_LIMIT = 64


@functools.lru_cache(maxsize=None)
def compiled_decode_step(backend="inductor") -> Callable:
    """`decode_step` compiled (inductor: no cudagraphs of its own), full graph. `backend`
    is for the CPU tests, which count the graphs dynamo produces."""
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=True, backend=backend)
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"

    @functools.wraps(decode_step)
    def run(*args):
        for t in args[1:6]:  # slot state: the slot count varies between calls
            torch._dynamo.maybe_mark_dynamic(t, 0)
        for t in args[6] + args[7]:  # the caches: slots and capacity
            torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(t, 2)
        with cfg.patch(**{limit: max(getattr(cfg, limit), RECOMPILE_LIMIT)}):
            return compiled(*args)

    return run
