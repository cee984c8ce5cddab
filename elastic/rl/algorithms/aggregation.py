"""Turning per-token losses into one step loss, with normalisers counted over the WHOLE step.

A GRPO optimizer step covers a set of completions (one minibatch of the rollout batch) spread
over workers and, within a worker, over micro-batches. If each micro-batch averaged its own
tokens, the gradient would depend on how the step was split: the same sequences on 2 workers or
on 3 would train differently, breaking elastic determinism. So every aggregation is written as
per-token weights ``w[b, t]`` that need only the local completion mask plus counts of the whole
step (:class:`StepCounts`, the same on every rank), and a worker backpropagates ``sum(w * l)``
over its micro-batch. Summed over all micro-batches and ranks this is exactly the full-batch
loss, and so is its gradient (``tests/test_rl_math.py`` checks both).

Variants, selected by ``rl.loss_agg`` through :data:`LOSS_AGGS` (mask m, length len_s = sum_t m):

- ``token_mean`` (DAPO): ``sum_{s,t} m l / N_tokens``. Every token counts the same, so long
  completions are not under-weighted.
- ``seq_mean_token_mean`` (original GRPO): ``sum_s (sum_t m l / len_s) / N_seqs``. Each
  completion counts the same; its tokens share its weight.
- ``seq_mean_token_sum_norm`` (Dr. GRPO): ``sum_{s,t} m l / (N_seqs * max_new_tokens)``. A
  constant normaliser, so no length bias in either direction.

N_tokens and N_seqs count the step's kept completions over all ranks (a completion dropped by
the zero-variance filter is out of the step: give it an all-zero mask row, or leave it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import torch


@dataclass(frozen=True)
class StepCounts:
    """Counts over one whole optimizer step: every rank, every micro-batch.

    Build it from the full step on any rank (:func:`step_counts` of the whole mask), or sum
    :func:`step_counts` of each rank's part with one all-reduce. ``max_new_tokens`` is
    ``rl.max_new_tokens`` (used by Dr. GRPO's constant normaliser).
    """

    sequences: int
    tokens: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        if self.sequences < 1 or self.tokens < 1:
            raise ValueError(f"step counts: a step needs at least one completion token, got {self.sequences} sequences, {self.tokens} tokens")
        if self.max_new_tokens < 1:
            raise ValueError(f"step counts: max_new_tokens must be >= 1, got {self.max_new_tokens}")


def step_counts(mask: torch.Tensor) -> Dict[str, int]:
    """``mask [B, T] -> {"sequences", "tokens"}`` of this part of the step.

    A row with no mask token is not a sequence of the step (how a filtered completion is kept
    out). Sum the dicts over ranks, then build :class:`StepCounts`.
    """
    m = mask.bool()
    return {"sequences": int(m.any(dim=-1).sum()), "tokens": int(m.sum())}


def token_mean(mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """``w = m / N_tokens``."""
    return mask / counts.tokens


def seq_mean_token_mean(mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """``w = m / (len_s * N_seqs)``; an empty row gets weight 0."""
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return mask / (lengths * counts.sequences)


def seq_mean_token_sum_norm(mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """``w = m / (N_seqs * max_new_tokens)``."""
    return mask / (counts.sequences * counts.max_new_tokens)


LOSS_AGGS: Dict[str, Callable[[torch.Tensor, StepCounts], torch.Tensor]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}
"""``rl.loss_agg`` name -> weight function."""


def token_weights(mask: torch.Tensor, loss_agg: str, counts: StepCounts) -> torch.Tensor:
    """Per-token weights ``[B, T]`` (float32, or float64 for a float64 mask) such that ``sum(w * l)`` over every part of the step
    is the step's aggregated loss."""
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg: unknown {loss_agg!r} (known: {', '.join(LOSS_AGGS)})")
    m = mask if mask.dtype in (torch.float32, torch.float64) else mask.float()
    return LOSS_AGGS[loss_agg](m, counts)
