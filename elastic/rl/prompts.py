"""The global prompt cursor: which problems GRPO step s trains on, at any world size.

Like the data cursor of pretraining, the prompt stream is a pure function of the config: epochs
over the training problems, each a seeded permutation; step s takes stream positions
[s·P, (s+1)·P). A resumed or resized run therefore trains on the same prompts in the same
steps; the checkpoint stores the cursor (s·P) for the record and for seeking.

Completions are numbered globally: completion `k` of step s belongs to prompt slot k // G and
is sample k % G of its group; its id (for the ledger) is `position·G + sample`, unique over the
run. The completions of one optimizer minibatch are split evenly over ranks, so a rank trains on
exactly the completions it generated (`rank_completions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from elastic.rl.seeds import derive_seed


@dataclass(frozen=True)
class PromptStream:
    problem_ids: Tuple[str, ...]  # the training split, sorted
    seed: int

    def at(self, position: int) -> str:
        n = len(self.problem_ids)
        epoch, i = divmod(position, n)
        order = np.random.default_rng(derive_seed(self.seed, "prompt_order", epoch)).permutation(n)
        return self.problem_ids[int(order[i])]

    def step(self, step: int, prompts_per_step: int) -> List[Tuple[int, str]]:
        """(stream position, problem id) of the prompts of 0-based step `step`."""
        first = step * prompts_per_step
        return [(p, self.at(p)) for p in range(first, first + prompts_per_step)]


def rank_completions(n_completions: int, minibatches: int, world: int, rank: int) -> List[List[int]]:
    """Global completion indices this rank generates and trains on, per minibatch.

    Minibatch m holds completions [m·N/M, (m+1)·N/M) (world-size independent); rank r takes the
    r-th equal slice of each. Requires N/M divisible by the world size (checked in the config)."""
    per_mb = n_completions // minibatches
    per_rank = per_mb // world
    return [list(range(m * per_mb + rank * per_rank, m * per_mb + (rank + 1) * per_rank)) for m in range(minibatches)]


def completion_id(position: int, sample: int, group_size: int) -> int:
    return position * group_size + sample


def group_of(k: int, group_size: int) -> Tuple[int, int]:
    """Completion index in the step → (prompt slot, sample)."""
    return divmod(k, group_size)


def flat(xs: Sequence[Sequence[int]]) -> List[int]:
    return [x for part in xs for x in part]
