"""The report's PNG plots, one function per figure, each skipped when its data is absent.

Why matplotlib's object API (`Figure` + `savefig`) and not pyplot: no global state and no
backend switch, so rendering inside a driver, a notebook or a test never touches the caller's
matplotlib setup; PNGs are written by the Agg renderer. Long runs are averaged into at most
`MAX_POINTS` bins per series so a 1000-step report stays fast and readable.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from matplotlib.figure import Figure

from elastic.report.bottleneck import THRESHOLDS, Diagnosis
from elastic.report.run import RunData

MAX_POINTS = 300
DPI = 90
BREAKDOWN = (("data_wait_s", "data wait"), ("forward_s", "forward"), ("backward_s", "backward"),
             ("pipeline_s", "pipeline (fwd+bwd)"), ("optimizer_s", "optimizer"), ("checkpoint_s", "checkpoint"))
GRPO_BREAKDOWN = (("generate_s", "generate"), ("reward_wait_s", "reward wait"), ("logprob_s", "log-probs"),
                  ("update_s", "update"), ("checkpoint_s", "checkpoint"))


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(recs: Sequence[Dict[str, Any]], key: str, x: str = "step") -> Tuple[np.ndarray, np.ndarray]:
    pts = [(r[x], r[key]) for r in recs if _num(r.get(key)) and _num(r.get(x))]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def _binned(x: np.ndarray, y: np.ndarray, n: int = MAX_POINTS) -> Tuple[np.ndarray, np.ndarray]:
    """Means of consecutive points, at most n of them (x kept as the bin's mean)."""
    if len(x) <= n:
        return x, y
    edges = np.linspace(0, len(x), n + 1).astype(int)
    return (np.add.reduceat(x, edges[:-1]) / np.diff(edges), np.add.reduceat(y, edges[:-1]) / np.diff(edges))


def _minutes(run: RunData, recs: Sequence[Dict[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
    t, y = _series(recs, key, "time")
    return (t - (run.t0 or 0.0)) / 60.0, y


def _save(fig: Figure, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path + ".tmp", dpi=DPI, format="png")
    os.replace(path + ".tmp", path)  # a viewer of a live run's report never sees half a PNG
    return path


def restart_marks(run: RunData) -> List[Tuple[float, str]]:
    """(minutes since the run's start, "failure" | "resize") of each controller decision that
    changed a running worker group. The controller's first resize decision after it starts
    (the initial scheduling of the worker group, before its `start`: -0.1 min on the default
    run) is no resize and is not marked; nor is a relaunched driver's."""
    marks: List[Tuple[float, str]] = []
    running = False  # a worker group has started since the (latest) controller started
    evs = sorted((e for e in run.events if _num(e.get("time"))), key=lambda e: e["time"])
    for e in evs:
        kind = e.get("event")
        if kind == "controller_state" and e.get("from") == "InitializingState":
            running = False
        elif kind == "start":
            running = True
        elif kind == "failure_decision" or (kind == "resize_decision" and running):
            marks.append(((e["time"] - (run.t0 or 0.0)) / 60.0, "failure" if kind == "failure_decision" else "resize"))
    return marks


def _mark_restarts(ax, run: RunData, in_minutes: bool) -> None:
    """Vertical lines where the controller decided a failure or a resize (restart_marks)."""
    if not in_minutes:
        return
    for t, kind in restart_marks(run):
        ax.axvline(t, color="tab:red" if kind == "failure" else "tab:blue", ls="--", lw=0.8, alpha=0.7)


def plot_loss(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    steps = run.steps
    x, y = _series(steps, "loss")
    if not len(x):
        return None
    fig = Figure(figsize=(11, 7))
    a, b, c, d = fig.subplots(2, 2).ravel()
    a.plot(*_binned(x, y), lw=1, label="train loss")
    vx, vy = _series(steps, "val_loss")
    if not len(vx):
        vx, vy = _series([e for e in run.events if e.get("event") == "eval"], "val_loss")
    if len(vx):
        a.plot(vx, vy, "o-", ms=4, color="tab:orange", label="validation loss")
    a.set(xlabel="step", ylabel="loss", title="loss vs step")
    a.legend(loc="upper right")
    tx, ty = _minutes(run, run.metrics, "loss")
    b.plot(*_binned(tx, ty), lw=1, label="train loss (every completion)")
    tvx, tvy = _minutes(run, [r for r in run.metrics if _num(r.get("val_loss"))], "val_loss")
    if len(tvx):
        b.plot(tvx, tvy, "o-", ms=4, color="tab:orange", label="validation loss")
    _mark_restarts(b, run, True)
    b.set(xlabel="wall time (min)", ylabel="loss", title="loss vs wall time (dashed: failure / resize decision)")
    b.legend(loc="upper right")
    gx, gy = _series(steps, "grad_norm")
    if len(gx):
        c.plot(*_binned(gx, gy), lw=1, color="tab:green")
        if np.all(gy > 0):
            c.set_yscale("log")
    sf = diag.figures.get("stability", {})
    marks = [(sf.get("skipped_steps", []) + sf.get("nonfinite_steps", []) + sf.get("bad_step_events", []), "tab:red", "skipped / non-finite"),
             ([s for s, _ in sf.get("loss_spikes", [])] + sf.get("loss_spike_events", []), "tab:purple", "loss spike"),
             ([s for s, _ in sf.get("grad_spikes", [])], "tab:orange", "grad-norm spike")]
    for stp, color, label in marks:
        for i, s in enumerate(sorted(set(stp))[:50]):
            c.axvline(s, color=color, lw=0.8, alpha=0.6, label=label if i == 0 else None)
    if any(m[0] for m in marks):
        c.legend(loc="upper right")
    c.set(xlabel="step", ylabel="grad norm", title="gradient norm (lines: bad steps and spikes)")
    lx, ly = _series(steps, "lr")
    if len(lx):
        d.plot(*_binned(lx, ly), lw=1, color="tab:gray")
    d.set(xlabel="step", ylabel="learning rate", title="learning rate")
    return _save(fig, out_dir, "loss.png")


def plot_throughput(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    x, y = _series(run.steps, "tokens_per_s")
    mx, my = _series(run.steps, "mfu")
    if not len(x) and not len(mx):
        return None
    fig = Figure(figsize=(11, 6))
    a, b = fig.subplots(2, 1, sharex=True)
    if len(x):
        a.plot(x, y, lw=0.5, alpha=0.4, color="tab:blue")
        a.plot(*_binned(x, y, 100), lw=1.5, color="tab:blue", label="tokens/s (binned mean)")
        a.legend(loc="lower right")
    a.set(ylabel="tokens/s (real tokens)", title="throughput")
    if len(mx):
        b.plot(mx, my * 100, lw=0.5, alpha=0.4, color="tab:green")
        b.plot(*_binned(mx, my * 100, 100), lw=1.5, color="tab:green")
    nominal = "" if diag.device.startswith("cuda") else f" (nominal on {diag.device}: relative figure only)"
    b.set(xlabel="step", ylabel="MFU (%)", title="model FLOPs utilisation" + nominal)
    return _save(fig, out_dir, "throughput.png")


def plot_step_time(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    recs = run.steps
    parts = GRPO_BREAKDOWN if any(_num(r.get("generate_s")) for r in recs) else BREAKDOWN
    sx, sy = _series(recs, "step_s")
    if not len(sx):
        return None
    have = [(k, lab) for k, lab in parts if any(_num(r.get(k)) for r in recs)]
    stacks = [np.array([r.get(k) if _num(r.get(k)) else 0.0 for r in recs if _num(r.get("step_s"))]) for k, _ in have]
    other = np.clip(sy - (np.sum(stacks, axis=0) if stacks else 0.0), 0.0, None)
    fig = Figure(figsize=(11, 4.5))
    ax = fig.subplots()
    bx = _binned(sx, sy)[0]
    ys = [_binned(sx, s)[1] for s in stacks] + [_binned(sx, other)[1]]
    labels = [lab for _, lab in have] + ["other" if have else "step (not broken down)"]
    ax.stackplot(bx, *ys, labels=labels, alpha=0.85)
    cx, cy = _series(recs, "comm_s")
    if len(cx):
        ax.plot(cx, cy, "k.", ms=4, label="exposed comm (profiled steps; inside fwd/bwd)")
    ax.set(xlabel="step", ylabel="seconds", title=f"step time breakdown — bottleneck: {diag.name}")
    ax.set_ylim(0, float(np.max(_binned(sx, sy)[1])) * 1.35)  # room for the legend
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    return _save(fig, out_dir, "step_time.png")


def plot_memory(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    keys = [("max_mem_gib", "peak allocated"), ("max_reserved_gib", "peak reserved"), ("peak_rss_gib", "worker peak RSS")]
    have = [(k, lab) for k, lab in keys if any(_num(r.get(k)) for r in run.steps)]
    if not have:
        return None
    fig = Figure(figsize=(11, 4))
    ax = fig.subplots()
    for k, lab in have:
        ax.plot(*_binned(*_series(run.steps, k)), lw=1.2, label=lab)
    dev = diag.figures.get("device_mem_gib")
    if _num(dev):
        ax.axhline(dev, color="k", lw=1, label="device memory")
        ax.axhline(dev * THRESHOLDS["memory"], color="tab:red", ls="--", lw=0.8, label=f"{THRESHOLDS['memory']:.0%} (memory threshold)")
    ax.set(xlabel="step", ylabel="GiB", title="memory (peaks so far)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    return _save(fig, out_dir, "memory.png")


def plot_timeline(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    tw, w = _minutes(run, run.metrics, "world_size")
    starts = [e for e in run.events if e.get("event") == "start" and _num(e.get("time")) and _num(e.get("world_size"))]
    if not len(tw) and not starts:
        return None
    t0 = run.t0 or 0.0
    pts = sorted([(float(a), float(b)) for a, b in zip(tw, w)] + [((e["time"] - t0) / 60.0, float(e["world_size"])) for e in starts])
    fig = Figure(figsize=(11, 6))
    a, b = fig.subplots(2, 1, sharex=True)
    a.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="tab:blue", label="world size")
    for r in (run.recovery or {}).get("restarts", []):
        if _num(r.get("decision_time")) and _num(r.get("recovery_s")):
            s = (r["decision_time"] - t0) / 60.0
            a.axvspan(s, s + r["recovery_s"] / 60.0, color="tab:red" if r.get("cause") == "failure" else "tab:cyan", alpha=0.25)
    _mark_restarts(a, run, True)
    for e in run.events:
        if e.get("event") == "controller_state" and e.get("to") in ("ErroredState", "AbortedState") and _num(e.get("time")):
            a.axvline((e["time"] - t0) / 60.0, color="k", lw=2, label="controller errored")
    a.set(ylabel="workers", title="restarts and resizes (shaded: decision → first step after restart)")
    a.set_ylim(0, max(p[1] for p in pts) + 1)
    a.legend(loc="lower right")
    sx, sy = _minutes(run, run.metrics, "step")
    b.plot(sx, sy, ".", ms=2, color="tab:gray", label="step completed")
    b.set(xlabel="wall time (min)", ylabel="step")
    gx, gy = _minutes(run, run.metrics, "goodput")
    if len(gx):
        g = b.twinx()
        g.plot(gx, gy * 100, color="tab:green", lw=1.2, label="goodput (live)")
        g.axhline((1 - THRESHOLDS["restarts"]) * 100, color="tab:green", ls=":", lw=0.8)
        g.set(ylabel="goodput (%)", ylim=(0, 105))
        g.legend(loc="lower right")
    b.legend(loc="upper left")
    return _save(fig, out_dir, "timeline.png")


def plot_grpo(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    steps = run.steps
    if not any(_num(r.get("reward_mean")) or _num(r.get("pass_rate")) for r in steps):
        return None
    fig = Figure(figsize=(11, 7))
    a, b, c, d = fig.subplots(2, 2).ravel()
    x, y = _series(steps, "reward_mean")
    if len(x):
        a.plot(x, y, lw=1.2, label="reward mean")
        sx, sy = _series(steps, "rm_score_mean")  # reward.kind model: the reward model's own score
        if len(sx):
            a.plot(sx, sy, lw=1, color="tab:purple", label="reward-model score")
        both = [r for r in steps if _num(r.get("reward_mean")) and _num(r.get("reward_std"))]
        if both:
            bx, bm = _series(both, "reward_mean")
            bs = _series(both, "reward_std")[1]
            a.fill_between(bx, bm - bs, bm + bs, alpha=0.2, label="± std")
        mx, my = _series(steps, "reward_max")
        if len(mx):
            a.plot(mx, my, lw=0.8, ls="--", label="reward max")
        a.legend(loc="lower right")
    a.set(xlabel="step", ylabel="reward", title="reward")
    for k, lab in (("pass_rate", "pass rate"), ("compile_error_rate", "compile error"), ("wrong_answer_rate", "wrong answer"),
                   ("timeout_rate", "timeout"), ("heldout_pass_at_1", "held-out pass@1")):
        kx, ky = _series(steps, k)
        if k.startswith("heldout"):  # the starting policy's, measured before step 1, at step 0
            ix, iy = _series(steps, "initial_" + k)
            kx, ky = np.concatenate([ix * 0, kx]), np.concatenate([iy, ky])
        if len(kx):
            b.plot(kx, ky * 100, "o-" if k.startswith("heldout") else "-", ms=3, lw=1, label=lab)
    b.set(xlabel="step", ylabel="%", title="pass rate and failure kinds")
    b.legend(loc="best", fontsize=8)
    kx, ky = _series(steps, "kl")
    if len(kx):
        c.plot(kx, ky, lw=1, color="tab:red", label="KL to reference (per token)")
    px, py = _series(steps, "kl_coef")  # PPO: the controller's coefficient of the KL in the reward
    if len(px):
        c2 = c.twinx()
        c2.plot(px, py, lw=1, ls="--", color="tab:gray", label="kl_coef (PPO)")
        c2.set_ylabel("kl_coef")
    c.set(xlabel="step", ylabel="KL to reference", title="KL")
    for k, lab in (("entropy", "entropy"), ("clip_frac_low", "clip frac low"), ("clip_frac_high", "clip frac high"),
                   ("zero_var_frac", "zero-variance groups"), ("value_loss", "value loss (PPO)"),
                   ("explained_variance", "critic explained variance (PPO)")):
        kx, ky = _series(steps, k)
        if len(kx):
            d.plot(kx, ky, lw=1, label=lab)
    d.set(xlabel="step", title="entropy, clipping, zero-variance groups")
    if d.lines:
        d.legend(loc="best", fontsize=8)
    return _save(fig, out_dir, "grpo.png")


def plot_eval(run: RunData, out_dir: str, diag: Diagnosis) -> Optional[str]:
    """In-training task metrics (eval/<task>/<metric>) vs step: one panel per task, its
    headline metric (bits per byte for perplexity, acc_norm for multiple choice)."""
    from elastic.report.render import eval_series

    series = eval_series(run.steps)
    heads = {}
    for key in series:
        task, metric = key.rsplit("/", 1)
        if metric in ("bits_per_byte", "acc_norm"):
            heads[task] = metric
    if not heads:
        return None
    fig = Figure(figsize=(4.2 * len(heads), 3.2))
    axes = fig.subplots(1, len(heads), squeeze=False)[0]
    for ax, (task, metric) in zip(axes, sorted(heads.items())):
        pts = series[f"{task}/{metric}"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=4)
        ax.set(xlabel="step", ylabel=metric, title=f"{task} (eval.tasks)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, out_dir, "eval.png")


PLOTS: List[Tuple[str, Callable[[RunData, str, Diagnosis], Optional[str]]]] = [
    ("loss", plot_loss), ("throughput", plot_throughput), ("step_time", plot_step_time), ("memory", plot_memory),
    ("timeline", plot_timeline), ("grpo", plot_grpo), ("eval", plot_eval),
]


def write_plots(run: RunData, out_dir: str, diag: Diagnosis) -> Dict[str, str]:
    """{plot name: PNG path} for every plot the run has data for. A plot that fails (records
    of a shape nobody foresaw) becomes a line in `run.notes`: the report of a crashed run must
    still be written."""
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for name, fn in PLOTS:
        try:
            path = fn(run, out_dir, diag)
        except Exception as e:  # noqa: BLE001  one bad figure must not cost the whole report
            run.notes.append(f"plot {name} failed: {type(e).__name__}: {e}")
            continue
        if path:
            out[name] = path
    return out
