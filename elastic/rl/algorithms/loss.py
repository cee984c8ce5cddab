"""The GRPO loss of one micro-batch: clipped objective + KL, aggregated with step-wide weights.

Per token: ``l = -min(r A, clip(r) A) + kl_coef * KL_est(logp, ref_logp)`` (with dual clip,
``rl.clip_ratio_c > 0``, the first term is capped at ``-A c`` for ``A < 0``)
(:mod:`elastic.rl.algorithms.objective`, :mod:`elastic.rl.algorithms.kl`), then ``loss = sum(w * l)`` with the weights
of :mod:`elastic.rl.algorithms.aggregation`. That sum is this micro-batch's *share* of the step loss, so
backpropagating it on every micro-batch of every rank accumulates exactly the full-step gradient.

Statistics come back as sums and counts (never means) so the caller can add them over
micro-batches and all-reduce them over ranks exactly, then call :func:`summarize` once.
They are detached float64 tensors on the input's device: building them costs no host sync.

Masked positions never reach the arithmetic: every per-token input (``logp``, ``old_logp``,
``ref_logp``, ``entropy``, the broadcast advantage) is replaced by 0 there with ``torch.where``
*before* the ratio, the KL and the aggregation, and every masked sum is a ``torch.where`` too.
Multiplying by a 0 mask is not enough (``NaN * 0 = NaN``, ``inf * 0 = NaN``): a NaN or inf
log-prob on padding, or on a completion filtered out of the step, would otherwise make the loss,
the gradient and the statistics NaN and the step would be skipped. A NaN on a *kept* token still
propagates, on purpose (the step guard in ``elastic/train/step.py`` skips that step).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from elastic.rl.algorithms.aggregation import StepCounts, token_weights
from elastic.rl.algorithms.kl import kl_per_token
from elastic.rl.algorithms.objective import clipped_objective

STAT_KEYS = ("loss", "pg_loss", "kl_loss", "tokens", "sequences", "clip_low_tokens", "clip_high_tokens",
             "clip_dual_tokens", "ratio_sum", "kl_sum", "entropy_sum")
"""Every key of the stats dict, in a fixed order (stack them in this order for one all-reduce)."""


def _keep(valid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where ``valid``, exactly 0 elsewhere (whatever ``x`` holds there, NaN and inf included)."""
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _masked_sum(valid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """float64 sum of ``x`` over ``valid`` positions, detached."""
    return _keep(valid, x.detach().to(torch.float64)).sum()


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              loss_agg: str, counts: StepCounts, clip_low: float, clip_high: float, clip_ratio_c: float = 0.0,
              ref_logp: Optional[torch.Tensor] = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
              entropy: Optional[torch.Tensor] = None, is_weights: Optional[torch.Tensor] = None,
              grad_scale: float = 1.0) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """This micro-batch's share of the step loss, and its statistics.

    Shapes: ``logp`` (differentiable), ``old_logp``, ``ref_logp``, ``entropy``, ``mask`` are
    ``[B, T]`` over completion tokens (``mask`` nonzero on real completion tokens, 0 on padding
    and on completions filtered out of the step); ``advantages`` is ``[B]`` (or ``[B, T]``).
    Values at masked positions are ignored entirely, even NaN or inf (see the module doc); their
    gradient is exactly 0.

    ``counts`` describes the whole step (:class:`~elastic.rl.algorithms.aggregation.StepCounts`).
    ``clip_ratio_c``: dual-clip bound for negative advantages (:mod:`elastic.rl.algorithms.objective`), 0 = off.
    ``is_weights`` ``[B, T]`` (detached) multiplies each token's policy-gradient term: the truncated
    importance weights of completions from an older policy (:mod:`elastic.rl.algorithms.off_policy`).
    ``ref_logp`` is needed only when ``kl_coef > 0``; given with ``kl_coef == 0`` it is used for
    the KL metric only. ``grad_scale`` multiplies the returned loss and nothing else: under
    FSDP/DDP, which *average* gradients over ranks, pass the world size so the accumulated
    gradient is the full-step sum, as ``elastic/train/step.py`` does for pretraining.

    Returns ``(loss_to_backprop, stats)``: ``stats[k]`` for ``k`` in :data:`STAT_KEYS`; the
    ``loss``, ``pg_loss``, ``kl_loss`` entries are this part's share (sum over parts = step
    value, unscaled by ``grad_scale``), the rest are token sums and counts.
    """
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("grpo_loss: kl_coef > 0 needs ref_logp (log-probs under the reference model)")
    valid = mask != 0
    w = token_weights(mask, loss_agg, counts).to(logp.dtype)
    # Zero every masked input before any arithmetic: ratio exp(0 - 0) = 1, advantage 0, KL 0.
    lp = _keep(valid, logp)
    old = _keep(valid, old_logp)
    adv = advantages.unsqueeze(-1) if advantages.dim() == logp.dim() - 1 else advantages
    adv = _keep(valid, adv.expand_as(logp))
    obj = clipped_objective(lp, old, adv, clip_low, clip_high, clip_ratio_c)
    tok_loss = obj.loss if is_weights is None else obj.loss * _keep(valid, is_weights.detach().to(obj.loss.dtype))
    pg = _keep(valid, w * tok_loss).sum()
    zero = torch.zeros((), dtype=torch.float64, device=logp.device)
    kl_loss, kl_sum = zero, zero
    total = pg
    if ref_logp is not None:
        ref = _keep(valid, ref_logp)
        kl = kl_per_token(lp if kl_coef > 0 else lp.detach(), ref, kl_estimator)
        kl_sum = _masked_sum(valid, kl)
        if kl_coef > 0:
            kl_term = kl_coef * _keep(valid, w * kl).sum()
            total = pg + kl_term
            kl_loss = kl_term.detach().to(torch.float64)
    m = valid.to(torch.float64)
    stats = {
        "loss": total.detach().to(torch.float64),
        "pg_loss": pg.detach().to(torch.float64),
        "kl_loss": kl_loss,
        "tokens": m.sum(),
        "sequences": valid.any(dim=-1).to(torch.float64).sum(),
        "clip_low_tokens": _masked_sum(valid, obj.clipped_low),
        "clip_high_tokens": _masked_sum(valid, obj.clipped_high),
        "clip_dual_tokens": _masked_sum(valid, obj.clipped_dual),
        "ratio_sum": _masked_sum(valid, obj.ratio),
        "kl_sum": kl_sum,
        "entropy_sum": _masked_sum(valid, entropy) if entropy is not None else zero,
    }
    return total * grad_scale, stats


