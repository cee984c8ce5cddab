"""The clipped policy-gradient objective per token, with separate low and high clip ranges.

PPO's surrogate (Schulman et al. 2017) as GRPO uses it, per token t of a completion with
advantage A:

    r    = exp(logp - old_logp)                       (importance ratio to the sampling policy)
    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
         =  max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))

``clip_high > clip_low`` is DAPO's "clip-higher" (Yu et al. 2025): a low-probability token
with A > 0 may grow further before its gradient is cut, which keeps entropy from collapsing.

Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL",
arXiv:1912.09729), on when ``clip_ratio_c > 0`` (it must then be > 1): for A < 0 the loss above
is ``-A r`` once r > 1 + clip_high, i.e. unbounded in r, so one token whose probability grew a lot
since sampling (possible after the first optimizer step on a rollout) can dominate the step. Dual
clip caps it:

    loss = min(max(-A r, -A clip(r)), -A c)           for A < 0;  unchanged for A >= 0

which is verl's ``compute_policy_loss_vanilla`` (``pg_losses3 = -A * clip_ratio_c``, the min, then
``torch.where(advantages < 0, ...)``). verl always applies it (``clip_ratio_c`` default 3.0); here it
is off by default (``rl.clip_ratio_c = 0``) so existing runs keep their objective; set 3.0 to match
verl. With one optimizer step per rollout (r = 1 on every token) it never changes anything.

Where the min/max picks a constant branch the gradient is zero. That happens in three cases,
reported as clip statistics:

- low side:  A < 0 and r < 1 - clip_low   (the policy already moved away from a bad token enough)
- high side: A > 0 and r > 1 + clip_high  (the policy already moved towards a good token enough)
- dual:      A < 0 and r > clip_ratio_c   (only with dual clip on; verl's ``pg_clipfrac_lower``)

Shapes: ``logp``, ``old_logp`` are ``[B, T]`` (log-probabilities of the sampled tokens);
``advantages`` is ``[B]`` (one per completion, broadcast over its tokens) or ``[B, T]``.
Masking is the caller's (:mod:`elastic.rl.algorithms.loss` zeroes masked inputs before calling this).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

LOG_RATIO_CLAMP = 20.0
"""logp - old_logp is clamped to +-20 before exp(): a ratio of inf times a negative advantage
would make an infinite loss and gradient from one token (verl clamps the same way)."""


class ClippedObjective(NamedTuple):
    """Per-token results, all ``[B, T]``; the mask is applied later, by the aggregation."""

    loss: torch.Tensor  # max(-A r, -A clip(r)) (then min with -A c for A < 0 under dual clip); differentiable in logp
    ratio: torch.Tensor  # r, detached
    clipped_low: torch.Tensor  # bool: A < 0 and r < 1 - clip_low
    clipped_high: torch.Tensor  # bool: A > 0 and r > 1 + clip_high
    clipped_dual: torch.Tensor  # bool: A < 0 and r > clip_ratio_c (all False with dual clip off)


def check_clip(clip_low: float, clip_high: float, clip_ratio_c: float = 0.0) -> None:
    """Raise ValueError unless ``0 < clip_low < 1``, ``clip_high > 0`` and ``clip_ratio_c`` is 0 (off) or > 1."""
    if not (0.0 < clip_low < 1.0) or not clip_high > 0.0:
        raise ValueError(f"clip range: need 0 < clip_low < 1 and clip_high > 0, got {clip_low}, {clip_high}")
    if not (clip_ratio_c == 0.0 or clip_ratio_c > 1.0):
        raise ValueError(f"clip_ratio_c: dual clip needs a ratio bound > 1 (or 0 = off), got {clip_ratio_c}")


def clipped_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float, clip_high: float, clip_ratio_c: float = 0.0) -> ClippedObjective:
    """Per-token clipped surrogate loss and where each clip is active (see the module doc).

    ``clip_ratio_c``: 0 = plain (DAPO-style asymmetric) PPO clip; > 1 = dual clip for A < 0.
    """
    check_clip(clip_low, clip_high, clip_ratio_c)
    adv = advantages.unsqueeze(-1) if advantages.dim() == logp.dim() - 1 else advantages
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    r = ratio.detach()
    negative = adv < 0
    if clip_ratio_c > 0:
        loss = torch.where(negative, torch.minimum(loss, -adv * clip_ratio_c), loss)
        dual = negative & (r > clip_ratio_c)
    else:
        dual = torch.zeros_like(r, dtype=torch.bool)
    return ClippedObjective(
        loss=loss,
        ratio=r,
        clipped_low=negative & (r < 1.0 - clip_low),
        clipped_high=(adv > 0) & (r > 1.0 + clip_high),
        clipped_dual=dual,
    )
