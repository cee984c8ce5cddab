"""Micro-batch sizes are upper bounds (`train.micro_batch_size`, `rl.micro_batch_size`).

A user sets how many rows one forward/backward may hold (a memory bound); how many rows a worker
gets per optimizer step follows from the global batch and the world size, which an elastic run
changes as it resizes. So the size a worker uses is the largest one <= the setting that divides
its share: 4 prompts x 4 samples on 2 workers with `rl.micro_batch_size: 16` runs in one
micro-batch of 8, and the same run on 3 workers of a 12-row batch runs 4 rows at a time. The
gradient does not depend on the split (every job normalises by the global batch), so the run
is the same at any size; only the number of forward/backward passes changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple


def fitted_micro_batch(share: int, setting: int) -> int:
    """The largest micro-batch <= `setting` that divides `share` (a worker's rows per optimizer
    step) into whole micro-batches; >= 1. E.g. (8, 16) -> 8, (12, 8) -> 6, (7, 4) -> 1."""
    if share < 1 or setting < 1:
        raise ValueError(f"share and setting must be >= 1, got {share}, {setting}")
    return max(d for d in range(1, min(share, setting) + 1) if share % d == 0)


@dataclass(frozen=True)
class Fitted:
    """One micro-batch key as a worker runs it."""

    key: str       # "train.micro_batch_size" | "rl.micro_batch_size"
    setting: int   # the config's value (the upper bound)
    share: int     # this worker's rows per optimizer step
    used: int      # fitted_micro_batch(share, setting)

    def describe(self, unit: str) -> str:
        return (f"{self.key}={self.setting} is an upper bound: {self.used} {unit} per micro-batch "
                f"(the largest size <= {self.setting} that divides each worker's {self.share})")


def shares(cfg: Any, dp_world: int) -> List[Tuple[str, int]]:
    """(key, a data-parallel rank's rows per optimizer step) for every micro-batch key whose share
    is whole at `dp_world` (config validation has stopped a run where the job's own is not)."""
    out = []
    t = cfg.train
    if t.global_batch_size % dp_world == 0:
        out.append(("train.micro_batch_size", t.global_batch_size // dp_world))
    rl = cfg.rl
    n = rl.prompts_per_step * rl.group_size
    if rl.minibatches_per_update >= 1 and n % rl.minibatches_per_update == 0 and (n // rl.minibatches_per_update) % dp_world == 0:
        out.append(("rl.micro_batch_size", n // rl.minibatches_per_update // dp_world))
    return out


def fit_micro_batches(cfg: Any, dp_world: int, keys: Sequence[str]) -> List[Fitted]:
    """Set each of `keys` on `cfg` (a worker's own copy) to the size this world size allows;
    returns every key of `keys` as fitted, changed or not (the caller logs the changed ones)."""
    got = []
    for key, share in shares(cfg, dp_world):
        if key not in keys:
            continue
        section, name = key.split(".")
        sec = getattr(cfg, section)
        f = Fitted(key, getattr(sec, name), share, fitted_micro_batch(share, getattr(sec, name)))
        setattr(sec, name, f.used)
        got.append(f)
    return got
