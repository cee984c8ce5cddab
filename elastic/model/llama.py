"""A Llama-style decoder in plain PyTorch (RMSNorm, RoPE, SwiGLU, grouped-query attention).

Readable top to bottom, nanoGPT style, and free of distributed code: FSDP, mixed precision
and activation checkpointing are applied from outside (elastic/train/parallelize.py).
Packed samples carry per-token document ids and positions that restart per document, so
RoPE and attention behave as if each document were run alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from elastic.model.attention import AttentionMetadata, attention, build_attention_metadata


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

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


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


def rope_frequencies(head_dim: int, max_pos: int, theta: float, device=None) -> torch.Tensor:
    """[max_pos, head_dim/2] complex rotations (fp32)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_pos, device=device, dtype=torch.float32)
    return torch.polar(torch.ones(max_pos, head_dim // 2, device=device), torch.outer(t, inv))


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; freqs: [B, T, D/2] complex (already gathered by position)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs[:, None]).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        out = attention(q, k, v, meta)
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
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs, meta)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs, attention_backend: str = "sdpa_mask"):
        super().__init__()
        self.args = a
        self.attention_backend = attention_backend
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList([TransformerBlock(a) for _ in range(a.n_layers)])
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        if a.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Not a parameter and not saved: recomputed on any device, never sharded by FSDP.
        self.register_buffer("freqs_cis", rope_frequencies(a.head_dim, a.max_seq_len, a.rope_theta), persistent=False)

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
            if p.dim() == 1:
                full = torch.ones(p.shape)
            else:
                s = std / (2 * self.args.n_layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else std
                full = torch.randn(p.shape, generator=g) * s
            with torch.no_grad():
                assign(p, full.to(p.dtype))

    def init_buffers(self) -> None:
        """Recompute non-persistent buffers (RoPE tables) on the module's device: needed after
        building on the meta device and materialising with `to_empty`."""
        dev = self.tok_embeddings.weight.device
        self.freqs_cis = rope_frequencies(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, device=dev)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, doc_ids: torch.Tensor,
                meta: Optional[AttentionMetadata] = None) -> torch.Tensor:
        """tokens, positions, doc_ids: [B, T] → logits [B, T, vocab]."""
        if meta is None:
            meta = build_attention_metadata(doc_ids, self.attention_backend)
        freqs = self.freqs_cis[positions]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, freqs, meta)
        return self.output(self.norm(h))

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
