"""A key/value cache for batched generation with left-padded prompts (generate_reference's).

The reference path (elastic/generation/reference.py) uses it through
`Transformer.forward(..., cache=...)`; the generation engine uses the static cache of
elastic/generation/static_cache.py instead. Both meet the model's Attention through one method,
`attend(layer, q, k, v)` (the `CacheAttention` protocol of elastic/model/cache.py).

Prompts of different lengths are left-padded to a common length, so every row writes its
next token into the same slot and one decode step is one [B, 1] forward. Row b's real tokens
start at slot `start[b]`; its positions count from there (RoPE sees each prompt as if run
alone) and the attention mask hides the padding slots. Buffers are allocated once, at the
full length, on the first write of each layer (in the dtype the layer computes in, e.g. bf16
under FSDP mixed precision).

`keep(rows)` drops finished rows, so they stop costing compute and memory (one copy of the
cache per drop event, at most once per row).

The cache is a plain class, not a dataclass: FSDP's forward-input casting rebuilds
dataclasses, which would lose the in-place updates the layers make.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from elastic.model.attention import cached_attention


class KVCache:
    def __init__(self, n_layers: int, start: torch.Tensor, capacity: int):
        """start: [B] first real slot per row (its left padding); capacity: slots per row."""
        self.start = start
        self.capacity = capacity
        self.length = 0  # slots filled in every row
        self.k: List[Optional[torch.Tensor]] = [None] * n_layers
        self.v: List[Optional[torch.Tensor]] = [None] * n_layers
        self.mask: Optional[torch.Tensor] = None
        self._pending = 0

    @property
    def batch(self) -> int:
        return int(self.start.shape[0])

    def begin(self, t: int) -> torch.Tensor:
        """Prepare a forward of `t` new tokens per row: build the attention mask over slots
        [0, length + t) and return the new tokens' positions [B, t]."""
        if self.length + t > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {t} slots > capacity {self.capacity}")
        dev = self.start.device
        slots = torch.arange(self.length + t, device=dev)              # key slots j
        qslots = slots[self.length:]                                    # query slots i
        start = self.start[:, None, None]
        causal = slots[None, None, :] <= qslots[None, :, None]
        real_key = slots[None, None, :] >= start
        # A padding query attends to itself only (keeps SDPA finite; its output is never used).
        self_only = slots[None, None, :] == qslots[None, :, None]
        self.mask = (causal & (real_key | self_only))[:, None]        # [B, 1, t, S]
        self._pending = t
        return (qslots[None, :] - self.start[:, None]).clamp(min=0)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's keys/values ([B, Hkv, t, D]) of `layer`; return all filled slots."""
        if self.k[layer] is None:
            B, H, _, D = k.shape
            self.k[layer] = k.new_empty(B, H, self.capacity, D)
            self.v[layer] = v.new_empty(B, H, self.capacity, D)
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this forward's keys/values, attend over every filled slot (mask from `begin`)."""
        k, v = self.update(layer, k, v)
        return cached_attention(q, k, v, self.mask)

    def commit(self, t: int) -> None:
        """The forward is done: its `t` slots now belong to the cache."""
        if t != self._pending:
            raise RuntimeError(f"KV cache: committed {t} slots, begun {self._pending}")
        self.length += t
        self._pending = 0
        self.mask = None

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current batch), e.g. the unfinished ones."""
        self.start = self.start[rows]
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i] = self.k[i][rows]
                self.v[i] = self.v[i][rows]
