"""GRPO math as small pure functions (no Ray, no torch.distributed), selected by config name.

- :mod:`~elastic.rl.advantages`: group-relative advantages (``rl.adv_norm``), zero-variance groups, the weight
  of negative advantages (``rl.negative_weight``).
- :mod:`~elastic.rl.objective`: the clipped surrogate per token (``rl.clip_low`` / ``rl.clip_high``, dual clip
  ``rl.clip_ratio_c``).
- :mod:`~elastic.rl.kl`: per-token KL estimators k1/k2/k3 (``rl.kl_estimator``).
- :mod:`~elastic.rl.aggregation`: per-token weights with step-wide normalisers (``rl.loss_agg``).
- :mod:`~elastic.rl.loss`: one micro-batch's share of the step loss + summable statistics.
- :mod:`~elastic.rl.logprobs`: float32 chunked log-probs of given tokens (with exact backward), entropy.
- :mod:`~elastic.rl.overlong`: DAPO-style length penalty (``rl.overlong_*``, ``rl.truncation_penalty``).
- :mod:`~elastic.rl.seeds`: per-completion sampling seeds from ``run.seed``.
- :mod:`~elastic.rl.split`: train / held-out split of the problem set (``rl.heldout``).
"""

from elastic.rl.advantages import ADV_NORMS, group_advantages, weight_negatives, zero_variance_groups
from elastic.rl.aggregation import LOSS_AGGS, StepCounts, step_counts, token_weights
from elastic.rl.kl import KL_ESTIMATORS, kl_per_token
from elastic.rl.logprobs import token_entropy, token_logprobs
from elastic.rl.loss import STAT_KEYS, add_stats, grpo_loss, stats_to_tensor, summarize, tensor_to_stats
from elastic.rl.objective import ClippedObjective, clipped_objective
from elastic.rl.overlong import overlong_penalty
from elastic.rl.seeds import derive_seed, rollout_seed
from elastic.rl.split import ProblemSplit, split_problems

__all__ = [
    "ADV_NORMS", "KL_ESTIMATORS", "LOSS_AGGS", "STAT_KEYS", "ClippedObjective", "ProblemSplit", "StepCounts",
    "add_stats", "clipped_objective", "derive_seed", "group_advantages", "grpo_loss", "kl_per_token",
    "overlong_penalty", "rollout_seed", "split_problems", "stats_to_tensor", "step_counts", "summarize",
    "tensor_to_stats", "token_entropy", "token_logprobs", "token_weights", "weight_negatives", "zero_variance_groups",
]
