"""A paged KV cache (vLLM's PagedAttention layout): keys/values live in fixed-size blocks of
`block_size` tokens drawn from one pool; each sequence holds a block table (its blocks, in
order), grown one block at a time as it generates and returned to the pool when it finishes.
So a rollout batch holds KV for the tokens it has actually produced, not batch x max length.

Layout: per layer, `k` and `v` of shape [num_blocks, block_size, Hkv, D] (token-major within a
block, so a row's gathered blocks are one [b, L, Hkv, D] tensor that SDPA reads as [b, Hkv, L, D]
through a transpose, without a second copy). Block 0 is the null
block: never handed out, it is what an unused table entry points at (reads of it are masked;
writes of a dead row in the batch land there). The pool starts small and grows geometrically
(x1.5, at least what is asked) when the free list runs out: growth copies the pool (amortised
over the blocks added). `PagedKVCache` counts blocks in use, their peak and the pool's size,
in blocks and bytes (`stats()`).

Prefix sharing (a GRPO group): prompts that are equal in one prefill are computed once; their
full blocks are stored once and referenced by every row of the group (reference counts; a block
returns to the free list when its last row finishes). The partially filled last block of the
prompt is the one every row will write its own tokens into, so each row gets its own copy of it
at prefill (copy-on-write done eagerly, since the write is certain): a group of n rows of a
P-token prompt holds floor(P / block_size) shared blocks + n partial ones, not n x ceil(P /
block_size). Sharing spans one prefill (the scheduler admits a group together when it has the
slots), not a persistent prefix cache across admissions.

Attention. Prefill is the static cache's (right-padded, causal SDPA); the keys/values of each
real token are scattered into its row's blocks (one index_put per layer). A decode step writes
each row's new key/value into its block at (pos // block_size, pos % block_size), then gathers
the row's first blocks through the block table into a [b, Hkv, kv_len, D] tensor (index_select
on the pool) and runs the same masked SDPA as the static cache (same shapes, same values), so
tokens and log-probs equal the static cache's. The gather is a copy of the KV a step reads: the
honest CPU implementation; a fused paged-attention kernel that reads blocks in place (the point
of PagedAttention on a GPU) is not built. Nor are CUDA graphs of the paged step: the pool grows
(new addresses) and block allocation is host work between steps; `generate(kv_cache="paged")`
runs the step eagerly (modes eager and fixed).

Compaction (a row finishing frees its slot; live rows packed to the front) moves block-table
rows, not keys/values.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from elastic.generation.decoder import KV_BUCKET, SlotDecoder
from elastic.generation.prefill import distinct_prompts, prefill_logits
from elastic.generation.sampling import SamplingParams
from elastic.generation.step import decode_rows

Result = Tuple[List[int], List[float]]
NULL = 0  # the null block


class PagedKVCache:
    """A block pool per layer, a free list, reference counts and per-slot block tables (host lists,
    mirrored on the device as `table` [slots, max_blocks] int64 for the decode step)."""

    def __init__(self, n_layers: int, slots: int, n_kv_heads: int, capacity: int, head_dim: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, num_blocks: int = 0):
        if block_size < 1:
            raise ValueError(f"paged KV cache: block_size must be >= 1, got {block_size}")
        self.n_layers, self.hkv, self.d, self.bs = n_layers, n_kv_heads, head_dim, block_size
        self.dtype, self.device = dtype, device
        self.max_blocks = -(-capacity // block_size)
        n = max(2, num_blocks)
        shape = (n, block_size, n_kv_heads, head_dim)
        # Zeros, not empty: a masked entry gets weight 0, and 0 x (uninitialised NaN) is NaN.
        self.k: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.ref = [0] * n
        self.free: List[int] = list(range(n - 1, 0, -1))  # a stack; block 0 is the null block
        self.blocks: List[List[int]] = [[] for _ in range(slots)]
        self.table = torch.zeros(slots, self.max_blocks, dtype=torch.long, device=device)
        self.in_use = self.peak = 0

    # ------------------------------------------------------------------ accounting
    @property
    def num_blocks(self) -> int:
        return len(self.ref)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across every layer, keys and values."""
        return 2 * self.n_layers * self.hkv * self.bs * self.d * torch.empty((), dtype=self.dtype).element_size()

    def stats(self) -> Dict[str, int]:
        """Blocks (and bytes) in use now, at the peak, and held by the pool (null block included)."""
        bb = self.block_bytes
        return {"block_size": self.bs, "blocks_in_use": self.in_use, "peak_blocks": self.peak,
                "pool_blocks": self.num_blocks, "bytes_in_use": self.in_use * bb, "peak_bytes": self.peak * bb,
                "pool_bytes": self.num_blocks * bb}

    # ------------------------------------------------------------------ blocks
    def _grow(self, need: int) -> None:
        old = self.num_blocks
        new = max(old + need, old * 3 // 2)
        for lst in (self.k, self.v):
            for i, t in enumerate(lst):
                g = torch.zeros((new,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
                g[:old] = t
                lst[i] = g
        self.ref += [0] * (new - old)
        self.free = list(range(new - 1, old - 1, -1)) + self.free

    def allocate(self, n: int) -> List[int]:
        if len(self.free) < n:
            self._grow(n - len(self.free))
        out = [self.free.pop() for _ in range(n)]
        for b in out:
            self.ref[b] = 1
        self.in_use += n
        self.peak = max(self.peak, self.in_use)
        return out

    def share(self, blocks: List[int]) -> None:
        for b in blocks:
            self.ref[b] += 1

    def release_blocks(self, blocks: List[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
                self.in_use -= 1

    def set_blocks(self, slot: int, blocks: List[int]) -> None:
        self.blocks[slot] = list(blocks)
        row = torch.zeros(self.max_blocks, dtype=torch.long)
        row[:len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        self.table[slot] = row.to(self.device)

    def append_blocks(self, slots: List[int]) -> None:
        """Give each slot one more block (its next token starts a new block)."""
        if not slots:
            return
        new = self.allocate(len(slots))
        cols = []
        for s, b in zip(slots, new):
            cols.append(len(self.blocks[s]))
            self.blocks[s].append(b)
        dev = self.device
        self.table[torch.tensor(slots, device=dev), torch.tensor(cols, device=dev)] = torch.tensor(new, device=dev)

    def free_slots(self, slots: List[int]) -> None:
        for s in slots:
            self.release_blocks(self.blocks[s])
            self.blocks[s] = []
        if slots:
            self.table[torch.tensor(slots, device=self.device)] = NULL

    def move(self, src: List[int], dst: List[int]) -> None:
        """Move slots `src` to free slots `dst`: their block tables, not their keys/values."""
        for s, d in zip(src, dst):
            self.blocks[d], self.blocks[s] = self.blocks[s], []
        s_t = torch.tensor(src, device=self.device)
        d_t = torch.tensor(dst, device=self.device)
        self.table[d_t] = self.table[s_t]
        self.table[s_t] = NULL


class PagedPrefillAttention:
    """Right-padded prompts [m, T], causal SDPA per row (as static_cache.PrefillAttention); the
    keys/values of token t of row `src_row[j]` go to pool block `dst_block[j]`, offset
    `dst_off[j]` (index lists built by PagedDecoder.prefill: shared blocks once, each row's copy
    of the partial last block)."""

    def __init__(self, cache: PagedKVCache, src_row: torch.Tensor, src_t: torch.Tensor, dst_block: torch.Tensor,
                 dst_off: torch.Tensor):
        self.cache, self.src_row, self.src_t, self.dst_block, self.dst_off = cache, src_row, src_t, dst_block, dst_off

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.cache
        c.k[layer][self.dst_block, self.dst_off] = k[self.src_row, :, self.src_t]
        c.v[layer][self.dst_block, self.dst_off] = v[self.src_row, :, self.src_t]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class PagedDecodeAttention:
    """One token per slot for slots [0, b): write at `pos` through the block table, gather the
    first kv_len entries of each row into [b, Hkv, kv_len, D], masked SDPA as the static cache."""

    def __init__(self, k: List[torch.Tensor], v: List[torch.Tensor], table: torch.Tensor, pos: torch.Tensor,
                 kv_len: int, block_size: int):
        """k, v: per layer the pool [num_blocks, block_size, Hkv, D]; table: [b, max_blocks]."""
        self.k, self.v, self.pos, self.kv_len, self.bs = k, v, pos, kv_len, block_size
        b = pos.shape[0]
        self.nb = -(-kv_len // block_size)
        self.read = table[:, :self.nb].reshape(-1)  # [b * nb] blocks to gather
        rows = torch.arange(b, device=pos.device)
        self.wblock = table[rows, pos // block_size]
        self.woff = pos % block_size
        keys = torch.arange(kv_len, device=pos.device)
        self.mask = torch.zeros(b, 1, 1, kv_len, dtype=k[0].dtype, device=pos.device).masked_fill_(
            keys[None, None, None, :] > pos[:, None, None, None], float("-inf"))  # [b, 1, 1, kv_len]

    def _gather(self, pool: torch.Tensor, b: int) -> torch.Tensor:
        g = pool.index_select(0, self.read)  # [b * nb, bs, Hkv, D]
        hkv, d = pool.shape[2], pool.shape[3]
        return g.view(b, self.nb * self.bs, hkv, d)[:, :self.kv_len].transpose(1, 2)  # [b, Hkv, kv_len, D], a view

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [b, Hq, 1, D]; k, v: [b, Hkv, 1, D] → [b, Hq, 1, D]."""
        kp, vp = self.k[layer], self.v[layer]
        kp[self.wblock, self.woff] = k[:, :, 0]
        vp[self.wblock, self.woff] = v[:, :, 0]
        b, hq, _, d = q.shape
        hkv = kp.shape[2]
        qg = q.reshape(b, hkv, hq // hkv, d)  # query heads jG..jG+G-1 share kv head j: G rows
        out = F.scaled_dot_product_attention(qg, self._gather(kp, b), self._gather(vp, b), attn_mask=self.mask)
        return out.reshape(b, hq, 1, d)


def paged_decode_step(model: nn.Module, tok: torch.Tensor, pos: torch.Tensor, seed: torch.Tensor, gen: torch.Tensor,
                      live: torch.Tensor, k: List[torch.Tensor], v: List[torch.Tensor], table: torch.Tensor,
                      rope_real: torch.Tensor, block_size: int, b: int, kv_len: int, temperature: float, top_k: int,
                      top_p: float) -> torch.Tensor:
    """step.decode_step with the paged cache: the same state update and [2, b] result."""
    att = PagedDecodeAttention(k, v, table[:b], pos[:b], kv_len, block_size)
    return decode_rows(model, att, tok, pos, seed, gen, live, rope_real, b, temperature, top_k, top_p)


class PagedDecoder(SlotDecoder):
    """CachedDecoder's interface (prefill, step, release, move, bucket, admit_min, slots) over a
    PagedKVCache; modes eager and fixed (see the module docstring)."""

    def __init__(self, model: nn.Module, slots: int, capacity: int, params: SamplingParams, mode: str = "eager",
                 block_size: int = 16, num_blocks: int = 0, kv_bucket: int = KV_BUCKET):
        if mode not in ("eager", "fixed"):
            raise ValueError(f"generate: kv_cache 'paged' runs modes eager and fixed, not {mode!r} "
                             "(CUDA graphs of the paged step are not built)")
        super().__init__(model, slots, capacity, params, mode, kv_bucket)
        a = model.args
        dtype = model.tok_embeddings.weight.dtype
        self.cache = PagedKVCache(a.n_layers, self.slots, a.n_kv_heads, capacity, a.head_dim, block_size, dtype,
                                  self.tok.device, num_blocks)
        self.length = [0] * self.slots  # host: tokens cached per live slot (the next write position)
        self.is_live = [False] * self.slots

    def prefill(self, slots: List[int], prompts: List[List[int]], seeds: List[int]) -> Result:
        """Write each distinct prompt's keys/values once (full blocks shared by its rows, the partial
        last block copied per row) and sample each row's first token."""
        c, bs, dev = self.cache, self.cache.bs, self.tok.device
        rows, uniq = distinct_prompts(prompts)
        takers: List[List[int]] = [[] for _ in uniq]
        for j, r in enumerate(rows):
            takers[r].append(j)

        def att_for(group: List[int]) -> PagedPrefillAttention:
            """Blocks for the group's prompts, and where each of their tokens' keys/values go."""
            src_row, src_t, dst_b, dst_o = [], [], [], []
            for i, r in enumerate(group):
                P = len(uniq[r])
                full, part = divmod(P, bs)
                shared = c.allocate(full)
                if full:
                    src_row += [i] * (full * bs)
                    src_t += list(range(full * bs))
                    dst_b += [blk for blk in shared for _ in range(bs)]
                    dst_o += list(range(bs)) * full
                for n, j in enumerate(takers[r]):
                    if n:
                        c.share(shared)
                    own = c.allocate(1) if part else []
                    if part:
                        src_row += [i] * part
                        src_t += list(range(full * bs, P))
                        dst_b += own * part
                        dst_o += list(range(part))
                    c.set_blocks(slots[j], shared + own)
            idx = [torch.tensor(x, dtype=torch.long, device=dev) for x in (src_row, src_t, dst_b, dst_o)]
            return PagedPrefillAttention(c, *idx)

        logits = prefill_logits(self.model, self.rope, uniq, att_for)
        out = self.start(slots, prompts, seeds, logits[torch.tensor(rows, device=dev)])
        for s, p in zip(slots, prompts):
            self.length[s], self.is_live[s] = len(p), True
        return out

    def step(self, b: int, kv_len: int) -> Result:
        """Give every live row whose next token starts a block a new block, then decode one token
        for slots [0, b)."""
        c = self.cache
        grow = [s for s in range(b) if self.is_live[s] and self.length[s] >= len(c.blocks[s]) * c.bs]
        c.append_blocks(grow)
        p = self.params
        out = paged_decode_step(self.model, self.tok, self.pos, self.seed, self.gen, self.live, c.k, c.v, c.table,
                                self.rope_real, c.bs, b, self.kv_bucket(kv_len), p.temperature, p.top_k, p.top_p)
        for s in range(b):
            if self.is_live[s]:
                self.length[s] += 1
        vals = out.tolist()
        return [int(t) for t in vals[0]], vals[1]

    def release(self, slots: List[int]) -> None:
        if slots:
            self.live[torch.tensor(slots, device=self.live.device)] = 0
            self.cache.free_slots(slots)
            for s in slots:
                self.is_live[s], self.length[s] = False, 0

    def move(self, src: List[int], dst: List[int]) -> None:
        s = torch.tensor(src, device=self.tok.device)
        d = torch.tensor(dst, device=self.tok.device)
        self.cache.move(src, dst)
        for t in (self.tok, self.pos, self.seed, self.gen, self.live):
            t[d] = t[s]
        self.live[s] = 0
        for a, z in zip(src, dst):
            self.length[z], self.is_live[z] = self.length[a], self.is_live[a]
            self.length[a], self.is_live[a] = 0, False
