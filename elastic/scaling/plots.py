"""Ladder figures (matplotlib, Agg backend): PNG files under <ladder dir>/plots/.

- loss_vs_flops.png: final val loss vs training FLOPs, one colour per model size, with the
  approach-3 curve L(N, C / (6N)) of each size; held-out cells drawn hollow.
- isoflop.png: loss vs N per FLOP budget with the approach-2 parabolas and their minima.
- frontier.png: compute-optimal N*(C) from approach 3 (with its bootstrap band) and approach 2.
- predicted_vs_actual.png: approach-3 prediction vs measured loss, fitted and held-out cells.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from elastic.scaling.fit import NAMES, predict_loss
from elastic.scaling.optimal import optimal_allocation


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, ax, path: str, xlabel: str, ylabel: str, title: str, xlog: bool = True, ylog: bool = False) -> str:
    """The part every ladder plot shares: axes, labels, legend, save at 110 dpi, close."""
    if xlog:
        ax.set_xscale("log")
    if ylog:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_vs_flops(path: str, recs: Sequence[dict], held: Sequence[str], consts: Dict[str, float]) -> str:
    """Loss vs FLOPs per model size (x: C FLOPs, log; y: val loss nats/token) with fitted curves."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = sorted({r["N"] for r in recs})
    cmap = plt.get_cmap("viridis")
    for i, n in enumerate(sizes):
        col = cmap(i / max(1, len(sizes) - 1))
        rs = sorted([r for r in recs if r["N"] == n], key=lambda r: r["C"])
        fpt = rs[0]["C"] / rs[0]["D"]  # FLOPs per token of this size
        for r in rs:
            ax.scatter(r["C"], r["val_loss"], color=col, facecolors="none" if r["name"] in held else col, s=36, zorder=3)
        cs = np.geomspace(min(r["C"] for r in recs) / 2, max(r["C"] for r in recs) * 2, 100)
        ax.plot(cs, predict_loss(n, cs / fpt, consts), color=col, lw=1, label=f"N {n:.3g}")
    return _finish(plt, fig, ax, path, "training FLOPs C", "held-out val loss (nats/token)",
                   "loss vs compute per model size; lines: approach-3 fit (hollow: held out)")


def isoflop_plot(path: str, recs: Sequence[dict], iso, held: Sequence[str] = ()) -> str:
    """Loss vs N per FLOP budget, with the parabolas in ln N and their minima (approach 2);
    budgets of held-out cells are drawn hollow, without a parabola (they are not fitted)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    budgets = sorted({r["budget"] for r in recs})
    cmap = plt.get_cmap("plasma")
    fitted = {float(b["C"]): b for b in (iso.budgets if iso else [])}
    for i, c in enumerate(budgets):
        col = cmap(i / max(1, len(budgets)))
        rs = [r for r in recs if r["budget"] == c]
        out = all(r["name"] in held for r in rs)
        ax.scatter([r["N"] for r in rs], [r["val_loss"] for r in rs], color=col, s=30, zorder=3,
                   facecolors="none" if out else col, label=f"C {c:.3g}" + (" (held out)" if out else ""))
        b = fitted.get(float(c))
        if b:
            ns = np.geomspace(min(r["N"] for r in rs) / 1.5, max(r["N"] for r in rs) * 1.5, 100)
            x = np.log(ns)
            ax.plot(ns, b["p0"] * x * x + b["p1"] * x + b["p2"], color=col, lw=1)
            ax.scatter([b["N_opt"]], [b["L_opt"]], marker="*", s=120, color=col, edgecolors="k", zorder=4)
    return _finish(plt, fig, ax, path, "parameters N", "held-out val loss (nats/token)",
                   "IsoFLOP profiles (approach 2): parabola in ln N per budget, * = minimum")


def frontier_plot(path: str, recs: Sequence[dict], fit, iso, level: float = 0.95) -> str:
    """Compute-optimal N*(C): approach 3 (line, bootstrap band) and approach 2 minima/law (points)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cmin, cmax = min(r["C"] for r in recs) / 3, max(r["C"] for r in recs) * 100
    cs = np.geomspace(cmin, cmax, 100)
    ax.plot(cs, optimal_allocation(cs, fit.constants)["N_opt"], color="C0", label="approach 3: N*(C)")
    if fit.samples is not None and len(fit.samples):
        boot = np.array([optimal_allocation(cs, dict(zip(NAMES, s)))["N_opt"] for s in fit.samples])
        lo, hi = np.nanpercentile(boot, [100 * (1 - level) / 2, 100 * (1 + level) / 2], axis=0)
        ax.fill_between(cs, lo, hi, color="C0", alpha=0.2, label=f"approach 3, {level:.0%} bootstrap")
    if iso is not None and iso.budgets:
        ax.scatter([b["C"] for b in iso.budgets], [b["N_opt"] for b in iso.budgets], color="C3", zorder=3,
                   label="approach 2: IsoFLOP minima")
        if iso.n_opt_law:
            ax.plot(cs, iso.n_opt_law["k"] * cs ** iso.n_opt_law["a"], color="C3", ls="--", lw=1,
                    label=f"approach 2: N* ~ C^{iso.n_opt_law['a']:.2f}")
    ax.scatter([r["C"] for r in recs], [r["N"] for r in recs], color="0.6", s=12, label="cells")
    ax.plot(cs, np.sqrt(cs / 120.0), color="0.3", ls=":", lw=1, label="20 tokens/param (C = 120 N^2)")
    return _finish(plt, fig, ax, path, "training FLOPs C", "compute-optimal parameters N*",
                   "compute-optimal frontier", ylog=True)


