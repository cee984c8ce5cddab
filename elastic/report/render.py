"""report.md: a summary table that states the named bottleneck, then the evidence behind it.

Why markdown: it reads as plain text in a terminal or a log, renders with its plots on GitHub,
in VS Code and in wandb's file viewer, and needs nothing to produce. Every figure says what it
is computed over; missing figures read "n/a" rather than disappearing, so an older or crashed
run's report still has the same shape.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from elastic.report.bottleneck import BREAKDOWN_KEYS, Diagnosis, measures
from elastic.report.pipeline_section import pipeline_section
from elastic.report.run import RunData

MAX_LISTED = 10


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pct(x: Any) -> str:
    return f"{x:.1%}" if _num(x) else "n/a"


def _f(x: Any, fmt: str = ".4g") -> str:
    return format(x, fmt) if _num(x) else "n/a"


def _dur(s: Any) -> str:
    if not _num(s):
        return "n/a"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.2f} h"


def _table(head: Sequence[str], rows: List[Sequence[Any]]) -> List[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return out


def _mean_last(vals: List[float], n: int = 10) -> Optional[float]:
    v = [x for x in vals if _num(x)][-n:]
    return sum(v) / len(v) if v else None


def summary_rows(run: RunData, diag: Diagnosis) -> List[Sequence[Any]]:
    steps = run.steps
    f = diag.figures
    total = run.total_steps
    last = steps[-1]["step"] if steps else 0
    losses = [r.get("loss") for r in steps]
    first_loss = next((x for x in losses if _num(x)), None)
    val = [(r["step"], r["val_loss"]) for r in steps if _num(r.get("val_loss"))]
    if not val:
        val = [(e["step"], e["val_loss"]) for e in run.events if e.get("event") == "eval" and _num(e.get("val_loss")) and _num(e.get("step"))]
    tokens = sum(r["tokens"] for r in steps if _num(r.get("tokens")))
    training = (run.recovery or {}).get("training_s")
    worlds = sorted({int(r["world_size"]) for r in run.metrics if _num(r.get("world_size"))})
    restarts = (run.recovery or {}).get("restarts") or []
    causes: Dict[str, int] = {}
    for r in restarts:
        causes[r.get("cause", "unknown")] = causes.get(r.get("cause", "unknown"), 0) + 1
    starts = [e for e in run.events if e.get("event") == "start"]
    backend = starts[-1].get("attention_backend") if starts else None
    score = f" ({_pct(diag.score)} of {'the device' if diag.name == 'memory' else 'run time'})" if diag.name not in ("compute", "unknown") else ""
    rows: List[Sequence[Any]] = [
        ("**bottleneck**", f"**{diag.name}**{score}: {diag.evidence}"),
        ("lever", diag.lever),
        ("status", f"{run.status.state}: {run.status.detail}"),
        ("steps", f"{last} / {total}" if total else str(last)),
        ("loss", f"{_f(first_loss)} → {_f(losses[-1] if losses else None)} (mean of the last 10: {_f(_mean_last(losses))})"),
        ("validation loss", f"best {_f(min(v for _, v in val))} at step {min(val, key=lambda p: p[1])[0]}, last {_f(val[-1][1])} at step {val[-1][0]}" if val else "n/a"),
        ("tokens", f"{tokens:,} (real tokens); {_f(f.get('tokens_per_s'), ',.0f')} tokens/s over {diag.steps_analyzed} steady steps "
                   "(Σ tokens / Σ step time)"),
        ("MFU", f"{_pct(f.get('mfu'))} (step-time-weighted over the steady steps)"
                + ("" if diag.device.startswith("cuda") else f"; nominal on {diag.device}: a relative figure, docs/report.md#metrics")),
        ("job time", f"{_dur(run.job_s)} (the driver's lease to the end of training: start-up included)" if run.job_s else "n/a"),
        ("training time", f"{_dur(training)} (first worker start to last step: goodput's denominator)" if training else "n/a"),
        ("goodput", _pct(f.get("goodput"))),
        ("restarts", f"{len(restarts)}" + (f" ({', '.join(f'{n} {c}' for c, n in sorted(causes.items()))})" if causes else "")),
        ("world size", "–".join(str(w) for w in (worlds[0], worlds[-1])) if len(worlds) > 1 else (str(worlds[0]) if worlds else "n/a")),
        ("device", diag.device + (f", attention {backend}" if backend else "")),
        ("checkpoints", f"{len(run.checkpoints)} kept, latest {run.checkpoints[-1]}" if run.checkpoints else "none"),
        ("checkpoint stall", _stall_summary(f)),
        ("malformed rows skipped", str(steps[-1].get("bad_rows", "n/a")) if steps else "n/a"),
    ]
    return rows


def _stall_summary(f: Dict[str, Any]) -> str:
    """The seconds a save blocked its step, per save, and the background write behind it."""
    n = f.get("checkpoint_saves") or 0
    if not n or not _num(f.get("checkpoint_stall_s_mean")):
        return "n/a"
    mode = {True: "asynchronous", False: "synchronous"}.get(f.get("checkpoint_async"), "")
    out = f"{f['checkpoint_stall_s_mean']:.3g} s per save (max {f['checkpoint_stall_s_max']:.3g} s) over {n} steady saves"
    if _num(f.get("checkpoint_write_s_mean")):
        out += f"; write {f['checkpoint_write_s_mean']:.3g} s per save" + (" in the background" if mode == "asynchronous" else "")
    return out + (f" ({mode})" if mode else "")


def _checkpoint_section(run: RunData) -> List[str]:
    """One row per save (the last MAX_LISTED): its stall, the part of it spent waiting for the
    previous save, and its write (`checkpoint_done` event, when the checkpoint was registered)."""
    done: Dict[int, Dict[str, Any]] = {}
    for e in run.events:
        if e.get("event") == "checkpoint_done" and _num(e.get("step")):
            done[int(e["step"])] = e
    key = "checkpoint_stall_s" if any(_num(r.get("checkpoint_stall_s")) for r in run.steps) else "checkpoint_s"
    saves = [r for r in run.steps if _num(r.get(key))]
    if not saves:
        return []
    rows = []
    for r in saves[-MAX_LISTED:]:
        e = done.get(int(r["step"]), {})
        mode = {True: "async", False: "sync"}.get(e.get("async"), "")
        rows.append((r["step"], _f(r[key], ".3g"), _f(r.get("checkpoint_wait_s"), ".3g"), _f(e.get("write_s"), ".3g"), mode))
    L = ["## Checkpoints", "",
         "Stall: seconds the saving step was blocked (waiting for the previous save, then copying model and optimizer "
         "state to host memory; the whole write when saves are synchronous). Write: until every rank's files were "
         "complete; the checkpoint was registered with Ray Train at the next step boundary." +
         (f" The last {MAX_LISTED} of {len(saves)} saves:" if len(saves) > MAX_LISTED else ""), ""]
    L += _table(("step", "stall s", "of it waiting for the previous save, s", "write s", "mode"), rows)
    return L + [""]


def _breakdown_rows(run: RunData, diag: Diagnosis) -> List[Sequence[Any]]:
    f = diag.figures
    steps = [r["step_s"] for r in run.steps if _num(r.get("step_s"))]
    rows = [("step (total)", _f(sum(steps) / len(steps), ".3g"), "100%", len(steps))] if steps else []
    for key, label in BREAKDOWN_KEYS:
        share = f.get(f"{key}_share")
        if share is None:
            continue
        vals = [r[f"{key}_s"] for r in run.steps if _num(r.get(f"{key}_s"))]
        rows.append((label, _f(sum(vals) / len(vals), ".3g") if vals else "n/a", _pct(share), len(vals)))
    if f.get("other_share") is not None:
        rows.append(("other (step − parts)", "", _pct(f["other_share"]), ""))
    return rows


def render_markdown(run: RunData, diag: Diagnosis, plots: Dict[str, str], out_dir: str) -> str:
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    L: List[str] = [f"# Run report: {run.name}", "",
                    f"Generated {now} from `{run.run_dir}` ({run.status.state}).", ""]
    L += _table(("", ""), summary_rows(run, diag))
    L += ["", "## Bottleneck", "",
          f"Named: **{diag.name}**. {diag.evidence}", "", f"Lever: {diag.lever}", ""]
    if len(diag.findings) > 1:
        L += ["Also over threshold:", ""] + [f"- **{x.name}** ({_pct(x.score)}): {x.evidence} Lever: {x.lever}" for x in diag.findings[1:]] + [""]
    L += _table(("class", "measure", "value", "threshold", "finding"),
                [(m["class"], m["measure"], _pct(m["value"]), f"≥ {m['threshold']:.0%}", "yes" if m["finding"] else "")
                 for m in measures(diag)])
    L += ["", f"Shares are over {diag.steps_analyzed} steady steps (the first step of each worker-group attempt is "
              "left out); thresholds and the ranking rule are in `elastic/report/bottleneck.py`.", ""]
    bd = _breakdown_rows(run, diag)
    if bd:
        L += ["## Step time", ""] + _table(("part", "mean s", "share of step time", "steps with it"), bd)
        if diag.figures.get("comm_share") is not None:
            L += ["", "Exposed communication is measured on profiled steps only and is included in forward/backward."]
        L += [""]
    if plots:
        L += ["## Plots", ""]
        for name, path in plots.items():
            L += [f"![{name}]({os.path.relpath(path, out_dir)})", ""]
    L += _checkpoint_section(run)
    restarts = (run.recovery or {}).get("restarts") or []
    if restarts:
        L += ["## Restarts and resizes", ""]
        L += _table(("#", "cause", "world size", "resumed at step", "steps redone", "recovery"),
                    [(i, r.get("cause"), f"{r.get('world_size_before')} → {r.get('world_size_after')}", r.get("resumed_from_step"),
                      r.get("steps_redone"), _dur(r.get("recovery_s"))) for i, r in enumerate(restarts, 1)])
        L += [""]
    L += pipeline_section(run)
    L += _grpo_section(run)
    L += _rollout_section(run)
    L += _eval_section(run)
    L += _events_section(run, diag)
    if run.notes:
        L += ["## Notes", ""] + [f"- {n}" for n in run.notes] + [""]
    return "\n".join(L).rstrip() + "\n"


EVAL_FORMULAS = {
    "bits_per_byte": "-Σ loglik / Σ bytes / ln 2", "byte_perplexity": "exp(-Σ loglik / Σ bytes)",
    "word_perplexity": "exp(-Σ loglik / Σ words)", "token_perplexity": "exp(-Σ loglik / Σ tokens)",
    "acc": "mean[argmax loglik == gold]", "acc_norm": "mean[argmax loglik/chars == gold]",
}


def eval_series(steps: List[Dict[str, Any]]) -> Dict[str, List[tuple]]:
    """{"task/metric": [(step, value), ...]} from the `eval/<task>/<metric>` keys of metrics.jsonl."""
    out: Dict[str, List[tuple]] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("eval/") and _num(v) and not k.endswith("/n") and not k.endswith("/tokens"):
                out.setdefault(k[5:], []).append((r["step"], v))
    return out


def _eval_section(run: RunData) -> List[str]:
    """In-training task evaluation (eval.tasks): first and last value of every metric."""
    series = eval_series(run.steps)
    if not series:
        return []
    rows = []
    for key in sorted(series):
        pts = series[key]
        metric = key.rsplit("/", 1)[1]
        rows.append((key, f"{_f(pts[0][1])} at step {pts[0][0]}", f"{_f(pts[-1][1])} at step {pts[-1][0]}",
                     EVAL_FORMULAS.get(metric, "")))
    return (["## Evaluation (eval.tasks, on the live model)", ""]
            + _table(("task / metric", "first", "last", "formula"), rows)
            + ["", "Items per task and the conventions (lm-evaluation-harness's) are in elastic/eval/; "
                   "checkpoints are evaluated on any task with `python jobs/eval.py --model <run>`.", ""])


def _grpo_section(run: RunData) -> List[str]:
    steps = run.steps
    keys = [("reward_mean", "reward mean"), ("pass_rate", "pass rate"), ("compile_error_rate", "compile error rate"),
            ("wrong_answer_rate", "wrong answer rate"), ("timeout_rate", "timeout rate"), ("sandbox_error_rate", "sandbox error rate"),
            ("speedup_mean", "speedup mean"), ("kl", "KL"), ("entropy", "entropy"), ("zero_var_frac", "zero-variance groups"),
            ("trunc_rate", "truncated completions"), ("resp_len_mean", "response length mean"),
            ("heldout_speedup", "held-out speedup")]
    ks = sorted({int(k.rsplit("_", 1)[1]) for r in steps for k in r if k.startswith("heldout_pass_at_")})
    keys[-1:-1] = [("syntax_error_rate", "syntax error rate"), ("runtime_error_rate", "runtime error rate")]
    keys += [(f"heldout_pass_at_{k}", f"held-out pass@{k}") for k in ks]
    rows = []
    for k, lab in keys:
        v = [(r["step"], r[k]) for r in steps if _num(r.get(k))]
        if v:
            xs = [x for _, x in v]
            rows.append((lab, _f(v[0][1]), _f(v[-1][1]), _f(sum(xs[:10]) / len(xs[:10])), _f(_mean_last(xs)), v[-1][0]))
    if not rows:
        return []
    held = []  # the starting policy (measured before step 1) against each held-out evaluation
    for k in ks:
        init = next((r[f"initial_heldout_pass_at_{k}"] for r in steps if _num(r.get(f"initial_heldout_pass_at_{k}"))), None)
        evals = [(r["step"], r[f"heldout_pass_at_{k}"]) for r in steps if _num(r.get(f"heldout_pass_at_{k}"))]
        if evals:
            held.append((f"pass@{k}", _f(init) if init is not None else "—", ", ".join(f"{_f(v)} (step {st})" for st, v in evals)))
    extra = []
    if held:
        extra = (["### Held-out", "", "pass@k = mean over held-out tasks of 1 - C(n-c, k) / C(n, k) (n samples per "
                  "task, c passing; Chen et al. 2021); every verdict is in eval_verdicts.jsonl.", ""]
                 + _table(("metric", "starting policy", "evaluations"), held) + [""])
    # First-10 against last-10 means: one step's figures swing with which prompts it drew, so the
    # window means are what says whether the policy learned.
    return ["## GRPO", ""] + _table(("metric", "first", "last", "mean of first 10", "mean of last 10", "at step"), rows) + [""] + extra


def _rollout_section(run: RunData) -> List[str]:
    """A disaggregated RL run (rl.rollout.placement: disaggregated): who waited on whom, the
    staleness histogram, weight syncs and the fleet's throughput."""
    steps = [r for r in run.steps if _num(r.get("rollout_wait_s"))]
    if not steps:
        return []
    steady = [r for r in steps if not r.get("warmup")] or steps
    total = sum(r["step_s"] for r in steady if _num(r.get("step_s"))) or 1.0

    def share(k: str) -> float:
        return sum(r.get(k) or 0.0 for r in steady) / total

    hist: Dict[int, int] = {}
    for r in steps:
        if _num(r.get("staleness")):
            hist[int(r["staleness"])] = hist.get(int(r["staleness"]), 0) + 1
    syncs = [r for r in steps if _num(r.get("sync_s"))]
    idle = [r["rollout_idle_frac"] for r in steady if _num(r.get("rollout_idle_frac"))]
    tps = [r["rollout_tokens_per_s"] for r in steady if _num(r.get("rollout_tokens_per_s"))]
    per_actor: Dict[str, List[float]] = {}
    for r in steady:
        for a, v in (r.get("rollout_tokens_per_s_by_actor") or {}).items():
            per_actor.setdefault(a, []).append(v)
    rows = [("trainer idle share", _pct(share("rollout_wait_s") + share("reward_wait_s")),
             "Σ (rollout_wait_s + reward_wait_s) / Σ step_s over steady steps"),
            ("  of it waiting for the fleet", _pct(share("rollout_wait_s")), "Σ rollout_wait_s / Σ step_s"),
            ("rollout fleet idle share", _pct(sum(idle) / len(idle)) if idle else "—",
             "mean over steps of 1 - busy actor-seconds / (actors × wall seconds)"),
            ("fleet generated tokens/s", _f(sum(tps) / len(tps)) if tps else "—",
             "mean over steps of Σ actors' tokens / their generation seconds"),
            ("weight syncs", f"{len(syncs)}, {_f(sum(r['sync_s'] for r in syncs) / len(syncs))} s and "
             f"{_f(sum(r.get('sync_bytes', 0) for r in syncs) / len(syncs) / 2**20)} MiB each" if syncs else "—",
             "gather + pack + object-store put on rank 0, per sync"),
            ("staleness (steps: count)", ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())) or "—",
             "step - the version that generated its completions")]
    for a in sorted(per_actor, key=lambda x: int(x) if x.isdigit() else x):
        v = per_actor[a]
        rows.append((f"  rollout actor {a} tokens/s", _f(sum(v) / len(v)), f"over the {len(v)} steps it finished work in"))
    return ["## Rollout fleet (disaggregated)", ""] + _table(("figure", "value", "formula"), rows) + [""]


