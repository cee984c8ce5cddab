"""Chinchilla approach 2: IsoFLOP profiles.

For each FLOP budget C, the final losses of the runs trained with C FLOPs at different sizes N are
fitted with a parabola in ln N; its vertex is the compute-optimal size N*(C) and loss L*(C), and
D*(C) = C / (6 N*(C)). Power laws N* = k_N C^a and D* = k_D C^b are then fitted to the vertices
by least squares in log-log space (Hoffmann et al. 2022, section 3.2: a = 0.49, b = 0.51).

Units: C FLOPs, N parameters, D tokens, L nats per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np


def fit_parabola(x, y) -> np.ndarray:
    """Least-squares y = p0 x^2 + p1 x + p2; returns (p0, p1, p2). x, y of shape (points >= 3,)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(x)) < 3:
        raise ValueError(f"a parabola needs at least 3 distinct x, got {len(np.unique(x))}")
    return np.polyfit(x, y, 2)


def parabola_vertex(p) -> tuple:
    """(x*, y*) of y = p0 x^2 + p1 x + p2; raises ValueError unless p0 > 0 (a minimum)."""
    p0, p1, p2 = (float(v) for v in p)
    if p0 <= 0:
        raise ValueError("the parabola opens downward: no minimum")
    x = -p1 / (2 * p0)
    return x, p0 * x * x + p1 * x + p2


def power_law_fit(x, y) -> tuple:
    """(k, a) of y = k x^a by least squares on log y = log k + a log x; x, y of shape (points >= 2,)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        raise ValueError("a power law needs at least 2 points")
    a, logk = np.polyfit(np.log(x), np.log(y), 1)
    return float(np.exp(logk)), float(a)


@dataclass
class IsoFLOPResult:
    """Per budget: the parabola (in ln N) and its vertex; the power laws over budgets (None with
    fewer than 2 budgets that have a minimum). `skipped` says why a budget has no vertex."""

    budgets: List[Dict[str, float]] = field(default_factory=list)  # {C, N_opt, D_opt, L_opt, p0, p1, p2, runs}
    skipped: Dict[str, str] = field(default_factory=dict)
    n_opt_law: Optional[Dict[str, float]] = None  # {"k": k, "a": a}: N* = k C^a
    d_opt_law: Optional[Dict[str, float]] = None  # {"k": k, "b": b}: D* = k C^b

    def to_dict(self) -> dict:
        return {"budgets": self.budgets, "skipped": self.skipped, "N_opt": self.n_opt_law, "D_opt": self.d_opt_law}


def isoflop_analysis(n, loss, budget) -> IsoFLOPResult:
    """Approach 2 on runs with sizes `n`, final losses `loss` and FLOP budgets `budget` (the
    budget each run was planned for; runs of one budget share the value), shapes (runs,)."""
    n, loss, budget = (np.asarray(v, dtype=float) for v in (n, loss, budget))
    out = IsoFLOPResult()
    for c in np.unique(budget):
        sel = budget == c
        key = f"{c:.3g}"
        if len(np.unique(n[sel])) < 3:
            out.skipped[key] = f"{int(sel.sum())} run(s), a parabola needs 3 sizes"
            continue
        p = fit_parabola(np.log(n[sel]), loss[sel])
        try:
            x, l_opt = parabola_vertex(p)
        except ValueError as e:
            out.skipped[key] = str(e)
            continue
        n_opt = float(np.exp(x))
        out.budgets.append(dict(C=float(c), N_opt=n_opt, D_opt=float(c / (6 * n_opt)), L_opt=float(l_opt),
                                p0=float(p[0]), p1=float(p[1]), p2=float(p[2]), runs=int(sel.sum()),
                                inside=bool(n[sel].min() <= n_opt <= n[sel].max())))
    if len(out.budgets) >= 2:
        cs = [b["C"] for b in out.budgets]
        k, a = power_law_fit(cs, [b["N_opt"] for b in out.budgets])
        out.n_opt_law = {"k": k, "a": a}
        k, b = power_law_fit(cs, [b["D_opt"] for b in out.budgets])
        out.d_opt_law = {"k": k, "b": b}
    return out
