"""PPO with a critic: per-token rewards, GAE advantages and returns, masked whitening.

Pure torch, no Ray, no torch.distributed. Reference: verl ``verl/trainer/ppo/core_algos.py``
(``compute_gae_advantage_return``) and ``verl/utils/torch_functional.py`` (``masked_mean``,
``masked_var``, ``masked_whiten``), read at volcengine/verl main b178a3cd56f58b2d502255daba591e92833930a7
(2026-01-29); the same functions are unchanged in the released wheel verl 0.9.1. The per-token
reward follows OpenRLHF's ``compute_reward`` (``openrlhf/models/utils.py``) and verl's
``apply_kl_penalty`` (``verl/trainer/ppo/ray_trainer.py``).

Shapes: ``B`` completions, ``T`` response positions (right padding); ``response_mask [B, T]`` is
nonzero on the tokens the policy generated (in multi-turn rollouts, 0 on tool / observation
tokens inside the response as well as on padding).

GAE (Schulman et al. 2016), a reverse scan over t with ``nextvalue`` and ``lastgaelam`` starting at 0::

    delta_t = r_t + gamma * nextvalue - V_t
    A_t     = delta_t + gamma * lam * lastgaelam
    returns = A + V            (before whitening: the critic's regression target)
    A       = masked_whiten(A, response_mask)

Two versions of verl differ on which ``nextvalue`` / ``lastgaelam`` a token sees
(``skip_masked`` selects one):

- ``skip_masked=True`` (default; verl main since PR #2337, "mask out observation token in GAE",
  commit 0332866, 2025-07-04, still the code at b178a3c and in 0.9.1): a masked position does not
  update the carry (``nextvalue = V_t if m_t else nextvalue``, the same for ``lastgaelam``), so a
  token before an observation span bootstraps from the next *generated* token, and the values and
  rewards the critic/reward put on masked positions are never read.
- ``skip_masked=False`` (verl before that PR): ``nextvalue = V_{t+1}`` (0 at t = T-1) and
  ``lastgaelam`` runs through every position, masked or not.

They agree whenever the mask is a prefix of each row (no holes) and ``values`` and
``token_level_rewards`` are 0 after it (verl's critic multiplies its values by the response mask,
``dp_critic.py``; :func:`token_level_rewards` puts nothing after the last response token). With a
hole in the mask, or non-zero values on padding, they differ.

Output masking: verl returns whatever the scan leaves at masked positions (with
``skip_masked=True`` a masked position carries the next generated token's advantage). Here both
outputs are exactly 0 at masked positions (``torch.where``, so NaN / inf there cannot leak); on
mask positions they are verl's values, since whitening statistics are taken over the mask only.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

WHITEN_EPS = 1e-8
"""Added to the variance under the rsqrt in :func:`masked_whiten` (verl's value)."""

MEAN_EPS = 1e-8
"""Added to the mask count in :func:`masked_mean` (verl's value; keeps an empty mask at 0, not NaN)."""


def _float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is nonzero, weighted by ``mask`` (verl's ``masked_sum``):
    NaN / inf outside the mask is replaced by 0 first. ``dim=None`` sums everything."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    prod = kept * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``masked_sum(values, mask) / (mask.sum() + 1e-8)`` over ``dim`` (all if None), as verl.

    An all-zero mask gives 0 (not NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / (count + MEAN_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the whole ``mask`` (scalar), as verl.

    ``masked_mean((x - masked_mean(x))^2)``, times Bessel's ``n / (n - 1)`` when ``unbiased``
    (verl's default), ``n = mask.sum()``. Like verl, ``unbiased`` raises ValueError for n = 0 or
    n = 1 (a batch of one token has no sample variance); that check reads ``n`` on the host (one
    sync), ``unbiased=False`` does not.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        n_host = float(n)
        if n_host == 0:
            raise ValueError("masked_var: at least one element in the mask has to be 1")
        if n_host == 1:
            raise ValueError("masked_var: the mask holds one element, its unbiased variance divides by zero")
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + 1e-8)`` with mean and unbiased variance over ``mask`` (verl).

    Any shape (``[B, T]`` in practice), statistics over all masked elements together (not per row).
    ``shift_mean=False`` adds the mean back after scaling. Positions outside the mask are
    transformed too (verl does not zero them); callers mask them.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T] -> long [B]``: index of each row's last nonzero mask position, -1 for an empty row.

    Computed on the device (``max`` over ``where(m, t, -1)``): no host sync."""
    t = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return torch.where(response_mask.bool(), t, torch.full_like(t, -1)).max(dim=-1).values


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor, kl: Optional[torch.Tensor] = None,
                        kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards ``[B, T]`` for PPO: the sequence score on the last response token, minus
    ``kl_coef * kl`` on every response token, 0 elsewhere.

    ``scores [B]`` (one reward per completion), ``response_mask [B, T]``, ``kl [B, T]`` or None
    (a per-token KL estimate against the reference, e.g. ``kl_per_token(old_logp, ref_logp, "k1")``,
    which is verl's ``kl_penalty="kl"`` default).

    The score goes to the *last nonzero position of the mask* (OpenRLHF's ``compute_reward``:
    ``fliplr().argmax``; verl's reward managers use ``valid_response_length - 1``, the same
    position for a right-padded mask without holes), found on the device without a host sync. A
    row with an empty mask gets no score and no KL (all 0). ``kl`` outside the mask is ignored,
    even NaN / inf. ``kl_coef <= 0`` means no KL term (OpenRLHF clamps a negative coefficient to 0).
    Float32 or wider: the dtype of ``kl`` when given, else of ``scores``.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"token_level_rewards: response_mask must be [B, T], got {tuple(response_mask.shape)}")
    b, _ = response_mask.shape
    if scores.shape != (b,):
        raise ValueError(f"token_level_rewards: scores must be [B] = [{b}], got {tuple(scores.shape)}")
    if kl is not None and kl.shape != response_mask.shape:
        raise ValueError(f"token_level_rewards: kl must be {tuple(response_mask.shape)}, got {tuple(kl.shape)}")
    valid = response_mask.bool()
    dtype = _float(kl).dtype if kl is not None else _float(scores).dtype
    zero = torch.zeros((), dtype=dtype, device=response_mask.device)
    last = last_token_index(response_mask)
    has_tokens = last >= 0
    src = torch.where(has_tokens, scores.to(dtype), zero).unsqueeze(-1)
    rewards = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
    rewards = rewards.scatter(1, last.clamp(min=0).unsqueeze(-1), src)
    if kl is not None and kl_coef > 0:
        rewards = rewards - kl_coef * torch.where(valid, kl.to(dtype), zero)
    return rewards


def gae_advantages_returns(token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                           gamma: float, lam: float, *,
                           skip_masked: bool = True, whiten: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [B, T], returns [B, T])`` by GAE, verl's ``compute_gae_advantage_return``.

    ``token_level_rewards [B, T]`` (:func:`token_level_rewards`), ``values [B, T]`` (the critic's
    V(s_t) at rollout time), ``response_mask [B, T]``, ``gamma`` discount, ``lam`` GAE lambda.
    ``returns = A + V`` with the raw (not whitened) advantages; ``advantages`` are whitened over the
    mask (:func:`masked_whiten`, unbiased variance: the mask must hold at least 2 tokens). Both
    are exactly 0 outside the mask. ``skip_masked`` picks the verl version (module doc). Computed
    without grad (inputs are rollout-time tensors). Float32 or wider: the dtype of ``values``.
    ``whiten=False`` returns the raw advantages (a data-parallel caller whitens with statistics
    of the whole step, not of its own share).
    """
    if not (token_level_rewards.shape == values.shape == response_mask.shape) or values.dim() != 2:
        raise ValueError(f"gae: rewards, values, mask must all be [B, T], got {tuple(token_level_rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(response_mask.shape)}")
    with torch.no_grad():
        v = _float(values)
        r = token_level_rewards.to(v.dtype)
        valid = response_mask.bool()
        b, length = v.shape
        zero_row = torch.zeros(b, dtype=v.dtype, device=v.device)
        nextvalues = zero_row
        lastgaelam = zero_row
        reversed_adv = []
        for t in reversed(range(length)):
            if not skip_masked:
                nextvalues = v[:, t + 1] if t < length - 1 else zero_row
            delta = r[:, t] + gamma * nextvalues - v[:, t]
            gae_t = delta + gamma * lam * lastgaelam
            if skip_masked:
                # verl: x_t * m_t + (1 - m_t) * carry, written with where so NaN on a masked slot stays out
                nextvalues = torch.where(valid[:, t], v[:, t], nextvalues)
                lastgaelam = torch.where(valid[:, t], gae_t, lastgaelam)
            else:
                lastgaelam = gae_t
            reversed_adv.append(lastgaelam)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        returns = torch.where(valid, advantages + v, zero)
        mask = response_mask.to(v.dtype)
        advantages = torch.where(valid, advantages, zero)
        if whiten:
            advantages = torch.where(valid, masked_whiten(advantages, mask), zero)
    return advantages, returns
