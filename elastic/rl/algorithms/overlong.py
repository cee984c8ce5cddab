"""DAPO-style length shaping: a soft penalty near the token budget and one for truncation.

Completions that run into ``max_new_tokens`` are usually unfinished code, and a reward that
ignores length teaches the policy nothing about stopping. DAPO (Yu et al. 2025, "overlong reward
shaping") subtracts a penalty that grows linearly over the last ``buffer`` tokens of the budget.
Here, for a completion of L tokens (EOS included) with budget M = ``max_new_tokens`` and
B = ``buffer``:

    soft(L)   = overlong_penalty * clamp((L - (M - B)) / B, 0, 1)     (0 when B = 0)
    trunc(L)  = truncation_penalty   if the completion was cut at M without stopping, else 0
    penalty   = -(soft(L) + trunc(L))                                   (added to the reward)

So soft is 0 up to M - B tokens, rises linearly, and reaches ``overlong_penalty`` at L = M.
A truncated completion always has L = M, so it gets the whole soft penalty plus
``truncation_penalty``; with ``overlong_penalty = 1`` and ``truncation_penalty = 0`` this is
DAPO's R_length (their L_max = M, L_cache = B). Both magnitudes default to 0 in the config: off.

The penalty is added to the reward *before* group advantages, so it also separates completions
whose task rewards tie (e.g. all failed, but some stopped in time).
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, truncated: torch.Tensor, max_new_tokens: int, buffer: int,
                     overlong_penalty: float, truncation_penalty: float = 0.0) -> torch.Tensor:
    """``lengths [N]`` (int), ``truncated [N]`` (bool) -> penalty ``[N]`` float32, each <= 0."""
    if max_new_tokens < 1 or buffer < 0:
        raise ValueError(f"overlong: need max_new_tokens >= 1 and buffer >= 0, got {max_new_tokens}, {buffer}")
    if overlong_penalty > 0 and not 1 <= buffer <= max_new_tokens:
        raise ValueError(f"overlong: the soft penalty needs 1 <= buffer <= max_new_tokens={max_new_tokens}, got {buffer}")
    if overlong_penalty < 0 or truncation_penalty < 0:
        raise ValueError(f"overlong: penalties are magnitudes (>= 0), got {overlong_penalty}, {truncation_penalty}")
    if bool((lengths > max_new_tokens).any()) or bool((lengths < 0).any()):
        raise ValueError(f"overlong: every length must be in [0, max_new_tokens={max_new_tokens}]")
    L = lengths.to(torch.float32)
    soft = torch.zeros_like(L)
    if buffer > 0 and overlong_penalty > 0:
        soft = overlong_penalty * ((L - (max_new_tokens - buffer)) / buffer).clamp(0.0, 1.0)
    trunc = truncated.to(torch.float32) * truncation_penalty
    return -(soft + trunc)
