"""Per-token KL estimators between the policy and a frozen reference (Schulman, "Approximating
KL divergence", 2020), selected by ``rl.kl_estimator`` through :data:`KL_ESTIMATORS`.

With ``logr = ref_logp - logp`` evaluated at tokens sampled from the policy pi:

- ``k1 = logp - ref_logp = -logr``: unbiased for KL(pi || ref), high variance, can be negative.
- ``k2 = (logr)^2 / 2``: biased, low variance, never negative.
- ``k3 = exp(logr) - logr - 1``: unbiased for KL(pi || ref), low variance, never negative
  (GRPO's choice in DeepSeekMath, and TRL's). Clamped to [-10, 10] per token like verl's
  ``low_var_kl`` (:data:`K3_CLAMP`), which makes it slightly biased low where it binds.

Used as a *loss term* (what GRPO does, rather than folding KL into the reward), what matters is
the gradient, and the three differ (on-policy, per token, expectation over x ~ pi):

- ``grad k1 = grad logp``, whose expectation is 0: k1 in the loss adds noise and no pull towards
  the reference. It is fine as a *metric*.
- ``grad k2 = (logp - ref_logp) grad logp``, expectation = grad KL(pi || ref) (reverse KL).
- ``grad k3 = (1 - ref/pi) grad logp``, expectation = -E_ref[grad logp] = grad KL(ref || pi)
  (forward KL).

So keep ``k3`` (the default) for the loss; ``k1`` exists for comparison and metrics. After the
first optimizer step on a rollout (``updates_per_rollout`` or ``minibatches_per_update`` > 1) the
tokens come from pi_old, not pi, and none of these is exactly unbiased any more; like TRL and
verl, we do not importance-weight the KL term.

Shapes: any, as long as ``logp`` and ``ref_logp`` broadcast (``[B, T]`` in practice).
"""

from __future__ import annotations

from typing import Callable, Dict

import torch

LOG_RATIO_CLAMP = 20.0
"""|ref_logp - logp| is clamped to this before exp() in k3, so a token the reference finds
e^20 times likelier cannot overflow to inf (verl clamps the same way). exp(20) ~ 4.9e8."""

K3_CLAMP = 10.0
"""The k3 value is then clamped to [-K3_CLAMP, K3_CLAMP], as verl's ``kl_penalty`` does for
``low_var_kl``/``k3`` (``torch.clamp(kld, min=-10, max=10)``). k3 is never negative, so only the
upper bound acts: it binds when ``ref - logp`` > ~2.61 (exp(2.61) - 3.61 ~ 9.99; the reference finds
the token ~14x likelier than the policy) or < ~-11 (the policy finds it ~60000x likelier than the
reference). There the token's KL value is 10 and its KL *gradient is zero* (clamp's gradient),
exactly as in verl: one wildly divergent token cannot dominate the loss, but it is also no longer
pulled back by the KL term (the clipped policy term still acts on it). k1 and k2 are not clamped
(verl does not clamp them either)."""


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``logp - ref_logp``."""
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``(logp - ref_logp)^2 / 2``."""
    return 0.5 * (logp - ref_logp).square()


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``exp(ref - logp) - (ref - logp) - 1``, with the log-ratio clamped to +-LOG_RATIO_CLAMP
    and the result to +-K3_CLAMP (verl's ``low_var_kl``)."""
    logr = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(logr) - logr - 1.0).clamp(-K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": k1, "k2": k2, "k3": k3}
"""``rl.kl_estimator`` name -> per-token estimator."""


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """The chosen estimator, elementwise (``[B, T] -> [B, T]``); masking is the caller's."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator: unknown {estimator!r} (known: {', '.join(KL_ESTIMATORS)})")
    return KL_ESTIMATORS[estimator](logp, ref_logp)
