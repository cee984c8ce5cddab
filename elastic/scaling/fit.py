"""Chinchilla approach 3: fit L(N, D) = E + A / N^alpha + B / D^beta to final losses of runs.

As in Hoffmann et al. 2022 (appendix D.2) and the reproduction by Besiroglu et al. 2024
("Chinchilla Scaling: A replication attempt"), the fit is done in log space:

    log L_hat(N, D) = LSE(a - alpha * log N,  b - beta * log D,  e),   A = e^a, B = e^b, E = e^e

and minimises the Huber loss (delta = 1e-3) of log L_hat - log L over the runs with L-BFGS-B,
started from a grid of initialisations (the best result wins). The published grid
(alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}: 4500 points) is
scored in one vectorised pass and L-BFGS-B runs from the `top_k` best grid points, which finds
the same optimum as running from all 4500 at a fraction of the cost.

Confidence intervals: bootstrap over runs (resample the runs with replacement, refit, take the
percentiles of every constant), as Besiroglu et al. do for their refit.

Units: N parameters, D tokens, L nats per token; arrays are 1-D of shape (runs,).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.special import logsumexp

# Published constants (nats per token, N parameters, D tokens).
CHINCHILLA = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)   # Hoffmann et al. 2022, approach 3
BESIROGLU = dict(E=1.82, A=482.0, B=2085.0, alpha=0.35, beta=0.37)   # Besiroglu et al. 2024 refit (rounded)

NAMES = ("E", "A", "B", "alpha", "beta")
HUBER_DELTA = 1e-3
# theta = (e, a, b, alpha, beta): the log-space parameterisation; E = exp(e), A = exp(a), B = exp(b).
GRID = dict(e=(-1.0, -0.5, 0.0, 0.5, 1.0), a=(0.0, 5.0, 10.0, 15.0, 20.0, 25.0), b=(0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            alpha=(0.0, 0.5, 1.0, 1.5, 2.0), beta=(0.0, 0.5, 1.0, 1.5, 2.0))
BOUNDS = [(-10.0, 10.0), (-20.0, 60.0), (-20.0, 60.0), (0.0, 4.0), (0.0, 4.0)]


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """Elementwise Huber loss: r^2 / 2 where |r| <= delta, else delta * (|r| - delta / 2)."""
    a = np.abs(np.asarray(r, dtype=float))
    return np.where(a <= delta, 0.5 * a * a, delta * (a - 0.5 * delta))


def huber_grad(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """d huber / d r: r clipped to [-delta, delta]."""
    return np.clip(r, -delta, delta)


def log_pred(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """log L_hat for theta = (e, a, b, alpha, beta); log_n, log_d of shape (runs,)."""
    e, a, b, al, be = theta
    z = np.stack([a - al * log_n, b - be * log_d, np.full_like(log_n, e)])
    return logsumexp(z, axis=0)


def objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray,
              delta: float = HUBER_DELTA) -> tuple:
    """(value, gradient) of mean Huber(log L_hat - log L) / delta (dividing by delta only rescales
    the objective, so L-BFGS-B's tolerances see numbers of order |residual|)."""
    e, a, b, al, be = theta
    z = np.stack([a - al * log_n, b - be * log_d, np.full_like(log_n, e)])  # (3, runs)
    lse = logsumexp(z, axis=0)
    r = lse - log_l
    w = np.exp(z - lse)  # softmax weights, (3, runs)
    g = huber_grad(r, delta) / (delta * len(r))
    grad = np.array([np.sum(g * w[2]), np.sum(g * w[0]), np.sum(g * w[1]),
                     -np.sum(g * w[0] * log_n), -np.sum(g * w[1] * log_d)])
    return float(np.sum(huber(r, delta)) / (delta * len(r))), grad


def grid_starts(grid: Optional[Dict[str, Sequence[float]]] = None) -> np.ndarray:
    """The initialisation grid as an array of shape (points, 5) in theta order."""
    g = grid or GRID
    return np.array(list(itertools.product(g["e"], g["a"], g["b"], g["alpha"], g["beta"])), dtype=float)


def grid_scores(starts: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray,
                delta: float = HUBER_DELTA) -> np.ndarray:
    """Objective at every start (shape (points,)), vectorised over the grid."""
    e, a, b, al, be = (starts[:, i:i + 1] for i in range(5))
    z = np.stack([a - al * log_n[None], b - be * log_d[None], np.broadcast_to(e, (len(starts), len(log_n)))])
    r = logsumexp(z, axis=0) - log_l[None]
    return huber(r, delta).mean(axis=1) / delta


def _lbfgs(theta0: np.ndarray, args: tuple) -> tuple:
    res = minimize(objective, theta0, args=args, jac=True, method="L-BFGS-B", bounds=BOUNDS,
                   options=dict(maxiter=2000, ftol=1e-15, gtol=1e-12))
    return res.fun, res.x


def fit_theta(log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, starts: np.ndarray, top_k: int = 8,
              delta: float = HUBER_DELTA) -> tuple:
    """(objective, theta) of the best L-BFGS-B run from the `top_k` best-scoring `starts`."""
    args = (log_n, log_d, log_l, delta)
    order = np.argsort(grid_scores(starts, *args))[:top_k]
    best = (np.inf, None)
    for i in order:
        f, x = _lbfgs(starts[i], args)
        if np.isfinite(f) and f < best[0]:
            best = (f, x)
    return best


def constants(theta: np.ndarray) -> Dict[str, float]:
    """{E, A, B, alpha, beta} from theta = (e, a, b, alpha, beta)."""
    e, a, b, al, be = (float(v) for v in theta)
    return dict(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=al, beta=be)


def predict_loss(n, d, c: Dict[str, float]) -> np.ndarray:
    """L(N, D) = E + A / N^alpha + B / D^beta, elementwise (nats per token)."""
    n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
    return c["E"] + c["A"] / n ** c["alpha"] + c["B"] / d ** c["beta"]


@dataclass
class ScalingFit:
    """The approach-3 fit: constants, the objective at the optimum, and (after bootstrap) the
    per-resample constants (`samples`, shape (resamples, 5) in NAMES order) and the intervals."""

    constants: Dict[str, float]
    objective: float
    n_runs: int
    theta: List[float]
    samples: Optional[np.ndarray] = None
    level: float = 0.95
    intervals: Dict[str, List[float]] = field(default_factory=dict)

    def at_bound(self) -> List[str]:
        """Constants whose log-space parameter ended on a bound of BOUNDS (the data did not pin
        them down: read their values and intervals as "unconstrained")."""
        return [k for k, v, (lo, hi) in zip(NAMES, self.theta, BOUNDS) if min(abs(v - lo), abs(v - hi)) < 1e-6]

    def to_dict(self) -> dict:
        out = {"constants": self.constants, "objective": self.objective, "runs": self.n_runs,
               "huber_delta": HUBER_DELTA, "level": self.level, "intervals": self.intervals,
               "at_bound": self.at_bound()}
        if self.samples is not None:
            out["bootstrap_resamples"] = int(len(self.samples))
        return out


def fit_scaling_law(n, d, loss, grid: Optional[Dict[str, Sequence[float]]] = None, top_k: int = 8,
                    delta: float = HUBER_DELTA) -> ScalingFit:
    """Approach 3 on runs with parameters `n`, tokens `d`, final loss `loss` (arrays of shape (runs,))."""
    n, d, loss = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if not (n.shape == d.shape == loss.shape) or n.ndim != 1 or len(n) < 1:
        raise ValueError(f"n, d, loss must be 1-D arrays of one length, got shapes {n.shape}, {d.shape}, {loss.shape}")
    if np.any(n <= 0) or np.any(d <= 0) or np.any(loss <= 0):
        raise ValueError("n, d and loss must be positive")
    f, theta = fit_theta(np.log(n), np.log(d), np.log(loss), grid_starts(grid), top_k, delta)
    return ScalingFit(constants(theta), float(f), len(n), [float(v) for v in theta])


def bootstrap_fit(n, d, loss, resamples: int = 200, level: float = 0.95, seed: int = 0,
                  grid: Optional[Dict[str, Sequence[float]]] = None, top_k: int = 8, boot_top_k: int = 2,
                  delta: float = HUBER_DELTA) -> ScalingFit:
    """fit_scaling_law plus bootstrap intervals: `resamples` times, draw the runs with replacement,
    refit (from the full fit's optimum and the `boot_top_k` best grid points for that resample),
    and take the (1-level)/2 and (1+level)/2 percentiles of each constant."""
    n, d, loss = (np.asarray(v, dtype=float) for v in (n, d, loss))
    full = fit_scaling_law(n, d, loss, grid, top_k, delta)
    starts = grid_starts(grid)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(resamples):
        idx = rng.integers(0, len(n), len(n))
        ln, ld, ll = np.log(n[idx]), np.log(d[idx]), np.log(loss[idx])
        order = np.argsort(grid_scores(starts, ln, ld, ll, delta))[:boot_top_k]
        cands = [np.array(full.theta)] + [starts[i] for i in order]
        best = min((_lbfgs(s, (ln, ld, ll, delta)) for s in cands), key=lambda t: t[0])
        c = constants(best[1])
        samples.append([c[k] for k in NAMES])
    full.samples = np.array(samples)
    full.level = level
    full.intervals = percentile_intervals(full.samples, NAMES, level)
    return full


def percentile_intervals(samples: np.ndarray, names: Sequence[str], level: float = 0.95) -> Dict[str, List[float]]:
    """{name: [lo, hi]}: the percentile interval of each column of `samples` (shape (resamples, len(names)))."""
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    return {k: [float(np.percentile(samples[:, i], lo)), float(np.percentile(samples[:, i], hi))]
            for i, k in enumerate(names)}
