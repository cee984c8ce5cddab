"""The reward for a program that passed every test, as a function of its speedup.

    reward(s) = floor + (1 - floor) * (1 + tanh(log2(s) / scale)) / 2

with ``s = reference_time / candidate_time`` (or instruction counts). Properties, tested in
tests/test_reward_scoring.py:

* bounded: ``floor <= reward <= 1`` for every speedup (strict inside float range), so a correct program
  always beats a failing one (failure reward, default 0, is below ``floor``);
* strictly monotone in ``s``;
* ``reward(1) = floor + (1 - floor)/2`` (0.55 with the defaults ``floor=0.1``, ``scale=2``);
  ``scale`` is in doublings: ``s = 2**scale`` (4x by default) gives ``tanh(1)``, i.e. ~88%
  of the way from the middle to the top; 16x gives ~0.99.

A program that fails anything gets ``failure_reward`` (config ``reward.failure_reward``).
"""

from __future__ import annotations

import math


def speedup_reward(speedup: float, floor: float = 0.1, scale: float = 2.0) -> float:
    if not (speedup > 0) or math.isnan(speedup):
        return floor
    if math.isinf(speedup):
        return 1.0
    x = math.log2(speedup) / scale
    return floor + (1.0 - floor) * (1.0 + math.tanh(x)) / 2.0
