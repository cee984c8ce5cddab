"""RL and preference-learning math as small pure functions (torch only: no Ray, no
torch.distributed, no model), selected by config name, each tested against hand-computed values
and verl / TRL where they have one. The per-worker jobs in elastic/rl call them.

- :mod:`~elastic.rl.algorithms.advantages`: group-relative advantages (``rl.adv_norm``), zero-variance groups, the weight
  of negative advantages (``rl.negative_weight``).
- :mod:`~elastic.rl.algorithms.objective`: the clipped surrogate per token (``rl.clip_low`` / ``rl.clip_high``, dual clip
  ``rl.clip_ratio_c``).
- :mod:`~elastic.rl.algorithms.kl`: per-token KL estimators k1/k2/k3 (``rl.kl_estimator``).
- :mod:`~elastic.rl.algorithms.kl_controller`: PPO's fixed or adaptive KL-in-reward coefficient.
- :mod:`~elastic.rl.algorithms.aggregation`: per-token weights with step-wide normalisers (``rl.loss_agg``).
- :mod:`~elastic.rl.algorithms.loss`: one micro-batch's share of the step loss + summable statistics.
- :mod:`~elastic.rl.algorithms.gae`: per-token rewards, GAE advantages and returns (PPO).
- :mod:`~elastic.rl.algorithms.value_loss`: the critic's clipped value loss (PPO).
- :mod:`~elastic.rl.algorithms.dpo_loss`: DPO / IPO losses (``dpo.loss_type``).
- :mod:`~elastic.rl.algorithms.logprobs`: float32 chunked log-probs of given tokens (with exact backward), entropy.
- :mod:`~elastic.rl.algorithms.overlong`: DAPO-style length penalty (``rl.overlong_*``, ``rl.truncation_penalty``).
- :mod:`~elastic.rl.algorithms.turns`: multi-turn episodes: episode reward (``rl.turn_reward``),
  the policy-token loss mask, the feedback token cap (``rl.feedback_max_tokens``).

A new advantage estimator, loss or KL term goes here as a function with shapes in its docstring,
registered in its module's name table (e.g. ``ADV_NORMS``, ``KL_ESTIMATORS``, ``LOSS_AGGS``).
"""

from elastic.rl.algorithms.advantages import ADV_NORMS, group_advantages, weight_negatives, zero_variance_groups
from elastic.rl.algorithms.aggregation import LOSS_AGGS, StepCounts, step_counts, token_weights
from elastic.rl.algorithms.kl import KL_ESTIMATORS, kl_per_token
from elastic.rl.algorithms.logprobs import token_entropy, token_logprobs
from elastic.rl.algorithms.loss import STAT_KEYS, add_stats, grpo_loss, stats_to_tensor, summarize, tensor_to_stats
from elastic.rl.algorithms.objective import ClippedObjective, clipped_objective
from elastic.rl.algorithms.overlong import overlong_penalty

__all__ = [
    "ADV_NORMS", "KL_ESTIMATORS", "LOSS_AGGS", "STAT_KEYS", "ClippedObjective", "StepCounts",
    "add_stats", "clipped_objective", "group_advantages", "grpo_loss", "kl_per_token",
    "overlong_penalty", "stats_to_tensor", "step_counts", "summarize",
    "tensor_to_stats", "token_entropy", "token_logprobs", "token_weights", "weight_negatives", "zero_variance_groups",
]
