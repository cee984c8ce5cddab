"""Group-relative advantages: each completion is scored against the other samples of its prompt.

GRPO has no value network. The G completions sampled for one prompt are each other's baseline,
so rewards arrive as a ``[P, G]`` matrix (P prompts, G samples each) and every advantage is a
function of its own row only. The advantage is one number per completion; the loss broadcasts it
over the completion's tokens.

Variants, selected by ``rl.adv_norm`` through :data:`ADV_NORMS`:

- ``group_std`` (GRPO, DeepSeekMath): ``(r - mean_g) / (std_g + eps)``. ``std_g`` is the
  *unbiased* sample standard deviation (``torch.std``, Bessel's correction, divides by G - 1),
  because TRL's ``GRPOTrainer`` (``rewards.view(-1, G).std(dim=1)``) and verl's
  ``compute_grpo_outcome_advantage`` (``torch.std``) both use it: the same rewards give the same
  advantages as those reference implementations, so their published recipes transfer unchanged.
  With G = 4 the unbiased std is sqrt(4/3) ~ 1.15 times the population one, so the choice is a
  visible constant factor on every advantage.
- ``none`` (Dr. GRPO, Liu et al. 2025): ``r - mean_g``. Dividing by the group std up-weights
  prompts whose rewards barely differ (very easy or very hard ones); dropping it removes that
  question-level difficulty bias.

A group of one sample (G = 1) is an error, not a silent value: it has no baseline but itself, so
its centred advantage would always be 0 (no learning signal at all). ``rl.group_size >= 2`` is
checked when the config loads (``elastic/config/load.py``, a one-line ConfigError), and
:func:`group_advantages` / :func:`zero_variance_groups` raise ValueError on a ``[P, 1]`` input.
verl differs here: its ``compute_grpo_outcome_advantage`` gives a lone sample mean 0 and std 1, so
its advantage is its raw reward (``r / (1 + eps)``), a REINFORCE term with no baseline.

A group whose rewards are all equal has zero advantage under both variants, so it contributes no
policy gradient, only compute (and KL, when on). :func:`zero_variance_groups` finds those groups so
the caller can drop them (``rl.filter_zero_variance``) and report their fraction.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch

EPS = 1e-6
"""Added to the group std (verl's default); keeps a zero-variance group at exactly 0."""


def _check_rewards(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards: expected shape [prompts, group_size], got {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError(f"rewards: a group needs at least 2 samples to be its own baseline, got group_size {rewards.shape[1]}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: every reward must be finite (got NaN or inf)")


def group_std(rewards: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``[P, G] -> [P, G]``: ``(r - mean_g) / (std_g + eps)``, std unbiased (see module doc)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def group_center(rewards: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``[P, G] -> [P, G]``: ``r - mean_g`` (Dr. GRPO). ``eps`` is unused; kept for one signature."""
    return rewards - rewards.mean(dim=1, keepdim=True)


ADV_NORMS: Dict[str, Callable[..., torch.Tensor]] = {"group_std": group_std, "none": group_center}
"""``rl.adv_norm`` name -> advantage function."""


def group_advantages(rewards: torch.Tensor, norm: str = "group_std", eps: float = EPS) -> torch.Tensor:
    """Advantages ``[P, G]`` (float32 or wider) from rewards ``[P, G]`` (row = one prompt's group).

    ``norm`` is a key of :data:`ADV_NORMS`. Rewards must be finite and G >= 2: a group of one
    raises ValueError (see the module doc; the config already refuses ``rl.group_size < 2``).
    """
    if norm not in ADV_NORMS:
        raise ValueError(f"adv_norm: unknown {norm!r} (known: {', '.join(ADV_NORMS)})")
    _check_rewards(rewards)
    r = rewards if rewards.dtype in (torch.float32, torch.float64) else rewards.float()
    return ADV_NORMS[norm](r, eps)


def weight_negatives(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """``[...] -> [...]``: negative advantages times ``weight``, positive ones unchanged.

    W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning") splits the policy gradient into pulling passing samples up and pushing failing
    ones down, and weights the second by lambda. That it helps our small, sharply fine-tuned
    policy is measured (docs/benchmarks.md, GRPO default: the same run at weight 1 stays flat
    and its entropy rises); why is our reading: a failing program is mostly confident tokens
    after one bad one, so pushing all of them down is mostly noise, while the passing
    samples' pull sharpens the policy towards programs that work. ``weight`` 1 is plain GRPO,
    0 trains on passes only.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"negative_weight: must be in [0, 1], got {weight}")
    return torch.where(advantages < 0, advantages * weight, advantages)


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """``[P, G] -> bool [P]``: True where every reward of the group is exactly equal.

    Exact equality, not a tolerance: rewards are computed by one deterministic formula, so two
    completions that earned the same outcome get bit-identical rewards, and any real difference
    (even a small speed-up) is signal worth keeping. The fraction of dropped groups is
    ``zero_variance_groups(r).float().mean()``.
    """
    _check_rewards(rewards)
    return (rewards == rewards[:, :1]).all(dim=1)
