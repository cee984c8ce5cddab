"""Compute-optimal allocation from the approach-3 constants (Hoffmann et al. 2022, eq. 4).

With C = 6 N D, minimising E + A/N^alpha + B/D^beta over N at fixed C gives

    N_opt(C) = G (C/6)^(beta / (alpha + beta)),   D_opt(C) = G^-1 (C/6)^(alpha / (alpha + beta)),
    G = (alpha A / (beta B))^(1 / (alpha + beta)),

so D_opt = C / (6 N_opt) and tokens per parameter D_opt / N_opt. Units: C FLOPs, N parameters,
D tokens. (C = 6 N D is the approximation used for the allocation; the ladder's own FLOPs also
count attention, see elastic/model/llama.py flops_per_token.)
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np


def optimal_allocation(c, consts: Dict[str, float]) -> Dict[str, np.ndarray]:
    """{"N_opt", "D_opt", "tokens_per_param", "loss"} at compute `c` (scalar or array, FLOPs),
    from {E, A, B, alpha, beta}; plus the exponents "a" = beta/(alpha+beta), "b" = alpha/(alpha+beta) and G."""
    al, be, A, B = consts["alpha"], consts["beta"], consts["A"], consts["B"]
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a degenerate bootstrap sample gives inf/nan
        g = (al * A / (be * B)) ** (1.0 / (al + be))
        n = g * (c / 6.0) ** (be / (al + be))
        d = c / (6.0 * n)
        loss = consts["E"] + A / n ** al + B / d ** be
    return {"N_opt": n, "D_opt": d, "tokens_per_param": d / n, "loss": loss,
            "a": be / (al + be), "b": al / (al + be), "G": g}


def optimal_with_intervals(c_values: Sequence[float], consts: Dict[str, float], samples: Optional[np.ndarray] = None,
                           level: float = 0.95, names: Sequence[str] = ("E", "A", "B", "alpha", "beta")) -> List[dict]:
    """Per compute budget in `c_values`: N_opt, D_opt, tokens per parameter and the predicted loss,
    each with its bootstrap percentile interval when `samples` (shape (resamples, 5), columns
    `names`) is given: [{"C", "N_opt", "N_opt_ci", "D_opt", "D_opt_ci", "tokens_per_param", ...}]."""
    out = []
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    for c in c_values:
        point = optimal_allocation(c, consts)
        row = {"C": float(c)}
        for k in ("N_opt", "D_opt", "tokens_per_param", "loss"):
            row[k] = float(point[k])
        if samples is not None and len(samples):
            boot = [optimal_allocation(c, dict(zip(names, s))) for s in samples]
            for k in ("N_opt", "D_opt", "tokens_per_param", "loss"):
                v = np.array([float(b[k]) for b in boot])
                v = v[np.isfinite(v)]
                row[k + "_ci"] = [float(np.percentile(v, lo)), float(np.percentile(v, hi))] if len(v) else None
        out.append(row)
    return out


def exponents_with_intervals(consts: Dict[str, float], samples: Optional[np.ndarray] = None, level: float = 0.95,
                             names: Sequence[str] = ("E", "A", "B", "alpha", "beta")) -> Dict[str, object]:
    """The allocation exponents a = beta/(alpha+beta) (N_opt ~ C^a), b = alpha/(alpha+beta) and G, with intervals."""
    p = optimal_allocation(1.0, consts)
    out: Dict[str, object] = {"a": float(p["a"]), "b": float(p["b"]), "G": float(p["G"])}
    if samples is not None and len(samples):
        lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
        boot = [optimal_allocation(1.0, dict(zip(names, s))) for s in samples]
        for k in ("a", "b", "G"):
            v = np.array([float(b[k]) for b in boot])
            v = v[np.isfinite(v)]
            out[k + "_ci"] = [float(np.percentile(v, lo)), float(np.percentile(v, hi))] if len(v) else None
    return out
