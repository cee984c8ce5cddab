"""What generation returns, and the input checks and per-prompt seeds both generation paths
share (elastic/generation/generate.py, the engine; elastic/generation/reference.py, the
reference it is tested against)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Union

import torch
import torch.nn as nn


@dataclass
class Completion:
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)  # log p(token) under the raw logits
    finish_reason: str = "length"  # "stop" | "length"


def row_seeds(seed: Union[int, Sequence[int], None], n: int) -> List[int]:
    """One seed per prompt: `seed + i` for an int, the list itself, or drawn from torch's global
    RNG for None (so torch.manual_seed makes it repeatable). 63-bit non-negative."""
    if seed is None:
        return torch.randint(0, 2**62, (n,)).tolist()
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"seed: {len(seeds)} seeds for {n} prompts")
    return seeds


def check_inputs(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int) -> None:
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0 or max_new_tokens < 0:
        raise ValueError(f"generate: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, max_new_tokens >= 0 "
                         f"(got {temperature}, {top_p}, {top_k}, {max_new_tokens})")
    vocab = model.args.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"generate: prompts[{i}] is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"generate: prompts[{i}] has token id {bad[0]} outside the vocabulary [0, {vocab})")
