"""Next-token sampling on the device, reproducible per row from (seed, token index) alone.

Why counter-based: a per-row `torch.Generator` means one Python call and one small kernel per
row per step, and generator state that a CUDA graph cannot advance. Here the randomness of the
token a row samples at index t (0 = first new token) is a pure function of the row's seed and
t, computed on the device for the whole batch at once, inside the captured decode step. So a
prompt's sample depends on its seed only: not on the batch it shares, its slot, when it was
admitted, or how many steps other rows ran (continuous batching keeps every prompt's tokens).

The draw is the inverse CDF: one uniform u in (0, 1) per row and token, and the token is the
first index whose cumulative probability exceeds u (fp64 cumsum, so the rounding of 128k fp32
terms does not shift the CDF). That is an exact draw from the filtered distribution with one
random number per row instead of one per vocabulary entry (the exponential race of
generate_reference.py needs V). u comes from a 32-bit integer hash (murmur3's fmix32, twice) of
the seed's two halves and t, in int64 arithmetic kept below 2^63, so it is bit-identical on
CPU and CUDA and inside compiled code (no reliance on integer overflow behaviour).

Log-probabilities are of the raw fp32 logits (before temperature, top-k, top-p): the quantity a
policy-gradient loss recomputes in its training forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1: off


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), as Hugging Face's logits warpers do.
    logits: [B, V] → [B, V] with the dropped entries at -inf. No host sync (graph-safe)."""
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


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x < 2^32, in int64 without overflow (16-bit halves of c)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser (a bijection with full avalanche) on int64 values < 2^32."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def counter_uniform(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """seed: [B] int64 (>= 0, up to 63 bits); index: [B] int64 → [B] float64 uniform in (0, 1),
    a fixed function of (seed, index)."""
    lo, hi = seed & M32, (seed >> 32) & M32
    h = _fmix32(lo ^ _mul32(index & M32, 0x9E3779B1))
    h = _fmix32(h ^ hi ^ 0x27D4EB2F)
    return (h.double() + 0.5) / 4294967296.0


def sample(logits: torch.Tensor, params: SamplingParams, seed: torch.Tensor, index: torch.Tensor
           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] fp32; seed, index: [B] int64 → (tokens [B] int64, log p(token) [B] fp32).

    Greedy (argmax, first on ties) when temperature == 0. No host sync, fixed shapes."""
    if params.temperature == 0:
        tok = logits.argmax(-1)
    else:
        probs = filter_logits(logits, params.temperature, params.top_k, params.top_p).softmax(-1)
        cdf = probs.double().cumsum(-1)
        # u < 1 - 2^-33, so target < cdf[-1] in fp64: the first index whose cdf exceeds it
        # always exists and has p > 0 (a dropped token adds nothing to the cdf).
        target = counter_uniform(seed, index) * cdf[:, -1]
        tok = torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
    logp = logits.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(logits, -1)
    return tok, logp
