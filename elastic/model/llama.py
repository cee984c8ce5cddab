"""A Llama-style decoder in plain PyTorch (RMSNorm, RoPE, SwiGLU, grouped-query attention).

Readable top to bottom, nanoGPT style, and free of distributed code: FSDP, mixed precision
and activation checkpointing are applied from outside (elastic/train/parallelize.py).
Packed samples carry per-token document ids and positions that restart per document, so
RoPE and attention behave as if each document were run alone.

The layout follows Hugging Face's Llama/Qwen2/Qwen3 exactly (rotate-half RoPE, optional q/k/v
biases, optional per-head q/k RMSNorm, an explicit head_dim, Llama-3.1's "llama3" RoPE
scaling), so their weights map onto this model by renaming alone (elastic/model/hf.py).
For generation, `forward` takes an optional KV cache (any object with the methods of
elastic/model/cache.py, e.g. elastic/generation/kv_cache.py): the same blocks and the same
forward calls, so FSDP's per-module hooks keep working. The blocks hand their keys/values to the
cache's `attend`; the generation engine (elastic/generation/decoder.py) drives the blocks with
its static cache (elastic/generation/static_cache.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from elastic.model.attention import AttentionMetadata, attention, build_attention_metadata
from elastic.model.cache import CacheAttention, ForwardCache


@dataclass
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections (not on wo)
    # Qwen3: RMSNorm (eps = norm_eps) over each head's queries and keys, after the projections
    # and before RoPE.
    qk_norm: bool = False
    # Per-head width; None means dim // n_heads (Qwen3 sets it: its heads need not split dim).
    # Filled in at construction, so read `args.head_dim` as an int.
    head_dim: Optional[int] = None
    # RoPE frequency scaling as in HF's rope_parameters (rope_theta aside), None for plain RoPE:
    # {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    #  "original_max_position_embeddings"} (Llama 3.1/3.2) or {"rope_type": "linear", "factor"}.
    rope_scaling: Optional[Dict[str, Any]] = None
    # A scalar head instead of the vocabulary projection (reward models, critics: HF's
    # *ForSequenceClassification with num_labels=1): `output` is Linear(dim, num_labels, no bias),
    # never tied, and `forward` returns one score per position. None: a causal LM.
    num_labels: Optional[int] = None

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads
        if self.num_labels is not None:
            self.tie_embeddings = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under bf16 compute.
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


ROPE_SCALING_TYPES = ("linear", "llama3")


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[Dict[str, Any]] = None, device=None) -> torch.Tensor:
    """[head_dim/2] fp32 inverse frequencies, computed as transformers' modeling_rope_utils does
    (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
    `_compute_llama3_parameters`: same operations in the same order, so the same bits)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    rtype = (scaling or {}).get("rope_type", "default")
    if rtype == "default":
        return inv
    factor = scaling["factor"]
    if rtype == "linear":
        return inv / factor
    if rtype != "llama3":
        raise ValueError(f"rope_scaling: rope_type {rtype!r} not supported (supported: default, {', '.join(ROPE_SCALING_TYPES)})")
    # Llama 3.1: wavelengths above old_len/low_freq_factor are stretched by `factor`, those below
    # old_len/high_freq_factor are kept, the band between is interpolated smoothly.
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama)


