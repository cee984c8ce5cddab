"""Stability guard: skip non-finite updates, flag loss spikes, stop a run that keeps failing.

Why here and not in the optimizer: the decision must be identical on every rank, so it is
taken on global values only (the all-reduced loss and the global gradient norm), and a run
that stops must stop *cleanly*, leaving its last good checkpoint as the one a relaunch
resumes from (the loop returns without saving; it never raises into Ray Train's retry).

* A step whose loss or gradient norm is not finite was not applied (see step.py); it counts
  as bad. `max_bad_steps` consecutive bad steps stop the run (0 = never).
* A loss more than `spike_z` standard deviations above the mean of the last `window` good
  steps is a spike: flagged in events, not skipped (spikes often recover on their own).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional


@dataclass
class Verdict:
    bad: bool                    # this step's update was not applied
    reason: Optional[str]        # why it was bad
    spike_z: Optional[float]     # z-score when the loss spiked
    stop: Optional[str]          # one-line reason to stop the run, if it must stop


class StabilityGuard:
    def __init__(self, max_bad_steps: int = 5, spike_z: float = 6.0, window: int = 50, min_history: int = 10):
        self.max_bad_steps = max_bad_steps
        self.spike_z = spike_z
        self.history: Deque[float] = deque(maxlen=window)
        self.min_history = min_history
        self.consecutive_bad = 0
        self.total_bad = 0

    def observe(self, step: int, loss: float, grad_norm: float, skipped: bool) -> Verdict:
        if skipped or not math.isfinite(loss) or not math.isfinite(grad_norm):
            self.consecutive_bad += 1
            self.total_bad += 1
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            reason = f"non-finite {what} ({loss if what == 'loss' else grad_norm})"
            stop = None
            if self.max_bad_steps and self.consecutive_bad >= self.max_bad_steps:
                stop = (f"{self.consecutive_bad} consecutive bad steps (last: step {step}, {reason}); "
                        f"train.max_bad_steps={self.max_bad_steps}: lower train.lr or raise train.warmup_steps")
            return Verdict(True, reason, None, stop)
        self.consecutive_bad = 0
        z = None
        if len(self.history) >= self.min_history:
            mean = sum(self.history) / len(self.history)
            var = sum((x - mean) ** 2 for x in self.history) / (len(self.history) - 1)
            sd = math.sqrt(var)
            if sd > 0 and (loss - mean) / sd > self.spike_z:
                z = (loss - mean) / sd
        self.history.append(loss)
        return Verdict(False, None, z, None)
