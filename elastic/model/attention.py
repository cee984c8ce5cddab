"""Document-masked causal attention with interchangeable backends.

A packed sample holds several documents; a token may attend only to earlier tokens of its
own document. The per-batch metadata (cumulative sequence lengths, a dense or block mask,
document buckets) is built once per forward by :func:`build_attention_metadata` and shared by
every layer.

Backends (`auto` picks the first available, in the order below for the case at hand; it is
resolved once per run, by `choose_backend`):
  flex          FlexAttention with a document block mask (no backward on CPU in torch 2.13);
                first on CUDA when the model is compiled: on one H100 (1b, seq 4096) flex +
                compile ran 41.9% MFU against torch_varlen + compile 38.7%
  flash_varlen  flash-attn's `flash_attn_varlen_func` (the `gpu` extra; not measured here yet)
  torch_varlen  PyTorch's own `torch.nn.attention.varlen.varlen_attn` (FlashAttention kernels);
                first on CUDA without compile
  sdpa_docs     CPU only: the documents gathered into buckets of one padded length
                (`bucket_length`: at most four per octave), each bucket [n_docs, H, L, D] through
                causal SDPA with no mask (the flash CPU kernel skips the blocks above the
                diagonal), then scattered back: only the documents' causal area is computed.
                First on CPU for rows of DOCS_MIN_SEQ_LEN (256) tokens or more (data.seq_len)
  sdpa_mask     SDPA with an explicit block-diagonal causal mask (O(T^2) mask); first on CPU
                for rows shorter than 256 tokens
  sdpa_loop     SDPA per document, causal (exact, slow; a reference for tests)

sdpa_docs against sdpa_mask on CPU (bench/attention_cpu.py: forward + backward of attention
alone, fp32, one thread as a train worker has, batch 4, `tiny` heads: 4 query, 2 key/value, dim
32; the paired median over 20-40 alternating rounds of sdpa_mask's time / sdpa_docs's, > 1 is
faster; coverage: the documents' share of the T x T causal area):

  rows                                              T     coverage   sdpa_mask / sdpa_docs
  SFT: ~75-token conversations, padded tail         512   0.15       3.41x
                                                    1024  0.08       7.79x
  two documents, 300 + 212                          512   0.52       1.81x
  pretraining, geometric lengths of mean 150        1024  0.35       2.74x
                                                    512   0.66       1.39x
                                                    256   0.61       1.29x
                                                    128   0.72       0.94x  (125m heads: 1.19x)
  pretraining, mean 1000 (one or two per row)       512   0.98       1.05x
                                                    256   0.96       1.04x
                                                    128   0.93       0.86x  (125m heads: 1.27x)
  one document per row (SDPA on the batch as is)    1024  1.00       1.52x
                                                    512   1.00       1.13x
                                                    256   1.00       1.17x
                                                    128   1.00       1.22x
  GRPO: one 100-170-token sequence, right-padded    170   0.73       1.05x

Below 256 tokens, with small heads, the buckets' fixed costs (an SDPA call each, the gathers)
lose to one masked call; hence the row-length rule. On the SFT job (sft-python-tasks.yaml, 40
steps, 2 CPU workers) sdpa_docs gave 1.35x the tokens/s of sdpa_mask (paired median of 3 runs)
with the same losses to 1.1e-6.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("flash_varlen", "torch_varlen", "flex", "sdpa_docs", "sdpa_mask", "sdpa_loop")


@functools.lru_cache(maxsize=None)
def _has_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@functools.lru_cache(maxsize=None)
def _has_torch_varlen() -> bool:
    try:
        from torch.nn.attention import varlen  # noqa: F401
    except Exception:
        return False
    return hasattr(varlen, "varlen_attn")


# `auto` on CPU: sdpa_docs for rows of at least this many tokens, sdpa_mask below (measured:
# see the table in the module docstring).
DOCS_MIN_SEQ_LEN = 256


def available_backends(device: torch.device, compiled: bool = False, seq_len: Optional[int] = None) -> list[str]:
    """Backends that can run forward and backward on `device`, fastest first (for a compiled
    model when `compiled`; on CPU, for rows of `seq_len` tokens when given)."""
    if device.type == "cuda":
        varlen = (["flash_varlen"] if _has_flash_attn() else []) + (["torch_varlen"] if _has_torch_varlen() else [])
        return (["flex"] + varlen if compiled else varlen + ["flex"]) + ["sdpa_mask", "sdpa_loop"]
    if seq_len is not None and seq_len < DOCS_MIN_SEQ_LEN:
        return ["sdpa_mask", "sdpa_docs", "sdpa_loop"]
    return ["sdpa_docs", "sdpa_mask", "sdpa_loop"]


def choose_backend(requested: str, device: torch.device, compiled: bool = False, seq_len: Optional[int] = None) -> str:
    """Resolve `auto` to the best available backend (once per run: `seq_len` is the rows'
    length, data.seq_len); refuse a forced one that cannot run."""
    avail = available_backends(device, compiled, seq_len)
    if requested == "auto":
        return avail[0]
    if requested not in avail:
        raise ValueError(f"model.attention: backend {requested!r} is not available on {device.type} (available: {', '.join(avail)})")
    return requested


@dataclass
class AttentionMetadata:
    """What every layer needs to mask documents, computed once per batch."""

    backend: str
    batch: int
    seq_len: int
    # varlen backends: boundaries of every document over the flattened (B*T) tokens.
    cu_seqlens: Optional[torch.Tensor] = None
    max_seqlen: int = 0
    # sdpa_mask: [B, 1, T, T] boolean, True = may attend.
    dense_mask: Optional[torch.Tensor] = None
    # flex: a BlockMask.
    block_mask: Optional[object] = None
    # sdpa_loop: per row, a list of (start, end) document spans.
    spans: Optional[list] = None
    # sdpa_docs: per bucket, (padded length L, number of documents n); `doc_gather` [Σ n·L]
    # gathers the buckets' padded documents, one after another, from the flattened (B*T) tokens;
    # `doc_inverse` [B*T] puts each token back from their concatenated output. All None when
    # every row is one whole document.
    doc_buckets: Optional[list] = None
    doc_gather: Optional[torch.Tensor] = None
    doc_inverse: Optional[torch.Tensor] = None


def _doc_spans(doc_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative boundaries of runs of equal doc id over the flattened batch (int32, [N+1])."""
    flat = doc_ids.reshape(-1)
    B, T = doc_ids.shape
    change = torch.ones_like(flat, dtype=torch.bool)
    change[1:] = flat[1:] != flat[:-1]
    change[::T] = True  # every row starts a new sequence
    starts = torch.nonzero(change, as_tuple=False).flatten()
    ends = torch.cat([starts[1:], torch.tensor([flat.numel()], device=flat.device)])
    return torch.cat([starts, ends[-1:]]).to(torch.int32), (ends - starts)


