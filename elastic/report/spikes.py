"""Upward spikes in a per-step series (loss, gradient norm), found without a profiler.

Why its own detector: older runs carry no `loss_spike` events, and a trainer's live detector
sees only the past, so the report looks at the whole stream once. The rule is robust to the
steady fall of the loss early in training and to noise: a value is a spike when it exceeds the
median of the previous `window` finite values by `z` robust standard deviations
(1.4826 × median absolute deviation), and by at least `min_rel` of that median (the floor keeps
a perfectly flat stretch from calling every wiggle a spike). Only upward jumps count: a loss
that falls fast is progress, not instability.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np

WINDOW = 20
MIN_HISTORY = 5
LOSS_Z = 6.0
LOSS_MIN_REL = 0.05  # a loss spike is at least 5% above the recent median
GRAD_Z = 6.0
GRAD_MIN_REL = 2.0  # a grad-norm spike is at least 3x the recent median (+200%)


def upward_spikes(steps: Sequence[int], values: Sequence[float], z: float, min_rel: float,
                  window: int = WINDOW) -> List[Tuple[int, float]]:
    """[(step, robust z)] of values that jump above their trailing median. Non-finite values are
    skipped here (they are counted as bad steps elsewhere) and never enter the history."""
    pts = [(int(s), float(v)) for s, v in zip(steps, values) if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(pts) <= MIN_HISTORY:
        return []
    st = np.array([p[0] for p in pts])
    x = np.array([p[1] for p in pts])
    out: List[Tuple[int, float]] = []
    for i in range(MIN_HISTORY, len(x)):
        hist = x[max(0, i - window):i]
        med = float(np.median(hist))
        scale = max(1.4826 * float(np.median(np.abs(hist - med))), 1e-3 * abs(med), 1e-12)
        zi = (x[i] - med) / scale
        if zi >= z and x[i] - med >= min_rel * abs(med):
            out.append((int(st[i]), float(zi)))
    return out
