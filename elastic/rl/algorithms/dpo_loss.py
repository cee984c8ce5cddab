"""DPO losses as small pure functions (no Ray, no torch.distributed), selected by `dpo.loss_type`.

With sequence log-probabilities of the chosen answer y_w and the rejected one y_l under the
policy and the frozen reference, the implicit rewards are

    r_w = β·(log π(y_w|x) − log π_ref(y_w|x)),   r_l = β·(log π(y_l|x) − log π_ref(y_l|x)),

and with h = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x)) = (r_w − r_l)/β:

- ``sigmoid`` (DPO, Rafailov et al. 2023): −log σ(β h). With ``label_smoothing`` ε (cDPO: the
  label is wrong with probability ε): −(1−ε) log σ(β h) − ε log σ(−β h).
- ``ipo`` (Azar et al. 2023): (h − 1/(2β))². IPO is defined on length-averaged log-probabilities;
  the caller passes those (:func:`answer_logprobs` with ``average=True``), as TRL does.

Sequence log-probabilities are *summed over the answer's tokens only* (:func:`answer_logprobs`);
the prompt's tokens are context, never scored. With the policy equal to the reference every
h is 0: the sigmoid loss is log 2 per pair and every margin is 0.

Statistics follow TRL's names: rewards/chosen, rewards/rejected, rewards/margins (r_w − r_l),
rewards/accuracies (the fraction of pairs with r_w > r_l, ties counted as wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from elastic.rl.algorithms.logprobs import token_logprobs

LOSS_TYPES = ("sigmoid", "ipo")


@dataclass
class DPOTerms:
    losses: torch.Tensor            # [P] per pair, differentiable
    chosen_rewards: torch.Tensor    # [P] β·(log π − log π_ref)(y_w), detached
    rejected_rewards: torch.Tensor  # [P] detached

    @property
    def margins(self) -> torch.Tensor:
        return self.chosen_rewards - self.rejected_rewards


def answer_logprobs(logits: torch.Tensor, tokens: torch.Tensor, answer_mask: torch.Tensor,
                    average: bool = False) -> torch.Tensor:
    """Per row, Σ log p(token) over the answer's tokens (mean with `average`).

    ``logits [B, T, V]`` from a forward over ``tokens [B, T]``; ``answer_mask [B, T]`` is 1 where
    token t belongs to the answer (its log-prob is read from logits at t−1). float32."""
    lp = token_logprobs(logits[:, :-1], tokens[:, 1:])
    m = answer_mask[:, 1:].to(lp.dtype)
    total = (lp * m).sum(-1)
    if average:
        return total / m.sum(-1).clamp_min(1.0)
    return total


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> DPOTerms:
    """Per-pair loss and implicit rewards from sequence log-probabilities ([P] each)."""
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"dpo loss_type {loss_type!r}: known {', '.join(LOSS_TYPES)}")
    return DPOTerms(losses, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach())