def host_doc_spans(doc_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """`_doc_spans` on the host (numpy, before the batch goes to the device): the cumulative
    boundaries [N+1] int32 and the longest document. The varlen kernels need the longest length
    as a Python int; computing it from a device tensor would stall the step on a host sync."""
    B, T = doc_ids.shape
    flat = doc_ids.reshape(-1)
    change = np.ones(flat.shape[0], dtype=bool)
    change[1:] = flat[1:] != flat[:-1]
    change[::T] = True
    starts = np.flatnonzero(change)
    bounds = np.append(starts, flat.shape[0]).astype(np.int32)
    return bounds, int(np.diff(bounds).max()) if len(starts) else 0


def bucket_length(lens: np.ndarray) -> np.ndarray:
    """The length each document is padded to in `sdpa_docs`: rounded up to a multiple of
    max(16, 2^(floor(log2 n) - 2)), so at most four buckets per octave and padding under a
    quarter of the document (under 16 tokens below 64)."""
    n = np.maximum(np.asarray(lens, dtype=np.int64), 1)
    g = np.maximum(16, np.left_shift(1, np.maximum(np.floor(np.log2(n)).astype(np.int64) - 2, 0)))
    return -(-n // g) * g


def _doc_buckets(bounds: np.ndarray, B: int, T: int, device: torch.device):
    """`sdpa_docs` buckets and gather/scatter indices from the cumulative document boundaries
    over the flattened batch (host numpy: no device sync). A bucket's padding repeats its
    document's last token: causal attention puts it after every real query, so it changes no
    real output (and receives no gradient)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    starts, lens = bounds[:-1], np.diff(bounds)
    if len(lens) == B and (lens == T).all():
        return None, None, None  # every row is one whole document: SDPA runs on the batch as it is
    padded = bucket_length(lens)
    inverse = np.empty(B * T, np.int64)
    buckets, gathers, base = [], [], 0
    for L in np.unique(padded).tolist():
        sel = np.flatnonzero(padded == L)
        s, n, ar = starts[sel], lens[sel], np.arange(L)
        gathers.append((s[:, None] + np.minimum(ar[None, :], n[:, None] - 1)).reshape(-1))
        real = ar[None, :] < n[:, None]
        inverse[(s[:, None] + ar[None, :])[real]] = (base + np.arange(len(sel))[:, None] * L + ar[None, :])[real]
        buckets.append((L, len(sel)))
        base += len(sel) * L
    return buckets, torch.from_numpy(np.concatenate(gathers)).to(device), torch.from_numpy(inverse).to(device)


def build_attention_metadata(doc_ids: torch.Tensor, backend: str,
                             spans: Optional[tuple[torch.Tensor, int]] = None) -> AttentionMetadata:
    """doc_ids: [B, T] int, equal within a document (padding is its own document).
    `spans`: (cu_seqlens on the device, longest document) from `host_doc_spans`, for the varlen
    backends and `sdpa_docs`; without it they are computed on the device, at the cost of a host
    sync (`sdpa_docs` runs on the CPU, where reading them back costs nothing)."""
    B, T = doc_ids.shape
    meta = AttentionMetadata(backend=backend, batch=B, seq_len=T)
    if backend in ("flash_varlen", "torch_varlen"):
        if spans is not None:
            meta.cu_seqlens, meta.max_seqlen = spans
        else:
            cu, lens = _doc_spans(doc_ids)
            meta.cu_seqlens = cu
            meta.max_seqlen = int(lens.max().item())
    elif backend == "sdpa_docs":
        bounds = spans[0].cpu().numpy() if spans is not None else host_doc_spans(doc_ids.cpu().numpy())[0]
        meta.doc_buckets, meta.doc_gather, meta.doc_inverse = _doc_buckets(bounds, B, T, doc_ids.device)
    elif backend == "sdpa_mask":
        same = doc_ids[:, :, None] == doc_ids[:, None, :]
        causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
        meta.dense_mask = (same & causal)[:, None]
    elif backend == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        docs = doc_ids

        def mask_mod(b, h, q, kv):
            return (docs[b, q] == docs[b, kv]) & (kv <= q)

        meta.block_mask = create_block_mask(mask_mod, B, None, T, T, device=doc_ids.device)
    elif backend == "sdpa_loop":
        spans = []
        for row in doc_ids.tolist():
            s, cur = [], 0
            for i in range(1, T + 1):
                if i == T or row[i] != row[cur]:
                    s.append((cur, i))
                    cur = i
            spans.append(s)
        meta.spans = spans
    else:
        raise ValueError(f"unknown attention backend {backend!r}")
    return meta


@functools.lru_cache(maxsize=None)
def _torch_varlen_causal_kwargs() -> dict:
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:  # torch 2.9–2.11 spelling
        return {"is_causal": True}
    return {"window_size": (-1, 0)}


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] → [B, Hq, T, D]. GQA by head grouping."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    be = meta.backend
    if be in ("flash_varlen", "torch_varlen"):
        # Varlen kernels take the batch flattened to tokens: [B*T, H, D].
        qf = q.transpose(1, 2).reshape(B * T, Hq, D)
        kf = k.transpose(1, 2).reshape(B * T, Hkv, D)
        vf = v.transpose(1, 2).reshape(B * T, Hkv, D)
        if be == "flash_varlen":
            from flash_attn import flash_attn_varlen_func

            out = flash_attn_varlen_func(qf, kf, vf, meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen, causal=True)
        else:
            from torch.nn.attention.varlen import varlen_attn

            if Hkv != Hq:
                rep = Hq // Hkv
                kf = kf.repeat_interleave(rep, dim=1)
                vf = vf.repeat_interleave(rep, dim=1)
            out = varlen_attn(qf, kf, vf, meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen, **_torch_varlen_causal_kwargs())
        return out.reshape(B, T, Hq, D).transpose(1, 2)
    if be == "sdpa_docs":
        return _docs_attention(q, k, v, meta)
    if Hkv != Hq:
        rep = Hq // Hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if be == "sdpa_mask":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.dense_mask)
    if be == "flex":
        return _compiled_flex()(q, k, v, block_mask=meta.block_mask)
    if be == "sdpa_loop":
        out = torch.empty_like(q)
        for b, spans in enumerate(meta.spans):
            for s, e in spans:
                out[b, :, s:e] = F.scaled_dot_product_attention(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], is_causal=True)[0]
        return out
    raise ValueError(f"unknown attention backend {be!r}")


def _docs_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """`sdpa_docs`: the documents gathered (one index_select per tensor) into buckets of
    [n_docs, H, L, D], each run through causal SDPA with no mask (the flash CPU kernel skips
    the blocks above the diagonal), then put back in the packed layout (one index_select).
    GQA through SDPA's `enable_gqa` (the head grouping of `repeat_interleave`). Gradients flow
    through the index_selects and the split (one scatter-add per tensor in backward)."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    gqa = Hkv != Hq
    if meta.doc_buckets is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    sizes = [L * n for L, n in meta.doc_buckets]
    qs = q.transpose(1, 2).reshape(B * T, Hq, D).index_select(0, meta.doc_gather).split(sizes)
    ks = k.transpose(1, 2).reshape(B * T, Hkv, D).index_select(0, meta.doc_gather).split(sizes)
    vs = v.transpose(1, 2).reshape(B * T, Hkv, D).index_select(0, meta.doc_gather).split(sizes)
    outs = []
    for (L, n), qb, kb, vb in zip(meta.doc_buckets, qs, ks, vs):
        ob = F.scaled_dot_product_attention(qb.view(n, L, Hq, D).transpose(1, 2), kb.view(n, L, Hkv, D).transpose(1, 2),
                                            vb.view(n, L, Hkv, D).transpose(1, 2), is_causal=True, enable_gqa=gqa)
        outs.append(ob.transpose(1, 2).reshape(n * L, Hq, D))
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.index_select(0, meta.doc_inverse).view(B, T, Hq, D).transpose(1, 2)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention of new queries over a KV cache (generation).

    q: [B, Hq, T, D] (T new tokens); k, v: [B, Hkv, S, D] (S cached slots including the new
    ones); mask: [B, 1, T, S] boolean, True = may attend. SDPA's `enable_gqa` shares each
    key/value head across its query group without copying the cache per step."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
