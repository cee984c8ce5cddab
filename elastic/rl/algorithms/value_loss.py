"""The PPO critic's clipped value loss (verl ``compute_value_loss``, from TRL's PPO trainer).

Per token, with the rollout-time value ``V_old``, the current prediction ``V`` and the GAE return ``R``
(:func:`~elastic.rl.algorithms.gae.gae_advantages_returns`)::

    V_clip = clip(V, V_old - c, V_old + c)
    l      = max((V - R)^2, (V_clip - R)^2)
    loss   = 0.5 * sum(w * l)

with ``w`` the per-token weights of :mod:`elastic.rl.algorithms.aggregation` (``rl.loss_agg`` names, step-wide
counts), so like the policy loss a micro-batch's value is its share of the step loss and the sum
over micro-batches and ranks is the full-step loss. verl's modes map one to one: ``token-mean`` =
``token_mean``, ``seq-mean-token-mean`` = ``seq_mean_token_mean``, ``seq-mean-token-sum-norm`` =
``seq_mean_token_sum_norm`` (sum over sequences / (N_seqs * max_new_tokens); verl 0.9.1 divides by
the batch size too, verl main b178a3c did not).

The clip fraction is verl's: the share of mask tokens where the clipped term is strictly larger
(``(V_clip - R)^2 > (V - R)^2``, i.e. the clip took effect on the loss).

Masked positions never reach the arithmetic (``torch.where`` before the square, as in
:mod:`elastic.rl.algorithms.loss`): NaN / inf on padding cannot make the loss or its gradient NaN.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from elastic.rl.algorithms.aggregation import StepCounts, step_counts, token_weights


def _keep(valid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       cliprange_value: float, agg: str, *,
                       counts: Optional[StepCounts] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(loss, clip_frac)``: this micro-batch's share of the clipped value loss, and its clip fraction.

    ``values [B, T]`` (the critic's current prediction, differentiable), ``old_values [B, T]``
    (at rollout time), ``returns [B, T]``, ``mask [B, T]`` (nonzero on tokens that count),
    ``cliprange_value`` c >= 0, ``agg`` a key of :data:`~elastic.rl.algorithms.aggregation.LOSS_AGGS`.

    ``counts`` describes the whole optimizer step (see :mod:`elastic.rl.algorithms.aggregation`); None takes
    this batch as the whole step, with ``max_new_tokens = T`` (verl's default scale factor), which
    reads the counts on the host (one sync). ``loss`` is a scalar of ``values``' dtype;
    ``clip_frac`` a detached float64 scalar over this batch's mask tokens (0 for an empty mask).
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape) or values.dim() != 2:
        raise ValueError(f"clipped_value_loss: values, old_values, returns, mask must all be [B, T], got "
                         f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(mask.shape)}")
    if cliprange_value < 0:
        raise ValueError(f"clipped_value_loss: cliprange_value must be >= 0, got {cliprange_value}")
    if counts is None:
        c = step_counts(mask)
        counts = StepCounts(sequences=c["sequences"], tokens=c["tokens"], max_new_tokens=mask.shape[-1])
    valid = mask != 0
    # weights in the values' precision (an integer mask would give float32 weights: 1/5 -> 0.2000000030)
    m = mask.to(values.dtype) if values.dtype in (torch.float32, torch.float64) else mask
    w = token_weights(m, agg, counts).to(values.dtype)
    v = _keep(valid, values)
    old = _keep(valid, old_values.to(values.dtype))
    ret = _keep(valid, returns.to(values.dtype))
    # verl_F.clip_by_value: max(min(x, hi), lo)
    v_clipped = torch.max(torch.min(v, old + cliprange_value), old - cliprange_value)
    unclipped_loss = (v - ret) ** 2
    clipped_loss = (v_clipped - ret) ** 2
    per_token = torch.max(unclipped_loss, clipped_loss)
    loss = 0.5 * _keep(valid, w * per_token).sum()
    clipped = valid & (clipped_loss > unclipped_loss)
    n = valid.to(torch.float64).sum()
    clip_frac = clipped.to(torch.float64).sum() / n.clamp(min=1.0)
    return loss, clip_frac.detach()
