"""A preallocated (static) KV cache with one slot per sequence, and the three ways a forward
pass uses it.

Layout: per layer, `k` and `v` of shape [slots, Hkv, capacity, D], allocated once per
generation call and written in place (never concatenated, never reallocated), so their storage
addresses are fixed: what a captured CUDA graph needs. Each slot holds one sequence from
position 0 (no padding inside a slot); the slot's filled length lives with the decoder
(elastic/generation/decoder.py), not here, and is passed in as positions.

The attention modes are small objects with one method, `attend(layer, q, k, v)`, which the
model's Attention calls in its cache branch (elastic/model/llama.py):

* `PrefillAttention`: new prompts, right-padded into one [m, T] batch. Causal attention within
  each row needs no mask: a real token only sees earlier tokens of its own row, all real (the
  padding sits after it). Keys/values are written into the slots given, and only those slots
  (several slots may take the same row: a GRPO group shares one prompt, prefilled once).
  With no cache it is plain causal attention: the full-recompute baseline.
* `DecodeAttention`: one new token per slot, [b, 1], fixed shapes. The token's key/value is
  written at its slot's position (an in-place index_put), then the query attends over the
  first `kv_len` cache entries with a [b, 1, 1, kv_len] length mask built inside the step from
  the positions (no host-built per-step mask; kv_len is a bucket, so shapes change only every
  KV_BUCKET steps on the graph path: elastic/generation/decoder.py). The query
  heads that share a key/value head are laid out as rows of one SDPA call
  ([b, Hkv, G, D] against [b, Hkv, kv_len, D]), so grouped-query attention reads each cached
  head once and copies nothing.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F


class StaticKVCache:
    """k[layer], v[layer]: [slots, Hkv, capacity, D] in the compute dtype."""

    def __init__(self, n_layers: int, slots: int, n_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (slots, n_kv_heads, capacity, head_dim)
        self.slots, self.capacity = slots, capacity
        # Zeros, not empty: a masked entry gets weight 0, and 0 x (uninitialised NaN) is NaN.
        self.k: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots `src` to slots `dst` ([n] int64 each; compaction when rows finish)."""
        for t in self.k + self.v:
            t.index_copy_(0, dst, t.index_select(0, src))

    def data_ptrs(self) -> List[int]:
        return [t.data_ptr() for t in self.k + self.v]


class PrefillAttention:
    """Right-padded prompts [m, T]: causal attention per row; keys/values of row `rows[j]` go to
    slot `slots[j]` (positions [0, T)) when a cache is given."""

    def __init__(self, cache: Optional[StaticKVCache] = None, slots: Optional[torch.Tensor] = None,
                 rows: Optional[torch.Tensor] = None):
        self.cache, self.slots, self.rows = cache, slots, rows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [m, Hq, T, D]; k, v: [m, Hkv, T, D] → [m, Hq, T, D]."""
        if self.cache is not None:
            T = k.shape[2]
            self.cache.k[layer][self.slots, :, :T] = k[self.rows]
            self.cache.v[layer][self.slots, :, :T] = v[self.rows]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class DecodeAttention:
    """One token per slot for slots [0, b): write at `pos`, attend over cache entries [0, pos]."""

    def __init__(self, k: List[torch.Tensor], v: List[torch.Tensor], pos: torch.Tensor, kv_len: int):
        """k, v: per layer [b, Hkv, capacity, D] (views of the cache); pos: [b] int64; kv_len:
        how many cache entries the step reads (a Python int: the capacity for a captured
        graph, the longest live row on the eager CPU path)."""
        self.k, self.v, self.pos, self.kv_len = k, v, pos, kv_len
        self.rows = torch.arange(pos.shape[0], device=pos.device)
        keys = torch.arange(kv_len, device=pos.device)
        # Additive, in the compute dtype, built once per step for every layer (SDPA would convert
        # a boolean mask to this in each layer).
        self.mask = torch.zeros(pos.shape[0], 1, 1, kv_len, dtype=k[0].dtype, device=pos.device).masked_fill_(
            keys[None, None, None, :] > pos[:, None, None, None], float("-inf"))  # [b, 1, 1, kv_len]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [b, Hq, 1, D]; k, v: [b, Hkv, 1, D] → [b, Hq, 1, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc[self.rows, :, self.pos] = k[:, :, 0]
        vc[self.rows, :, self.pos] = v[:, :, 0]
        b, hq, _, d = q.shape
        hkv = kc.shape[1]
        qg = q.reshape(b, hkv, hq // hkv, d)  # query heads jG..jG+G-1 share kv head j: G rows
        out = F.scaled_dot_product_attention(qg, kc[:, :, :self.kv_len], vc[:, :, :self.kv_len], attn_mask=self.mask)
        return out.reshape(b, hq, 1, d)
