"""Several new tokens per row against the static KV cache (elastic/generation/static_cache.py):
what speculative decoding needs (elastic/generation/speculative.py verifies [last token + k
drafts] in one forward; a draft model catches up on the tokens it has not seen).

Row r's T tokens sit at positions pos[r] .. pos[r] + T - 1 of slot r: their keys/values are
written there, and query i attends over cache entries [0, pos[r] + i] (a [b, 1, T, kv_len]
length-and-causal mask). Entries past a row's accepted length are never read by a later
forward (its mask stops at its own position), so rolling back rejected drafts is only moving
the row's length back: nothing is copied or cleared. Eager only (shapes vary with T and
kv_len): no CUDA graph captures this path. Prompts enter the cache through
prefill.py's `prefill_slots`, as CachedDecoder's do.
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

from elastic.generation.static_cache import StaticKVCache
from elastic.generation.step import forward_hidden


class ChunkAttention:
    """T tokens per slot for slots [0, b) at positions pos[r] + [0, T)."""

    def __init__(self, k: List[torch.Tensor], v: List[torch.Tensor], pos: torch.Tensor, T: int, kv_len: int):
        b, dev = pos.shape[0], pos.device
        self.k, self.v, self.kv_len = [t[:b] for t in k], [t[:b] for t in v], kv_len
        self.rows = torch.arange(b, device=dev)[:, None]
        self.positions = pos[:, None] + torch.arange(T, device=dev)  # [b, T]
        keys = torch.arange(kv_len, device=dev)
        self.mask = torch.zeros(b, 1, T, kv_len, dtype=k[0].dtype, device=dev).masked_fill_(
            keys[None, None, None, :] > self.positions[:, None, :, None], float("-inf"))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [b, Hq, T, D]; k, v: [b, Hkv, T, D] -> [b, Hq, T, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc[self.rows, :, self.positions] = k.transpose(1, 2)
        vc[self.rows, :, self.positions] = v.transpose(1, 2)
        return F.scaled_dot_product_attention(q, kc[:, :, :self.kv_len], vc[:, :, :self.kv_len], attn_mask=self.mask,
                                              enable_gqa=kc.shape[1] != q.shape[1])


def chunk_logits(model: nn.Module, cache: StaticKVCache, rope: torch.Tensor, tokens: torch.Tensor,
                 pos: torch.Tensor) -> torch.Tensor:
    """tokens [b, T] for slots [0, b) at positions pos [b] + [0, T) -> logits [b, T, V] fp32
    (writes their keys/values into the cache). rope: the complex [capacity, D/2] table."""
    T = tokens.shape[1]
    kv_len = int(pos.max()) + T
    att = ChunkAttention(cache.k, cache.v, pos, T, kv_len)
    h = forward_hidden(model, tokens, rope[att.positions], att)
    return model.output(h).float()