def rope_frequencies(head_dim: int, max_pos: int, theta: float, device=None,
                     scaling: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """[max_pos, head_dim/2] complex: cos + i·sin of position × frequency (fp32); `scaling` as
    ModelArgs.rope_scaling.

    Complex on purpose: FSDP's mixed precision casts floating-point block inputs to bf16, but
    leaves complex ones alone, so the rotation keeps fp32 angles under bf16 compute."""
    inv = rope_inv_freq(head_dim, theta, scaling, device)
    angles = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
    return torch.complex(angles.cos(), angles.sin())


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; freqs: [B, T, D/2] complex (already gathered by position).

    Rotate-half layout (Hugging Face Llama/Qwen2): frequency i rotates the pair of dims
    (i, i + D/2), so HF q/k weights load without any permutation. Computed in fp32."""
    cos = torch.cat((freqs.real, freqs.real), dim=-1)[:, None]
    sin = torch.cat((freqs.imag, freqs.imag), dim=-1)[:, None]
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, layer_id: int = 0):
        super().__init__()
        self.layer_id = layer_id  # which slot of a KV cache this layer owns
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=a.qkv_bias)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)
        self.qk_norm = a.qk_norm
        if a.qk_norm:  # Qwen3: one [head_dim] weight each, shared by all heads
            self.q_norm = RMSNorm(a.head_dim, a.norm_eps)
            self.k_norm = RMSNorm(a.head_dim, a.norm_eps)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, meta: AttentionMetadata,
                cache: Optional[CacheAttention] = None) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism (elastic/train/parallelize.py) each rank holds
        # n_heads / tp query heads and n_kv_heads / tp key/value heads.
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        if self.qk_norm:  # before RoPE, before any attention backend or cache
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q.transpose(1, 2), freqs), apply_rope(k.transpose(1, 2), freqs)
        if cache is None:
            out = attention(q, k, v, meta)
        else:  # the cache stores this step's keys/values and attends over what it holds
            out = cache.attend(self.layer_id, q, k, v)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_hidden, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_hidden, bias=False)
        self.w2 = nn.Linear(a.ffn_hidden, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: ModelArgs, layer_id: int = 0):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a, layer_id)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, meta: Optional[AttentionMetadata],
                cache: Optional[CacheAttention] = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs, meta, cache)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs, attention_backend: str = "sdpa_mask"):
        super().__init__()
        self.args = a
        self.attention_backend = attention_backend
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList([TransformerBlock(a, i) for i in range(a.n_layers)])
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.num_labels or a.vocab_size, bias=False)
        self.tie_weights()
        # RoPE table: a plain attribute, not a buffer, so `.to(dtype)`, `to_empty()`, FSDP and
        # state dicts never touch it (Module.to(float32) would cast complex to real); it is
        # (re)built in fp32 on the device of the tokens when first needed there.
        self.freqs_cis = rope_frequencies(a.head_dim, a.max_seq_len, a.rope_theta, device="cpu", scaling=a.rope_scaling)

    def init_weights(self, seed: Optional[int] = None,
                     assign: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None) -> None:
        """Deterministic init (normal 0.02, output projections scaled by depth, GPT-2 style).

        Every parameter's *full* value is drawn from one generator in parameter order, so the
        weights depend only on the seed. `assign(param, full_value)` stores it (default: copy);
        a sharded model passes one that keeps only this rank's shard, which is how a model built
        on the meta device gets the same weights at any world size."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        std = 0.02
        assign = assign or (lambda p, v: p.copy_(v))
        for name, p in self.named_parameters():
            if name.endswith((".lora_A", ".lora_B")):
                continue  # adapters (elastic/model/lora.py) have their own init: the base draws stay the same
            if name.endswith(".bias"):
                full = torch.zeros(p.shape)
            elif p.dim() == 1:
                full = torch.ones(p.shape)
            else:
                s = std / (2 * self.args.n_layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else std
                full = torch.randn(p.shape, generator=g) * s
            with torch.no_grad():
                assign(p, full.to(p.dtype))

    def init_buffers(self) -> None:
        """Build the RoPE table on the parameters' device, e.g. after building on the meta device
        and `to_empty` (optional: `forward` also rebuilds it where the tokens are)."""
        dev = self.tok_embeddings.weight.device
        a = self.args
        self.freqs_cis = rope_frequencies(a.head_dim, a.max_seq_len, a.rope_theta, device=dev, scaling=a.rope_scaling)

    def forward(self, tokens: torch.Tensor, positions: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                meta: Optional[AttentionMetadata] = None, cache: Optional[ForwardCache] = None,
                last_only: bool = False, select: Optional[torch.Tensor] = None) -> torch.Tensor:
        """tokens, positions, doc_ids: [B, T] → logits [B, T, vocab] ([B, 1, vocab] with `last_only`;
        [N, vocab] with `select`, N flat indices into B*T: only the positions a caller scores go
        through the output projection, which at a 128k vocabulary dominates memory).

        Training passes all three (packed documents). `model(tokens)` treats each row as one
        document starting at position 0. With a `cache`, positions come from the cache, the
        new keys/values are appended to it and attention covers everything cached so far."""
        B, T = tokens.shape
        if cache is not None:
            positions = cache.begin(T) if positions is None else positions
        else:
            if positions is None:
                positions = torch.arange(T, device=tokens.device).expand(B, T)
            if meta is None:
                if doc_ids is None:
                    doc_ids = torch.zeros_like(tokens)
                meta = build_attention_metadata(doc_ids, self.attention_backend)
        # Without a cache every position is < T (packed documents restart at 0); a scoring pass
        # over prompt + completion may run past max_seq_len like generation does.
        freqs = self.rope_table(positions.device, T if cache is None else 0)[positions]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, freqs, meta, cache) if cache is not None else layer(h, freqs, meta)
        if cache is not None:
            cache.commit(T)
        if last_only:
            h = h[:, -1:]
        elif select is not None:
            h = h.reshape(B * T, h.shape[-1]).index_select(0, select)
        return self.output(self.norm(h))

    def tie_weights(self) -> None:
        """Share the output projection with the embeddings (tied models). Call again after
        `to_empty()`, which materialises the two names as separate tensors."""
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def rope_table(self, device: torch.device, min_positions: int = 0) -> torch.Tensor:
        """The [n, head_dim/2] complex RoPE table on `device`, n >= max(max_seq_len, min_positions)
        (generation may run past max_seq_len)."""
        t = self.freqs_cis
        n = max(t.shape[0], min_positions)
        if t.device != torch.device(device) or t.is_meta or n > t.shape[0]:
            a = self.args
            t = self.freqs_cis = rope_frequencies(a.head_dim, n, a.rope_theta, device=device, scaling=a.rope_scaling)
        return t

    def num_params(self, exclude_embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_embeddings.weight.numel()
        return n


def flops_per_token(a: ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6·N (N = non-embedding params + output projection) plus
    attention 12·L·d·T/2 (causal halves the score and value matmuls; PaLM appendix B
    counts 12·L·d·T for full attention). Documents shorter than T make this an upper bound."""
    d, L = a.dim, a.n_layers
    attn_proj = d * a.n_heads * a.head_dim * 2 + d * a.n_kv_heads * a.head_dim * 2
    mlp = 3 * d * a.ffn_hidden
    n = L * (attn_proj + mlp) + d * a.vocab_size  # output projection counts even when tied
    return 6.0 * n + 12.0 * L * d * seq_len / 2
