"""elastic/scaling: approach 3 recovers known constants, approach 2 finds IsoFLOP minima, the
optimal allocation and the Huber loss match hand-computed values (pure numpy/scipy, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elastic.scaling import (CHINCHILLA, bootstrap_fit, fit_parabola, fit_scaling_law, huber, isoflop_analysis,
                             optimal_allocation, optimal_with_intervals, power_law_fit, predict_loss)
from elastic.scaling.fit import NAMES, grid_starts, objective


def synthetic(consts, noise=0.005, seed=0):
    """Chinchilla-style grid: N in 1e6..1e9, D in 1e8..1e11 (6 x 6 runs), log-normal noise on L."""
    n, d = np.meshgrid(np.geomspace(1e6, 1e9, 6), np.geomspace(1e8, 1e11, 6))
    n, d = n.ravel(), d.ravel()
    rng = np.random.default_rng(seed)
    loss = predict_loss(n, d, consts) * np.exp(noise * rng.standard_normal(n.shape))
    return n, d, loss


def test_huber_by_hand():
    d = 1e-3
    # quadratic inside delta, linear outside, continuous at delta
    assert huber(np.array([0.0]), d)[0] == 0.0
    assert huber(np.array([5e-4]), d)[0] == pytest.approx(0.5 * 5e-4 ** 2)
    assert huber(np.array([-5e-4]), d)[0] == pytest.approx(1.25e-7)
    assert huber(np.array([1e-3]), d)[0] == pytest.approx(5e-7)
    assert huber(np.array([3e-3]), d)[0] == pytest.approx(1e-3 * (3e-3 - 5e-4))  # 2.5e-6
    assert huber(np.array([-0.1]), d)[0] == pytest.approx(1e-3 * 0.0995)


def test_objective_gradient_matches_finite_differences():
    n, d, loss = synthetic(CHINCHILLA, noise=0.01)
    args = (np.log(n), np.log(d), np.log(loss))
    theta = np.array([0.3, 6.2, 6.0, 0.4, 0.3])
    _, g = objective(theta, *args)
    eps = 1e-6
    for i in range(5):
        e = np.zeros(5)
        e[i] = eps
        fd = (objective(theta + e, *args)[0] - objective(theta - e, *args)[0]) / (2 * eps)
        assert g[i] == pytest.approx(fd, rel=1e-4, abs=1e-8)


def test_exact_data_recovers_constants():
    n, d, loss = synthetic(CHINCHILLA, noise=0.0)
    fit = fit_scaling_law(n, d, loss)
    for k in NAMES:
        assert fit.constants[k] == pytest.approx(CHINCHILLA[k], rel=1e-3), k


def test_bootstrap_intervals_contain_true_constants():
    n, d, loss = synthetic(CHINCHILLA, noise=0.005, seed=1)
    fit = bootstrap_fit(n, d, loss, resamples=40, level=0.95, seed=0)
    assert fit.samples.shape == (40, 5)
    for k in NAMES:
        lo, hi = fit.intervals[k]
        assert lo <= CHINCHILLA[k] <= hi, f"{k}: true {CHINCHILLA[k]} outside [{lo}, {hi}]"
        assert lo <= fit.constants[k] <= hi
    # and the point estimates are close
    assert fit.constants["alpha"] == pytest.approx(0.34, abs=0.05)
    assert fit.constants["beta"] == pytest.approx(0.28, abs=0.05)
    assert fit.constants["E"] == pytest.approx(1.69, abs=0.1)


def test_grid_is_the_published_one():
    assert grid_starts().shape == (5 * 6 * 6 * 5 * 5, 5)


def test_optimal_allocation_by_hand():
    c = CHINCHILLA
    al, be, A, B = c["alpha"], c["beta"], c["A"], c["B"]
    g = (al * A / (be * B)) ** (1 / (al + be))
    C = 5.76e23  # Chinchilla's compute
    n_hand = g * (C / 6) ** (be / (al + be))
    out = optimal_allocation(C, c)
    assert float(out["N_opt"]) == pytest.approx(n_hand, rel=1e-12)
    assert float(out["D_opt"]) == pytest.approx(C / (6 * n_hand), rel=1e-12)
    assert float(out["tokens_per_param"]) == pytest.approx(C / (6 * n_hand ** 2), rel=1e-12)
    assert out["a"] == pytest.approx(0.28 / 0.62) and out["b"] == pytest.approx(0.34 / 0.62)
    # hand value: G = (0.34*406.4/(0.28*410.7))^(1/0.62) = 1.2023^1.6129 ~ 1.346
    assert out["G"] == pytest.approx(1.3465, rel=2e-3)
    # at the optimum, dL/dN along C = 6ND is zero: L(N_opt) is below L at 0.8x and 1.25x
    lf = lambda nn: float(predict_loss(nn, C / (6 * nn), c))  # noqa: E731
    assert lf(n_hand) < lf(0.8 * n_hand) and lf(n_hand) < lf(1.25 * n_hand)
    # alpha = beta = 1/2: A N^-1/2 + B (K/N)^-1/2 with K = C/6 is least at N = (A/B) sqrt(K)
    eq = dict(E=1.0, A=100.0, B=400.0, alpha=0.5, beta=0.5)
    assert float(optimal_allocation(6e12, eq)["N_opt"]) == pytest.approx(0.25 * math.sqrt(1e12))


def test_optimal_intervals_from_samples():
    samples = np.array([[CHINCHILLA[k] * (1 + 0.01 * s) for k in NAMES] for s in (-1, 0, 1)])
    rows = optimal_with_intervals([1e21, 1e22], CHINCHILLA, samples)
    for r in rows:
        lo, hi = r["N_opt_ci"]
        assert lo <= r["N_opt"] * 1.05 and hi >= r["N_opt"] * 0.95
        assert r["tokens_per_param"] == pytest.approx(r["D_opt"] / r["N_opt"])


def test_parabola_and_power_law():
    x = np.array([-2.0, -1.0, 0.0, 1.0, 3.0])
    p = fit_parabola(x, 2 * (x - 0.5) ** 2 + 3)
    assert p == pytest.approx([2.0, -2.0, 3.5])
    k, a = power_law_fit([1e2, 1e4, 1e6], [3 * 1e2 ** 0.5, 3 * 1e4 ** 0.5, 3 * 1e6 ** 0.5])
    assert k == pytest.approx(3) and a == pytest.approx(0.5)


def test_isoflop_minima_recovered():
    """Losses on IsoFLOP profiles of the Chinchilla law: the parabola minima in ln N land near
    the analytic optimum, and the fitted exponent of N*(C) near beta / (alpha + beta)."""
    c = CHINCHILLA
    budgets = [1e18, 1e19, 1e20, 1e21]
    ns, losses, bs = [], [], []
    for C in budgets:
        n_opt = float(optimal_allocation(C, c)["N_opt"])
        for f in np.geomspace(1 / 4, 4, 9):
            n = n_opt * f
            ns.append(n)
            losses.append(float(predict_loss(n, C / (6 * n), c)))
            bs.append(C)
    iso = isoflop_analysis(ns, losses, bs)
    assert len(iso.budgets) == 4 and not iso.skipped
    for b in iso.budgets:
        exact = float(optimal_allocation(b["C"], c)["N_opt"])
        assert b["N_opt"] == pytest.approx(exact, rel=0.1)
        assert b["inside"]
    assert iso.n_opt_law["a"] == pytest.approx(c["beta"] / (c["alpha"] + c["beta"]), abs=0.02)
    assert iso.n_opt_law["a"] + iso.d_opt_law["b"] == pytest.approx(1.0, abs=1e-9)


def test_isoflop_skips_budgets_without_three_sizes():
    iso = isoflop_analysis([1e6, 2e6, 1e6, 2e6, 4e6], [3.0, 2.9, 2.8, 2.7, 2.75], [1e15, 1e15, 1e16, 1e16, 1e16])
    assert "1e+15" in iso.skipped and len(iso.budgets) == 1 and iso.n_opt_law is None


def test_scaling_imports_no_ray_torch_or_other_layers():
    import subprocess
    import sys

    code = ("import sys, elastic.scaling, elastic.scaling.report, elastic.scaling.plots; "
            "bad = [m for m in ('torch', 'ray', 'elastic.model', 'elastic.launch', 'elastic.train', 'elastic.data') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fit_ladder_on_synthetic_isoflop_records(tmp_path):
    """The ladder's fit stage on records drawn from the Chinchilla law: fit.json holds approach 3
    with intervals, the held-out budget's prediction (small error), approach 2 and the plots."""
    import json

    from elastic.scaling.report import fit_ladder

    c, recs = CHINCHILLA, []
    for C in (1e18, 3e18, 1e19, 3e19):
        n_opt = float(optimal_allocation(C, c)["N_opt"])
        for f in (1 / 4, 1 / 2, 1, 2, 4):
            n = n_opt * f
            d = C / (6 * n)
            recs.append(dict(name=f"n{n:.3g}-C{C:.0e}", N=n, D=d, C=C, budget=C, val_loss=float(predict_loss(n, d, c))))
    held = [r["name"] for r in recs if r["budget"] == 3e19]
    out = fit_ladder(recs, held, str(tmp_path), mode="isoflop", resamples=10, seed=0, planned=len(recs))
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["cells"]["held_out"] == held and len(fit["cells"]["fit"]) == 15
    assert fit["approach3"]["constants"]["alpha"] == pytest.approx(0.34, abs=0.01)
    assert fit["heldout"]["mean_abs_rel_error"] < 1e-3
    assert len(fit["approach2"]["budgets"]) == 3
    assert fit["approach2"]["N_opt"]["a"] == pytest.approx(0.28 / 0.62, abs=0.03)
    assert "tokens_per_param_ci" in fit["approach3"]["optimal"][0]
    for png in ("loss_vs_flops.png", "isoflop.png", "frontier.png", "predicted_vs_actual.png"):
        assert (tmp_path / "plots" / png).exists()
    assert any("held out 5 cell(s)" in line for line in out["console"])