def add_stats(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Elementwise sum of two stats dicts (micro-batch accumulation)."""
    return {k: a[k] + b[k] for k in STAT_KEYS}


def stats_to_tensor(stats: Dict[str, torch.Tensor]) -> torch.Tensor:
    """``[len(STAT_KEYS)]`` float64, for one ``all_reduce(SUM)``."""
    return torch.stack([stats[k] for k in STAT_KEYS])


def tensor_to_stats(t: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Inverse of :func:`stats_to_tensor`."""
    return {k: t[i] for i, k in enumerate(STAT_KEYS)}


def summarize(stats: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Step-level metrics from summed stats (after the all-reduce): the three losses as they
    are, token-weighted means ``ratio_mean``, ``kl_mean``, ``entropy_mean``, and the fractions of
    tokens clipped on each side, ``clip_low_frac`` and ``clip_high_frac``, and by dual clip,
    ``clip_dual_frac``."""
    s = {k: float(stats[k]) for k in STAT_KEYS}
    n = max(s["tokens"], 1.0)
    return {
        "loss": s["loss"], "pg_loss": s["pg_loss"], "kl_loss": s["kl_loss"],
        "tokens": s["tokens"], "sequences": s["sequences"],
        "clip_low_frac": s["clip_low_tokens"] / n, "clip_high_frac": s["clip_high_tokens"] / n,
        "clip_dual_frac": s["clip_dual_tokens"] / n,
        "ratio_mean": s["ratio_sum"] / n, "kl_mean": s["kl_sum"] / n, "entropy_mean": s["entropy_sum"] / n,
    }