def _events_section(run: RunData, diag: Diagnosis) -> List[str]:
    L: List[str] = []
    for e in run.events:
        t = e.get("time")
        when = _dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if _num(t) else "?"
        if e.get("event") == "stop":
            L.append(f"- {when} stop: {e.get('reason')}")
        elif e.get("event") == "controller_state" and e.get("error"):
            L.append(f"- {when} controller {e.get('from')} → {e.get('to')}: {e.get('error')}")
    sf = diag.figures.get("stability") or {}
    for label, key in (("skipped steps", "skipped_steps"), ("non-finite steps", "nonfinite_steps"),
                       ("bad_step events", "bad_step_events"), ("loss_spike events", "loss_spike_events")):
        v = sf.get(key) or []
        if v:
            L.append(f"- {label}: {', '.join(map(str, v[:MAX_LISTED]))}" + (f" (+{len(v) - MAX_LISTED})" if len(v) > MAX_LISTED else ""))
    for label, key in (("loss spikes found in the stream", "loss_spikes"), ("grad-norm spikes found in the stream", "grad_spikes")):
        v = sf.get(key) or []
        if v:
            L.append(f"- {label}: " + ", ".join(f"step {s} (z {z:.0f})" for s, z in v[:MAX_LISTED])
                     + (f" (+{len(v) - MAX_LISTED})" if len(v) > MAX_LISTED else ""))
    if not L:
        return []
    return ["## Events", ""] + L + [""]

