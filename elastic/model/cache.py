"""What the model asks of a key/value cache: the protocols any generation cache implements.

The model owns no cache. `Transformer.forward(..., cache=...)` and the blocks' `Attention` talk to
whatever object they are given through these methods, so a new cache (paged, quantized, shared
across drafts) lives in elastic/generation/ and the model does not change. Today's caches:
generation/kv_cache.py (left-padded, the reference path) and generation/static_cache.py (the
engine's slots; it drives the blocks itself and meets only `CacheAttention`).
"""

from __future__ import annotations

from typing import Protocol

import torch


class CacheAttention(Protocol):
    """What the model's Attention asks of a cache: store this forward's keys/values of `layer`
    and return the attention output. q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] → [B, Hq, T, D]."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class ForwardCache(CacheAttention, Protocol):
    """What `Transformer.forward` asks of a cache around one forward of `t` new tokens per row:
    `begin(t)` returns their positions [B, t], `commit(t)` records that they are now cached."""

    def begin(self, t: int) -> torch.Tensor: ...

    def commit(self, t: int) -> None: ...
