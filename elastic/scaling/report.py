"""Fit a ladder's cell records and write fit.json and the plots (pure numpy/scipy/matplotlib).

A record is a dict with at least `name`, `N` (parameters), `D` (tokens), `C` (FLOPs), `budget`
(the planned FLOP budget or token count of its group) and `val_loss` (nats per token): what
elastic/launch/ladder.py writes per finished cell.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from elastic.scaling.fit import BESIROGLU, CHINCHILLA, NAMES, bootstrap_fit, fit_scaling_law, predict_loss
from elastic.scaling.isoflop import isoflop_analysis
from elastic.scaling.optimal import exponents_with_intervals, optimal_with_intervals

LOSS_KEY = "val_loss"


def _arrays(recs: Sequence[dict]):
    return (np.array([r["N"] for r in recs], float), np.array([r["D"] for r in recs], float),
            np.array([r[LOSS_KEY] for r in recs], float))


def approach3(recs: Sequence[dict], resamples: int, level: float, seed: int):
    n, d, loss = _arrays(recs)
    return bootstrap_fit(n, d, loss, resamples, level, seed) if resamples > 0 else fit_scaling_law(n, d, loss)


def predictions(fit, recs: Sequence[dict], level: float) -> List[dict]:
    """Predicted vs actual loss of `recs` under `fit` (with the bootstrap's interval when present)."""
    rows = []
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    for r in recs:
        pred = float(predict_loss(r["N"], r["D"], fit.constants))
        row = {"name": r["name"], "N": r["N"], "D": r["D"], "C": r["C"], "actual": r[LOSS_KEY], "predicted": pred,
               "error": pred - r[LOSS_KEY], "rel_error": (pred - r[LOSS_KEY]) / r[LOSS_KEY]}
        if fit.samples is not None and len(fit.samples):
            boot = np.array([float(predict_loss(r["N"], r["D"], dict(zip(NAMES, s)))) for s in fit.samples])
            row["predicted_ci"] = [float(np.percentile(boot, lo)), float(np.percentile(boot, hi))]
            row["actual_inside_ci"] = bool(row["predicted_ci"][0] <= r[LOSS_KEY] <= row["predicted_ci"][1])
        rows.append(row)
    return rows


def _compute_grid(recs: Sequence[dict]) -> List[float]:
    cs = sorted({float(r["budget"]) for r in recs}) if recs else []
    top = max(r["C"] for r in recs) if recs else 1.0
    return cs + [top * 10, top * 100]


def _fit_block(fit, recs, level, mode) -> dict:
    out = fit.to_dict()
    cs = _compute_grid(recs) if mode == "isoflop" else sorted({float(r["C"]) for r in recs})[-1:] + [max(r["C"] for r in recs) * 10]
    out["optimal"] = optimal_with_intervals(cs, fit.constants, fit.samples, level)
    out["allocation_exponents"] = exponents_with_intervals(fit.constants, fit.samples, level)
    return out


def fit_ladder(recs: List[dict], held: Sequence[str], out_dir: str, mode: str = "isoflop", resamples: int = 200,
               level: float = 0.95, seed: int = 0, planned: Optional[int] = None) -> dict:
    """Approach 3 on the cells outside `held` (bootstrap intervals), its prediction of the held-out
    cells, approach 3 on all cells, approach 2 (isoflop mode), the optimal allocation; writes
    <out_dir>/fit.json and <out_dir>/plots/*.png. Returns fit.json's content plus "console" lines."""
    recs = [r for r in recs if r.get(LOSS_KEY) is not None and np.isfinite(r[LOSS_KEY])]
    fit_recs = [r for r in recs if r["name"] not in held]
    held_recs = [r for r in recs if r["name"] in held]
    res: Dict[str, object] = {
        "fitted_loss": "val_loss: held-out validation loss (nats/token) at each cell's last step",
        "model": "L(N, D) = E + A / N^alpha + B / D^beta; N = flops_per_token(args, 0) / 6, D = tokens trained",
        "method": "approach 3: LSE parameterisation, Huber delta 1e-3 on log loss, L-BFGS-B from a grid; "
                  f"{resamples} bootstrap resamples of the runs, {level:.0%} percentile intervals",
        "reference": {"chinchilla": CHINCHILLA, "besiroglu_2024": BESIROGLU},
        "cells": {"planned": planned, "finished": len(recs), "fit": [r["name"] for r in fit_recs],
                  "held_out": [r["name"] for r in held_recs], "held_out_planned": list(held)},
    }
    console: List[str] = []
    os.makedirs(out_dir, exist_ok=True)
    if len(fit_recs) < 2:
        res["note"] = f"{len(fit_recs)} finished cell(s) outside the held-out set: too few to fit"
        console.append(f"[ladder] fit: {res['note']}")
        _dump(os.path.join(out_dir, "fit.json"), res)
        res["console"] = console
        return res
    if len(fit_recs) < 5:
        res["note"] = f"{len(fit_recs)} cells for 5 constants: the fit is underdetermined (smoke-sized)"
    f3 = approach3(fit_recs, resamples, level, seed)
    res["approach3"] = _fit_block(f3, fit_recs, level, mode)
    res["approach3"]["residuals"] = predictions(f3, fit_recs, level)
    if held_recs:
        rows = predictions(f3, held_recs, level)
        err = np.array([r["rel_error"] for r in rows])
        res["heldout"] = {"cells": rows, "mean_abs_rel_error": float(np.mean(np.abs(err))),
                          "max_abs_rel_error": float(np.max(np.abs(err))),
                          "mean_abs_error": float(np.mean(np.abs([r["error"] for r in rows])))}
        fall = approach3(recs, resamples, level, seed + 1)
        res["approach3_all_cells"] = _fit_block(fall, recs, level, mode)
    iso = None
    if mode == "isoflop":
        n, _, loss = _arrays(fit_recs)
        iso = isoflop_analysis(n, loss, [r["budget"] for r in fit_recs])
        res["approach2"] = iso.to_dict()
        if held_recs:
            n, _, loss = _arrays(recs)
            res["approach2_all_cells"] = isoflop_analysis(n, loss, [r["budget"] for r in recs]).to_dict()
    try:
        from elastic.scaling import plots

        res["plots"] = plots.write_all(out_dir, recs, held, f3, iso, res)
    except Exception as e:  # a figure must never lose the fit
        res["plots_error"] = f"{type(e).__name__}: {e}"
    _dump(os.path.join(out_dir, "fit.json"), res)

    c, iv = f3.constants, f3.intervals

    def ci(k):
        return f" [{iv[k][0]:.3g}, {iv[k][1]:.3g}]" if k in iv else ""

    console.append(f"[ladder] approach 3 on {len(fit_recs)} cells: E {c['E']:.3g}{ci('E')}, A {c['A']:.3g}{ci('A')}, "
                   f"B {c['B']:.3g}{ci('B')}, alpha {c['alpha']:.3g}{ci('alpha')}, beta {c['beta']:.3g}{ci('beta')}")
    if f3.at_bound():
        console.append(f"[ladder] note: {', '.join(f3.at_bound())} ended on the fit's bound (not determined by these cells)")
    ex = res["approach3"]["allocation_exponents"]
    opt = res["approach3"]["optimal"][-1]
    console.append(f"[ladder] compute-optimal: N* ~ C^{ex['a']:.3g}, D* ~ C^{ex['b']:.3g}; at C {opt['C']:.3g}: "
                   f"N* {opt['N_opt']:.3g}, D* {opt['D_opt']:.3g}, {opt['tokens_per_param']:.3g} tokens/param")
    if iso is not None and iso.n_opt_law:
        console.append(f"[ladder] approach 2 (IsoFLOP minima of {len(iso.budgets)} budgets): N* ~ C^{iso.n_opt_law['a']:.3g}, "
                       f"D* ~ C^{iso.d_opt_law['b']:.3g}")
    if held_recs:
        h = res["heldout"]
        console.append(f"[ladder] held out {len(held_recs)} cell(s): predicted vs actual val_loss, mean |error| "
                       f"{h['mean_abs_rel_error']:.2%} (max {h['max_abs_rel_error']:.2%})")
    console.append(f"[ladder] fit: {os.path.join(out_dir, 'fit.json')}  plots: {os.path.join(out_dir, 'plots')}")
    res["console"] = console
    return res


def _default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(type(o).__name__)


def _dump(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({k: v for k, v in obj.items() if k != "console"}, f, indent=2, default=_default)
    os.replace(tmp, path)