def predicted_vs_actual(path: str, fitted_rows: Sequence[dict], held_rows: Sequence[dict]) -> str:
    """Approach-3 predicted loss vs the measured one; held-out cells with their bootstrap interval."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 5))
    allv = [r["actual"] for r in list(fitted_rows) + list(held_rows)] + [r["predicted"] for r in list(fitted_rows) + list(held_rows)]
    lo, hi = min(allv), max(allv)
    pad = 0.05 * (hi - lo + 1e-9)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.5", lw=1)
    ax.scatter([r["actual"] for r in fitted_rows], [r["predicted"] for r in fitted_rows], color="C0", s=20, label="fitted cells")
    for r in held_rows:
        ci = r.get("predicted_ci")
        # (a poorly determined fit can put its point estimate outside its own bootstrap interval)
        yerr = [[max(0.0, r["predicted"] - ci[0])], [max(0.0, ci[1] - r["predicted"])]] if ci else None
        ax.errorbar(r["actual"], r["predicted"], yerr=yerr, fmt="o", color="C3", ms=6, capsize=3)
    if held_rows:
        ax.scatter([], [], color="C3", label="held out (predicted from the others)")
    return _finish(plt, fig, ax, path, "actual val loss", "predicted val loss",
                   "approach 3: predicted vs actual", xlog=False)


def write_all(out_dir: str, recs: Sequence[dict], held: Sequence[str], fit, iso, res: dict) -> List[str]:
    """Every figure that the data supports; returns the paths written."""
    d = os.path.join(out_dir, "plots")
    os.makedirs(d, exist_ok=True)
    level = getattr(fit, "level", 0.95)
    paths = [loss_vs_flops(os.path.join(d, "loss_vs_flops.png"), recs, held, fit.constants)]
    if iso is not None and iso.budgets:
        paths.append(isoflop_plot(os.path.join(d, "isoflop.png"), recs, iso, held))
    paths.append(frontier_plot(os.path.join(d, "frontier.png"), recs, fit, iso, level))
    held_rows = (res.get("heldout") or {}).get("cells", [])
    paths.append(predicted_vs_actual(os.path.join(d, "predicted_vs_actual.png"), res["approach3"]["residuals"], held_rows))
    return paths
