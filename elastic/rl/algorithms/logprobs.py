"""Log-probabilities of given tokens, and entropies, from logits: float32, chunked, exact.

Every GRPO log-prob (old policy, reference, current policy) goes through :func:`token_logprobs`,
so the importance ratio compares like with like. Two things matter:

- Precision. Logits may be bf16; a log-prob rounded to bf16 is off by up to 0.03 between -16
  and -8 (bf16 spacing there is 1/16), a ratio error of 3% before the policy has moved. Each chunk is upcast to float32 and the result is
  ``x[token] - logsumexp(x)`` in float32.
- Memory. ``log_softmax(logits.float())`` materialises a float32 copy of all ``N x V`` logits
  (and autograd keeps it): 4 GB for 8k tokens of a 128k vocabulary. Here a custom autograd
  function processes ``chunk_tokens`` rows at a time in the forward, keeps only the input logits
  (already alive in the graph) and one float32 logsumexp per token, and recomputes the softmax
  chunk by chunk in the backward: ``d logp / d x = onehot(token) - softmax(x)`` (divided by the
  temperature). Peak extra memory is a few ``chunk_tokens x V`` float32 buffers.

``temperature``: pass the sampling temperature to score the distribution the tokens were drawn
from, softmax(x / T) (TRL and verl do); pass 1.0 for the model's own distribution. Old, reference
and current log-probs must all use the same value, or the ratio is not 1 before the first update.

Alignment is the caller's: ``logits[..., i, :]`` must be the distribution ``tokens[..., i]`` was
drawn from (for a decoder, the logits one position earlier).
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch.autograd.function import once_differentiable

CHUNK_TOKENS = 512
"""Rows per chunk: 512 x 152k vocabulary x 4 bytes = 311 MB per float32 buffer."""


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 logits (exact gradient checks)."""
    return torch.promote_types(logits.dtype, torch.float32)


class _TokenLogProbs(torch.autograd.Function):
    """``logits [N, V], tokens [N] -> logp [N]`` float32 (see module doc)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, tokens: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
        n = logits.shape[0]
        cdt = _compute_dtype(logits)
        out = torch.empty(n, dtype=cdt, device=logits.device)
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        for s in range(0, n, chunk):
            x = logits[s:s + chunk].to(cdt)
            if temperature != 1.0:
                x = x / temperature
            l = torch.logsumexp(x, dim=-1)
            out[s:s + chunk] = x.gather(-1, tokens[s:s + chunk, None]).squeeze(-1) - l
            lse[s:s + chunk] = l
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Any, ...]:
        logits, tokens, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)
        g = grad_out.to(lse.dtype)
        for s in range(0, logits.shape[0], chunk):
            x = logits[s:s + chunk].to(lse.dtype)
            if t != 1.0:
                x = x / t
            gs = g[s:s + chunk, None]
            gx = torch.exp(x - lse[s:s + chunk, None]).mul_(-gs)  # -g * softmax(x)
            gx.scatter_add_(-1, tokens[s:s + chunk, None], gs)  # + g * onehot(token)
            if t != 1.0:
                gx.div_(t)
            grad[s:s + chunk] = gx.to(logits.dtype)
        return grad, None, None, None


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                   chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """``log softmax(logits / temperature)[token]``: ``logits [..., V]``, ``tokens [...]`` ->
    ``[...]`` float32 (float64 for float64 logits), differentiable in ``logits``."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"token_logprobs: logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    if temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)
    out = _TokenLogProbs.apply(flat, tokens.reshape(-1).long(), float(temperature), max(1, int(chunk_tokens)))
    return out.reshape(tokens.shape)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: ``[..., V] -> [...]`` float32.

    ``H = -sum p log p`` with ``log p = x - logsumexp(x)``; a -inf logit (a masked-out token)
    contributes 0, not NaN. For metrics only (no gradient).
    """
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)
    cdt = _compute_dtype(logits)
    chunk = max(1, int(chunk_tokens))
    out = torch.empty(flat.shape[0], dtype=cdt, device=logits.device)
    for s in range(0, flat.shape[0], chunk):
        x = flat[s:s + chunk].to(cdt)
        if temperature != 1.0:
            x = x / temperature
        logp = x - torch.logsumexp(x, dim=-1, keepdim=True)
        p = torch.exp(logp)
        out[s:s + chunk] = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)
    return out.reshape(logits.shape[:-1])
