"""The clipped policy-gradient objective per token, with separate low and high clip ranges.

PPO's surrogate (Schulman et al. 2017) as GRPO uses it, per token t of a completion with
advantage A:

    r    = exp(logp - old_logp)                       (importance ratio to the sampling policy)
    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)

``clip_high > clip_low`` is DAPO's "clip-higher" (Yu et al. 2025): a low-probability token
with A > 0 may grow further before its gradient is cut, which keeps entropy from collapsing.

Where the min picks the clipped branch the gradient is zero. That happens in exactly two cases,
reported as clip statistics:

- low side:  A < 0 and r < 1 - clip_low   (the policy already moved away from a bad token enough)
- high side: A > 0 and r > 1 + clip_high  (the policy already moved towards a good token enough)

Shapes: ``logp``, ``old_logp`` are ``[B, T]`` (log-probabilities of the sampled tokens);
``advantages`` is ``[B]`` (one per completion, broadcast over its tokens) or ``[B, T]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

LOG_RATIO_CLAMP = 20.0
"""logp - old_logp is clamped to +-20 before exp(): a ratio of inf times a negative advantage
would make an infinite loss and gradient from one token (verl clamps the same way)."""


class ClippedObjective(NamedTuple):
    """Per-token results, all ``[B, T]``; the mask is applied later, by the aggregation."""

    loss: torch.Tensor  # -min(r A, clip(r) A); differentiable in logp
    ratio: torch.Tensor  # r, detached
    clipped_low: torch.Tensor  # bool: A < 0 and r < 1 - clip_low
    clipped_high: torch.Tensor  # bool: A > 0 and r > 1 + clip_high


def clipped_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float, clip_high: float) -> ClippedObjective:
    """Per-token clipped surrogate loss and where each side of the clip is active."""
    if not (0.0 < clip_low < 1.0) or not clip_high > 0.0:
        raise ValueError(f"clip range: need 0 < clip_low < 1 and clip_high > 0, got {clip_low}, {clip_high}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == logp.dim() - 1 else advantages
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    r = ratio.detach()
    return ClippedObjective(
        loss=loss,
        ratio=r,
        clipped_low=(adv < 0) & (r < 1.0 - clip_low),
        clipped_high=(adv > 0) & (r > 1.0 + clip_high),
    )
