"""Multi-turn episodes (issue 44): an episode's reward, the policy-token loss mask,
and the token cap on feedback. Pure torch, nothing of ours imported.

An episode is ``k`` turns of one task: the policy answers, the verifier's feedback
(elastic/reward/feedback.py) comes back as the next user message, the policy answers again, and
so on until a turn passes or ``rl.turns`` is reached. One episode is one row of the step: prompt,
then policy turn 1, feedback 1, policy turn 2, ... The loss covers only the tokens the policy
generated: :func:`policy_token_mask` gives 1 on each policy span and 0 on the prompt, on the
feedback (and the template's tokens around it) and on padding. That mask is the ``mask`` of
:func:`~elastic.rl.algorithms.loss.grpo_loss` (which zeroes every masked input with ``torch.where``
before the ratio, the KL and the entropy sum) and the ``response_mask`` of
:mod:`~elastic.rl.algorithms.gae` (``skip_masked=True`` bootstraps across observation spans, verl's
layout), so feedback tokens are context only: they change no gradient.

The GRPO job runs episodes in both placements (elastic/rl/episodes.py, used by
elastic/rl/grpo.py ``_generate_episodes`` and the rollout fleet's actors), PPO colocated
(elastic/rl/ppo.py ``rank_gae``); docs/grpo.md, "Multi-turn".
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

TURN_REWARDS = ("last", "discounted")

Span = Tuple[int, int]  # [start, end) positions of one policy turn in the row


def episode_reward(turn_rewards: Sequence[float], mode: str = "last", discount: float = 1.0, cost: float = 0.0) -> float:
    """The episode's scalar reward from its turns' rewards ``r_1..r_K`` (K >= 1, in order).

    - ``last``: ``r_K`` (the final answer's reward; earlier attempts only buy context);
    - ``discounted``: ``sum_k discount^(k-1) r_k`` (with ``discount < 1`` a pass reached in
      fewer turns is worth more);

    minus ``cost * (K - 1)``: a cost per turn after the first, so a one-turn episode's reward is
    exactly today's single-turn reward whatever the settings.
    """
    rs = [float(r) for r in turn_rewards]
    if not rs:
        raise ValueError("episode_reward: an episode has at least one turn")
    if mode not in TURN_REWARDS:
        raise ValueError(f"episode_reward: mode must be one of {'|'.join(TURN_REWARDS)}, got {mode!r}")
    if not 0 < discount <= 1:
        raise ValueError(f"episode_reward: discount must be in (0, 1], got {discount}")
    if cost < 0:
        raise ValueError(f"episode_reward: cost must be >= 0, got {cost}")
    if mode == "last":
        base = rs[-1]
    else:
        base = sum(discount ** k * r for k, r in enumerate(rs))
    return base - cost * (len(rs) - 1)


def _row_mask(spans: Sequence[Span], length: int) -> torch.Tensor:
    m = torch.zeros(length, dtype=torch.bool)
    prev_end = 0
    for start, end in sorted((int(s), int(e)) for s, e in spans):
        if not 0 <= start <= end <= length:
            raise ValueError(f"policy_token_mask: span [{start}, {end}) is outside [0, {length})")
        if start < prev_end:
            raise ValueError(f"policy_token_mask: span [{start}, {end}) overlaps the previous one (ends at {prev_end})")
        m[start:end] = True
        prev_end = end
    return m


def policy_token_mask(spans: Union[Sequence[Span], Sequence[Sequence[Span]]], length: int) -> torch.Tensor:
    """Bool loss mask from the policy's turn spans: 1 inside each ``[start, end)``, 0 elsewhere
    (prompt, feedback, template tokens, padding).

    ``spans`` is one row's list of ``(start, end)`` -> ``[length]``, or a list of such lists (one
    per row) -> ``[B, length]``. Spans must lie in ``[0, length)`` and not overlap (ValueError).
    """
    def is_span(x) -> bool:
        return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, int) for v in x)

    if len(spans) and not is_span(spans[0]):
        return torch.stack([_row_mask(row, length) for row in spans])  # type: ignore[arg-type]
    return _row_mask(spans, length)  # type: ignore[arg-type]


def cap_tokens(ids: Sequence[int], max_tokens: int, marker: Optional[Sequence[int]] = None) -> List[int]:
    """At most ``max_tokens`` ids: ``ids`` as they are when they fit, else their head followed by
    ``marker`` (the tokenized truncation marker, e.g. of ``"[truncated]"``) so the policy sees the
    cut. ``rl.feedback_max_tokens`` is applied with this after the feedback is tokenized.
    A marker longer than the cap is itself cut (the result never exceeds ``max_tokens``)."""
    if max_tokens < 1:
        raise ValueError(f"cap_tokens: max_tokens must be >= 1, got {max_tokens}")
    ids = list(ids)
    if len(ids) <= max_tokens:
        return ids
    mark = list(marker or [])[:max_tokens]
    return ids[:max_tokens - len(mark)] + mark


# Room for the chat template's tokens around one feedback message (end of turn, user header,
# assistant header), on top of its capped text.
FEEDBACK_TEMPLATE_TOKENS = 64


def episode_budget(prompt_lens: Sequence[int], turns: int, max_new_tokens: int, feedback_max_tokens: int,
                   max_seq_len: int) -> int:
    """The sequence room of every episode of a generation call: the longest prompt, ``turns``
    answers of ``max_new_tokens``, ``turns - 1`` feedback messages of ``feedback_max_tokens`` plus
    the template's tokens, capped at ``max_seq_len``.

    prompt_lens: the lengths of *all* the prompts the call stands for (every rank's, not only this
    rank's), so the room, and with it whether an episode ends for lack of it (``length``), does
    not depend on how the prompts were split over ranks: a resized run gets the same episodes.
    """
    longest = max(prompt_lens, default=0)
    need = longest + turns * max_new_tokens + (turns - 1) * (feedback_max_tokens + FEEDBACK_TEMPLATE_TOKENS)
    return min(need, max_seq_len)
