"""Name the dominant limiter of a run from its step records, with evidence and the lever.

Why: a run can look busy while it waits on input, communication, checkpoints, the reward pool,
restarts or instability. The per-step time split in `metrics.jsonl` already says which; this
module turns it into one verdict a user can act on without a profiler session. It is a pure
function of records (no files, no Ray, no torch): `diagnose(metrics, events, recovery, config)`.

Classes, their measure and threshold (`THRESHOLDS`); a class is a *finding* when its measure
reaches its threshold:

  input          Σ data_wait_s / Σ step_s                                  ≥ 10%
  communication  Σ comm_s / Σ step_s over the profiled steps (comm_s is exposed
                 communication, measured on sampled steps only)            ≥ 20%
  checkpoint     Σ checkpoint_s / Σ step_s: every second a step was blocked by
                 checkpointing (with asynchronous saves: the stall of each save,
                 the registration of a save written in the background, the last
                 save's write)                                             ≥ 5%
  sync           Σ sync_s / Σ step_s: time at the step's small collectives
                 (loss normaliser, step statistics) waiting for the slowest
                 rank (a straggler, or another rank's input)                ≥ 10%
  generation     Σ generate_s / Σ step_s (GRPO)                            ≥ 50%
  reward_wait    Σ reward_wait_s / Σ step_s (GRPO)                         ≥ 15%
  pipeline_bubble Σ pp_idle_s / Σ step_s: pipeline stages waiting on each other
                 (per step the mean over pp ranks of the pipeline phase minus the
                 stage's own forward/backward chunks, elastic/train/pipeline_bubble.py;
                 the evidence gives the measured bubble beside (p-1)/(m+p-1))     ≥ 15%
  rollout_wait   Σ rollout_wait_s / Σ step_s (disaggregated RL: the trainers
                 waited for the rollout fleet)                              ≥ 15%
                 (when nothing waits and the fleet was idle ≥ 50% of its time,
                 the compute verdict says training limits the run: more trainers)
                 (both GRPO classes add CPU contention as evidence when CPU
                 generation got < 75% of its cores: mean generate_cpu_frac =
                 process CPU s / (wall s × torch threads) of sampling)
  restarts       1 − goodput (recovery accounting), when the run restarted ≥ 5% (goodput < 95%)
  overhead       1 − goodput when the run never restarted (time outside steps) ≥ 5%
  instability    share of steps that were skipped, non-finite, flagged by a
                 bad_step/loss_spike event or found as a loss or grad-norm spike
                 (`elastic.report.spikes`); at least 2 such steps          ≥ 1%
                 A "stop" event whose reason names bad steps, NaN, divergence or
                 spikes makes it 100%: the run ended on it.
  memory         peak reserved (else allocated) / device memory            ≥ 90%
  compute        the fallback: named when nothing above is a finding (GRPO: when the
                 log-prob and update passes cost more than sampling; else generation
                 is named below its threshold, as the largest part of the step).

For GRPO runs loss spikes are not counted (the loss is a surrogate around zero whose sign
follows the advantages); gradient-norm spikes, skipped and non-finite steps are.

Time shares use the steady steps: the first step of every worker-group attempt (pipeline
start-up, compilation, a resumed stream) is left out; those costs show up in goodput instead.

The dominant limiter is the finding with the largest share among the classes that cost time
(all but memory and compute); the shares are all fractions of the run's time (of step time, or
of training time for restarts/overhead), so they compare directly. Memory headroom is named only
when nothing costs time above its threshold (it limits what you can change next, e.g. a larger
micro-batch, rather than costing time now); it also turns the communication lever towards
activation checkpointing. Compute is named when no other class is a finding.

MFU on CPU is nominal (docs/report.md#metrics): on a CPU device, or when the device is unknown, the
compute verdict is never drawn from MFU. It says only that nothing waits and what share of the
step is compute, and names the device. On CUDA, MFU below `GPU_LOW_MFU` (30%) with nothing
waiting is "compute efficiency" (compile, fused kernels, flash attention); at or above it the
step is compute-bound at good efficiency and the lever is more devices.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from elastic.report import spikes

THRESHOLDS: Dict[str, float] = {
    "input": 0.10,
    "communication": 0.20,
    "checkpoint": 0.05,
    "sync": 0.10,
    "generation": 0.50,
    "reward_wait": 0.15,
    "rollout_wait": 0.15,
    "pipeline_bubble": 0.15,
    "restarts": 0.05,
    "overhead": 0.05,
    "instability": 0.01,
    "memory": 0.90,
}
INSTABILITY_MIN_STEPS = 2
# GRPO on CPU: generation that got less than this share of its cores (generate_cpu_frac) shared
# them; the reward_wait and generation findings then name the contention and its lever.
CPU_CONTENTION = 0.75
GPU_LOW_MFU = 0.30
# Classes that cost time; their scores are shares of the run's time and compete directly.
TIME_CLASSES = ("input", "communication", "checkpoint", "sync", "generation", "reward_wait", "rollout_wait", "pipeline_bubble", "restarts",
                "overhead", "instability")
# A disaggregated run's fleet idle at least this share of its time (while the trainers did not wait)
# means training limits the run.
FLEET_IDLE = 0.5
# Per-step time fields (`<key>_s` in metrics.jsonl) and their labels.
BREAKDOWN_KEYS = (("data_wait", "data wait"), ("forward", "forward (incl. exposed comm)"),
                  ("backward", "backward (incl. exposed comm)"), ("pipeline", "pipeline stages (fwd+bwd, p2p, bubble)"),
                  ("optimizer", "optimizer"), ("checkpoint", "checkpoint"),
                  ("sync", "waiting for other ranks"), ("eval", "held-out evaluation"), ("profile", "profiler overhead"),
                  ("comm", "exposed comm (profiled steps)"), ("generate", "generate"), ("reward_wait", "reward wait"),
                  ("logprob", "log-probs"), ("update", "update"), ("rollout_wait", "waiting for the rollout fleet"))
STOP_INSTABILITY = re.compile(r"bad|nan|non-?finite|diverg|spike|inf\b", re.I)


@dataclass
class Finding:
    name: str
    score: float  # the class's measure (a share, or the memory fraction)
    threshold: Optional[float]
    evidence: str  # one sentence with the numbers
    lever: str  # what to change, naming config keys


@dataclass
class Diagnosis:
    """The named bottleneck (`name`, `score`, `evidence`, `lever`), every finding that crossed
    its threshold (dominant first), and the per-class figures it was decided from."""

    name: str
    score: float
    threshold: Optional[float]
    evidence: str
    lever: str
    device: str
    steps_analyzed: int
    findings: List[Finding] = field(default_factory=list)
    figures: Dict[str, Any] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        return f"{self.name}: {self.evidence} Lever: {self.lever}"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _get(config: Optional[Dict[str, Any]], dotted: str) -> Any:
    cur: Any = config or {}
    for p in dotted.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


def _now(config: Optional[Dict[str, Any]], dotted: str) -> str:
    v = _get(config, dotted)
    return f" (now {v})" if v is not None else ""


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.0%}" if abs(x) >= 0.1 else f"{x:.1%}"


def steady_records(metrics: Sequence[Dict[str, Any]], events: Iterable[Dict[str, Any]] = ()) -> List[Dict[str, Any]]:
    """The step records minus the first of every worker-group attempt. An attempt starts at the
    first record, where the step number does not increase, or after a `start` event. When that
    would leave nothing, all records are kept."""
    starts = sorted(e["time"] for e in events if e.get("event") == "start" and _num(e.get("time")))
    out, prev = [], None
    for r in metrics:
        first = prev is None or not (r.get("step", 0) > prev.get("step", 0))
        if not first and _num(r.get("time")) and _num(prev.get("time")):
            first = any(prev["time"] < t <= r["time"] for t in starts)
        if not first:
            out.append(r)
        prev = r
    return out or list(metrics)


def _share(recs: Sequence[Dict[str, Any]], key: str) -> Optional[float]:
    """Σ key / Σ step_s over the records that carry both; None when none does. `checkpoint_s`
    is only on the steps that save, so its share is over every step (absent = 0 s)."""
    if not any(_num(r.get(key)) for r in recs):
        return None
    have = [r for r in recs if _num(r.get("step_s")) and (key == "checkpoint_s" or _num(r.get(key)))]
    total = sum(r["step_s"] for r in have)
    return sum(r[key] if _num(r.get(key)) else 0.0 for r in have) / total if have and total > 0 else None


def _mean(recs: Sequence[Dict[str, Any]], key: str) -> Optional[float]:
    v = [r[key] for r in recs if _num(r.get(key))]
    return sum(v) / len(v) if v else None


def checkpoint_figures(recs: Sequence[Dict[str, Any]], events: Iterable[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """Per save: the stall (`checkpoint_stall_s` of the saving step: waiting for the previous save
    plus the copy to host; the whole write when saves are synchronous), the part of it spent
    waiting for the previous save, the background write (`checkpoint_done` events) and all the
    seconds checkpointing blocked steps, per save (the cost of a checkpoint, for Young's rule).
    Runs from before asynchronous saves carry `checkpoint_s` on saving steps only: that is the stall."""
    saves = [r for r in recs if _num(r.get("checkpoint_stall_s"))]
    key = "checkpoint_stall_s" if saves else "checkpoint_s"
    if not saves:
        saves = [r for r in recs if _num(r.get("checkpoint_s"))]
    done = [e for e in events if e.get("event") == "checkpoint_done"]
    modes = {bool(e["async"]) for e in done if "async" in e}
    n = len(saves)
    return {
        "checkpoint_saves": n,
        "checkpoint_async": (True in modes) if modes else None,
        "checkpoint_stall_s_mean": _mean(saves, key),
        "checkpoint_stall_s_max": max((r[key] for r in saves), default=None),
        "checkpoint_wait_s_mean": _mean(saves, "checkpoint_wait_s"),
        "checkpoint_write_s_mean": _mean(done, "write_s"),
        "checkpoint_blocked_per_save_s": (sum(r["checkpoint_s"] for r in recs if _num(r.get("checkpoint_s"))) / n) if n else None,
    }


def throughput(recs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The run's throughput over `recs` (its steady steps), one definition for the console's
    closing line, summary.json and the report:

        tokens_per_s = Σ real tokens / Σ step_s     (not the mean of per-step rates)
        mfu          = Σ (mfu × step_s) / Σ step_s  (model FLOPs done / (peak × time))

    None where no record carries the fields."""
    have = [r for r in recs if _num(r.get("step_s")) and r["step_s"] > 0]
    total = sum(r["step_s"] for r in have)
    tok = [r for r in have if _num(r.get("tokens"))]
    flop = [r for r in have if _num(r.get("mfu"))]
    return {"tokens_per_s": sum(r["tokens"] for r in tok) / sum(r["step_s"] for r in tok) if tok else None,
            "mfu": sum(r["mfu"] * r["step_s"] for r in flop) / sum(r["step_s"] for r in flop) if flop else None,
            "steps": len(recs), "step_s_total": total}


def time_figures(recs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Shares of step time per component, and throughput (`throughput`), over `recs`."""
    tp = throughput(recs)
    f: Dict[str, Any] = {"step_s_mean": _mean(recs, "step_s"), "tokens_per_s": tp["tokens_per_s"], "mfu": tp["mfu"]}
    for k, _ in BREAKDOWN_KEYS:
        f[f"{k}_share"] = _share(recs, f"{k}_s")
    f["comm_sampled_steps"] = sum(1 for r in recs if _num(r.get("comm_s")))
    f["pp_idle_share"] = _share(recs, "pp_idle_s")
    f["pp_bubble_mean"], f["pp_bubble_theory"] = _mean(recs, "pp_bubble"), _mean(recs, "pp_bubble_theory")
    grpo = f["generate_share"] is not None or f["rollout_wait_share"] is not None
    parts = (("generate", "rollout_wait", "reward_wait", "logprob", "update", "sync", "checkpoint", "eval") if grpo
             else ("data_wait", "forward", "backward", "pipeline", "optimizer", "sync", "checkpoint", "eval", "profile"))
    known = [f[f"{p}_share"] for p in parts if f[f"{p}_share"] is not None]
    f["other_share"] = max(0.0, 1.0 - sum(known)) if len(known) > 1 else None
    if grpo:
        compute = [f[k] for k in ("logprob_share", "update_share") if f[k] is not None]
        f["compute_share"] = sum(compute) if compute else None
    elif f["forward_share"] is not None and f["backward_share"] is not None:
        f["compute_share"] = f["forward_share"] + f["backward_share"] + (f["optimizer_share"] or 0.0) - (f["comm_share"] or 0.0)
    elif f["pipeline_share"] is not None:  # pipeline stages: their time less the bubble
        f["compute_share"] = f["pipeline_share"] - (f["pp_idle_share"] or 0.0) + (f["optimizer_share"] or 0.0)
    else:  # an older run without the breakdown: what is not waiting
        f["compute_share"] = max(0.0, 1.0 - (f["data_wait_share"] or 0.0) - (f["checkpoint_share"] or 0.0)) if recs else None
    if _num(f["step_s_mean"]) and any(_num(r.get("slowest_rank_step_s")) for r in recs):
        f["slowest_rank_over_step"] = _mean(recs, "slowest_rank_step_s") / f["step_s_mean"]
    f["gen_tokens_per_s_mean"] = _mean(recs, "gen_tokens_per_s")
    f["reward_evals_per_s_mean"] = _mean(recs, "reward_evals_per_s")
    f["generate_cpu_frac_mean"] = _mean(recs, "generate_cpu_frac")
    f["trunc_rate_mean"] = _mean(recs, "trunc_rate")
    f["rollout_idle_frac_mean"] = _mean(recs, "rollout_idle_frac")
    f["rollout_fleet_mean"] = _mean(recs, "rollout_fleet")
    f["rollout_tokens_per_s_mean"] = _mean(recs, "rollout_tokens_per_s")
    return f


def memory_figures(metrics: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    f: Dict[str, Any] = {"peak_rss_gib": max((r["peak_rss_gib"] for r in metrics if _num(r.get("peak_rss_gib"))), default=None)}
    peak = max((r.get("max_reserved_gib") if _num(r.get("max_reserved_gib")) else r.get("max_mem_gib")
                for r in metrics if _num(r.get("max_reserved_gib")) or _num(r.get("max_mem_gib"))), default=None)
    dev = max((r["device_mem_gib"] for r in metrics if _num(r.get("device_mem_gib")) and r["device_mem_gib"] > 0), default=None)
    f.update(mem_peak_gib=peak, device_mem_gib=dev, mem_frac=(peak / dev) if peak is not None and dev else None)
    return f


def stability_figures(steps: Sequence[Dict[str, Any]], events: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Which steps were bad or spiky, from the records and the trainer's events (union by step)."""
    n = len(steps)
    skipped = {int(r["step"]) for r in steps if r.get("skipped") is True}
    nonfinite = {int(r["step"]) for r in steps
                 if any(isinstance(r.get(k), float) and not math.isfinite(r[k]) for k in ("loss", "grad_norm"))}
    bad_ev = {int(e["step"]) for e in events if e.get("event") == "bad_step" and _num(e.get("step"))}
    spike_ev = {int(e["step"]) for e in events if e.get("event") == "loss_spike" and _num(e.get("step"))}
    st = [r["step"] for r in steps]
    # A GRPO loss is a policy-gradient surrogate around zero whose sign follows the advantages:
    # its jumps are not divergence. GRPO instability shows in gradient norms and bad steps.
    grpo = any("generate_s" in r or "rollout_wait_s" in r for r in steps)
    if grpo:
        spike_ev = set()
    loss_sp = [] if grpo else spikes.upward_spikes(st, [r.get("loss") for r in steps], spikes.LOSS_Z,
                                                  spikes.LOSS_MIN_REL)
    grad_sp = spikes.upward_spikes(st, [r.get("grad_norm") for r in steps], spikes.GRAD_Z, spikes.GRAD_MIN_REL)
    stop_bad = [e for e in events if e.get("event") == "stop" and STOP_INSTABILITY.search(str(e.get("reason", "")))]
    affected = skipped | nonfinite | bad_ev | spike_ev | {s for s, _ in loss_sp} | {s for s, _ in grad_sp}
    grads = [r["grad_norm"] for r in steps if _num(r.get("grad_norm"))]
    return {
        "steps": n, "skipped_steps": sorted(skipped), "nonfinite_steps": sorted(nonfinite),
        "bad_step_events": sorted(bad_ev), "loss_spike_events": sorted(spike_ev),
        "loss_spikes": loss_sp, "grad_spikes": grad_sp, "affected_steps": sorted(affected),
        "affected_share": len(affected) / n if n else 0.0,
        "max_consecutive_bad": max((int(r["bad_steps"]) for r in steps if _num(r.get("bad_steps"))), default=0),
        "stop_reason": str(stop_bad[-1].get("reason")) if stop_bad else None,
        "grad_norm_median": statistics.median(grads) if grads else None,
        "grad_norm_max": max(grads) if grads else None,
    }


def _steps_list(steps: Sequence[int], limit: int = 5) -> str:
    s = ", ".join(str(x) for x in steps[:limit])
    return s + (f" … (+{len(steps) - limit})" if len(steps) > limit else "")


def _instability(sf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Optional[Finding]:
    n_aff = len(sf["affected_steps"])
    score = 1.0 if sf["stop_reason"] else sf["affected_share"]
    if not sf["stop_reason"] and (score < THRESHOLDS["instability"] or n_aff < INSTABILITY_MIN_STEPS):
        return None
    parts = []
    if sf["skipped_steps"] or sf["bad_step_events"]:
        parts.append(f"{len(set(sf['skipped_steps']) | set(sf['bad_step_events']))} skipped as non-finite")
    if sf["nonfinite_steps"]:
        parts.append(f"{len(sf['nonfinite_steps'])} with a non-finite loss or grad norm")
    ls = {s for s, _ in sf["loss_spikes"]} | set(sf["loss_spike_events"])
    if ls:
        parts.append(f"{len(ls)} loss spikes")
    if sf["grad_spikes"]:
        parts.append(f"{len(sf['grad_spikes'])} grad-norm spikes (max {sf['grad_norm_max']:.3g} vs median {sf['grad_norm_median']:.3g})")
    ev = f"{n_aff} of {sf['steps']} steps ({_pct(sf['affected_share'])}) were bad or spiked: {'; '.join(parts) or 'see events'}"
    ev += f"; steps {_steps_list(sf['affected_steps'])}."
    if sf["stop_reason"]:
        ev += f" The run stopped on it: {sf['stop_reason']}."
    lever = (f"lower train.lr{_now(config, 'train.lr')}, longer train.warmup_steps{_now(config, 'train.warmup_steps')}, "
             f"keep gradient clipping on: train.grad_clip{_now(config, 'train.grad_clip')}; look at the data of the first bad steps")
    return Finding("instability", score, THRESHOLDS["instability"], ev, lever)


def _restarts(recovery: Optional[Dict[str, Any]], step_s: Optional[float], ckpt_s: Optional[float],
              config: Optional[Dict[str, Any]]) -> Optional[Finding]:
    gp = (recovery or {}).get("goodput")
    if not _num(gp):
        return None
    lost = max(0.0, 1.0 - gp)
    if lost < THRESHOLDS["restarts"]:
        return None
    restarts = recovery.get("restarts") or []
    wall = recovery.get("training_s") or 0.0
    if not restarts:
        ev = (f"goodput {_pct(gp)} with no restart: {lost * wall:.1f} s of {wall:.0f} s training time ({_pct(lost)}) passed "
              "outside training steps (start-up of the stream, evaluation, checkpoint writes, logging).")
        lever = (f"checkpoint.every_steps{_now(config, 'checkpoint.every_steps')} if checkpoint writes fall between steps; "
                 "look for work between steps in the timeline")
        return Finding("overhead", lost, THRESHOLDS["overhead"], ev, lever)
    causes: Dict[str, int] = {}
    for r in restarts:
        causes[r.get("cause", "unknown")] = causes.get(r.get("cause", "unknown"), 0) + 1
    redone = sum(int(r.get("steps_redone") or 0) for r in restarts)
    recov = sum(float(r["recovery_s"]) for r in restarts if _num(r.get("recovery_s")))
    ev = (f"goodput {_pct(gp)} over {wall:.0f} s training time: {len(restarts)} restarts "
          f"({', '.join(f'{n} {c}' for c, n in sorted(causes.items()))}), {redone} steps redone, "
          f"{recov:.0f} s from decision to the first step after restart.")
    levers = []
    failures = causes.get("failure", 0)
    if failures and _num(ckpt_s) and _num(step_s) and step_s > 0 and wall > 0:
        mtbf = wall / failures
        young = math.sqrt(2.0 * ckpt_s * mtbf)  # Young's optimal checkpoint interval
        levers.append(f"checkpoint.every_steps ≈ {max(1, round(young / step_s))}{_now(config, 'checkpoint.every_steps')} "
                      f"by Young's rule √(2 × {ckpt_s:.2g} s per checkpoint × {mtbf:.0f} s between failures)")
    elif redone and step_s:
        levers.append(f"a smaller checkpoint.every_steps{_now(config, 'checkpoint.every_steps')} if steps redone "
                      f"({redone * step_s:.0f} s) dominate, a larger one if checkpoint writes do")
    if recov > redone * (step_s or 0.0):
        levers.append("recovery time dominates: a faster worker-group start: warm nodes, "
                      f"scaling.worker_group_start_timeout_s{_now(config, 'scaling.worker_group_start_timeout_s')}")
    if causes.get("resize"):
        levers.append(f"fewer resizes: a longer scaling.elastic_resize_monitor_interval_s{_now(config, 'scaling.elastic_resize_monitor_interval_s')}")
    if failures:
        levers.append("fix the failure cause (events.jsonl controller errors)")
    return Finding("restarts", lost, THRESHOLDS["restarts"], ev, "; ".join(levers) or "fewer restarts")


def diagnose(metrics: Sequence[Dict[str, Any]], events: Sequence[Dict[str, Any]] = (),
             recovery: Optional[Dict[str, Any]] = None, config: Optional[Dict[str, Any]] = None,
             device: Optional[str] = None) -> Diagnosis:
    """The named bottleneck of a run. `metrics`: step records in file order (redone steps may
    repeat); `events`: events.jsonl records; `recovery`: `elastic.report.recovery.analyze`'s
    result; `config`: the resolved config dict (only for naming current values in levers);
    `device`: "cpu" / "cuda:0" (default: the latest `start` event's, else "cuda" when the
    records carry device memory, else "unknown")."""
    metrics = [r for r in metrics if _num(r.get("step"))]
    if device is None:
        starts = [e for e in events if e.get("event") == "start" and e.get("device")]
        device = str(starts[-1]["device"]) if starts else ("cuda" if any("device_mem_gib" in r for r in metrics) else "unknown")
    if not metrics:
        return Diagnosis("unknown", 0.0, None, "no step recorded yet.", "wait for the first steps", device, 0)
    final: Dict[int, Dict[str, Any]] = {}
    for r in metrics:
        final[int(r["step"])] = r
    steps = [final[s] for s in sorted(final)]
    steady = steady_records(metrics, events)
    tf = time_figures(steady)
    tf.update(checkpoint_figures(steady, events))
    mf = memory_figures(metrics)
    sf = stability_figures(steps, events)
    figures = {**tf, **mf, "stability": sf, "goodput": (recovery or {}).get("goodput"),
               "restarts": len((recovery or {}).get("restarts") or [])}
    mem_hot = mf["mem_frac"] is not None and mf["mem_frac"] >= THRESHOLDS["memory"]
    found: List[Finding] = []

    s = tf["data_wait_share"]
    if s is not None and s >= THRESHOLDS["input"]:
        found.append(Finding("input", s, THRESHOLDS["input"],
                             f"the trainer waited for data {_pct(s)} of step time "
                             f"({_mean(steady, 'data_wait_s'):.3g} s of a {tf['step_s_mean']:.3g} s step on average).",
                             f"more CPU for tokenize+pack: data.tokenize_cpus{_now(config, 'data.tokenize_cpus')} per shard build, "
                             f"data.build_ahead{_now(config, 'data.build_ahead')} shards built ahead, or more CPU nodes "
                             "(builds run as Ray tasks on the cluster's CPUs)"))
    s = tf["comm_share"]
    if s is not None and s >= THRESHOLDS["communication"]:
        lever = (f"a larger train.micro_batch_size{_now(config, 'train.micro_batch_size')} for more compute per collective; "
                 "fewer shards: fewer workers per FSDP group, or HSDP (shard within a node, replicate across)")
        if mem_hot:
            lever += (f"; memory is at {_pct(mf['mem_frac'])} of the device, so make room first with "
                      f"train.activation_checkpointing: full{_now(config, 'train.activation_checkpointing')}")
        found.append(Finding("communication", s, THRESHOLDS["communication"],
                             f"exposed communication took {_pct(s)} of step time on the {tf['comm_sampled_steps']} "
                             "profiled steps.", lever))
    s = tf["sync_share"]
    if s is not None and s >= THRESHOLDS["sync"]:
        found.append(Finding("sync", s, THRESHOLDS["sync"],
                             f"ranks waited for the slowest rank {_pct(s)} of step time "
                             f"({_mean(steady, 'sync_s'):.3g} s per step at the step's collectives).",
                             "find the slow rank (slowest_rank_step_s; events.jsonl names each worker's node): a busy "
                             "or slower node, or uneven work per rank; on a shared machine, fewer workers than cores"))
    s = tf["checkpoint_share"]
    if s is not None and s >= THRESHOLDS["checkpoint"]:
        found.append(_checkpoint(s, tf, config))
    s = tf["generate_share"]
    if s is not None and s >= THRESHOLDS["generation"]:
        found.append(_generation(tf, config))
    s = tf["reward_wait_share"]
    if s is not None and s >= THRESHOLDS["reward_wait"]:
        rate = f" at {tf['reward_evals_per_s_mean']:.3g} evaluations/s" if _num(tf["reward_evals_per_s_mean"]) else ""
        kind = str(_get(config, "reward.kind") or "code_opt")
        if "code_opt" in kind:  # timing knobs exist only where programs are timed
            cheaper = (f"; cheaper evaluations: reward.timing{_now(config, 'reward.timing')}, "
                       f"reward.timing_runs{_now(config, 'reward.timing_runs')}")
        elif "python_tests" in kind:
            cheaper = f"; a shorter per-test limit: reward.python_time_limit_s{_now(config, 'reward.python_time_limit_s')}"
        else:
            cheaper = f" (reward.kind {kind})"
        shared, apart = _cpu_contention(tf)
        found.append(Finding("reward_wait", s, THRESHOLDS["reward_wait"],
                             f"the trainer waited on the reward pool {_pct(s)} of GRPO step time{rate}.{shared}",
                             apart + f"more reward actors: reward.num_actors{_now(config, 'reward.num_actors')}, or CPU nodes"
                             + cheaper))
    s = tf["rollout_wait_share"]
    if s is not None and s >= THRESHOLDS["rollout_wait"]:
        found.append(_rollout_wait(s, tf, config))
    s = tf["pp_idle_share"]
    if s is not None and s >= THRESHOLDS["pipeline_bubble"]:
        found.append(_pipeline_bubble(s, tf, config))
    f = _restarts(recovery, tf["step_s_mean"], checkpoint_figures(metrics, events)["checkpoint_blocked_per_save_s"], config)
    if f:
        found.append(f)
    f = _instability(sf, config)
    if f:
        found.append(f)
    found.sort(key=lambda x: -x.score)
    if mem_hot:
        found.append(Finding("memory", mf["mem_frac"], THRESHOLDS["memory"],
                             f"peak memory {mf['mem_peak_gib']:.1f} GiB is {_pct(mf['mem_frac'])} of the device's "
                             f"{mf['device_mem_gib']:.1f} GiB.",
                             f"train.activation_checkpointing: full{_now(config, 'train.activation_checkpointing')} or a "
                             f"smaller train.micro_batch_size{_now(config, 'train.micro_batch_size')}"))
    if not found:
        top = _grpo_largest_part(tf, config) or _compute(tf, device, config)
        note = _fleet_idle_note(tf, config)
        if note:
            top = Finding(top.name, top.score, top.threshold, top.evidence + note, top.lever)
        found.append(top)
    top = found[0]
    return Diagnosis(top.name, top.score, top.threshold, top.evidence, top.lever, device, len(steady), found, figures)


def _checkpoint(share: float, tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Finding:
    """Checkpointing blocks the steps. Asynchronous saves: the evidence is the stall per save and
    the background write; when the stall is mostly waiting for the previous save, writes take
    longer than the interval between saves. Synchronous saves: the whole write is the stall."""
    every = f"checkpoint.every_steps{_now(config, 'checkpoint.every_steps')}"
    n, stall, wait, write = (tf["checkpoint_saves"], tf["checkpoint_stall_s_mean"], tf["checkpoint_wait_s_mean"],
                             tf["checkpoint_write_s_mean"])
    per_save = f"{stall:.3g} s stall per save over {n} saves" if _num(stall) else f"{n} saves"
    weigh = "weighed against the failure rate: steps after the last checkpoint are redone after a restart"
    asynchronous = tf["checkpoint_async"]
    if asynchronous is None:  # no checkpoint_done event yet: the config says (older trainers saved synchronously)
        asynchronous = _get(config, "checkpoint.async_save") is True
    if not asynchronous:
        return Finding("checkpoint", share, THRESHOLDS["checkpoint"],
                       f"checkpoint writes took {_pct(share)} of step time ({per_save}, synchronous).",
                       f"checkpoint.async_save: true{_now(config, 'checkpoint.async_save')} (the step then waits only for the "
                       f"copy to host memory), or a larger {every}, {weigh}")
    ev = f"checkpointing blocked training {_pct(share)} of step time ({per_save}"
    if _num(wait) and _num(stall) and stall > 0:
        ev += f", {wait:.3g} s of it waiting for the previous save"
    ev += f"; background write {write:.3g} s)." if _num(write) else ")."
    if _num(wait) and _num(stall) and wait >= 0.5 * stall:
        lever = (f"a larger {every}: each save waits for the previous one's background write, which takes longer "
                 "than the steps between saves; or faster checkpoint storage")
    else:
        lever = f"a larger {every}, {weigh}"
    return Finding("checkpoint", share, THRESHOLDS["checkpoint"], ev, lever)


def _pipeline_bubble(s: float, tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Finding:
    theory = f" (theory {tf['pp_bubble_theory']:.3f})" if _num(tf.get("pp_bubble_theory")) else ""
    bubble = f"; the stages' mean bubble was {tf['pp_bubble_mean']:.3f}{theory}" if _num(tf.get("pp_bubble_mean")) else ""
    return Finding("pipeline_bubble", s, THRESHOLDS["pipeline_bubble"],
                   f"pipeline stages waited on each other {_pct(s)} of step time{bubble}.",
                   f"more micro-batches per schedule step: parallel.pp_microbatches{_now(config, 'parallel.pp_microbatches')} "
                   "(bubble (p-1)/(m+p-1)), an interleaved schedule with virtual stages: parallel.pp_schedule"
                   f"{_now(config, 'parallel.pp_schedule')} interleaved_1f1b and parallel.pp_virtual_stages"
                   f"{_now(config, 'parallel.pp_virtual_stages')} 2 ((p-1)/(v m+p-1)), or fewer stages: "
                   f"parallel.pp{_now(config, 'parallel.pp')} (FSDP shards the rest)")


def _cpu_contention(tf: Dict[str, Any]) -> Tuple[str, str]:
    """(evidence, lever) when CPU generation got well under its cores, else ("", "").

    generate_cpu_frac = process CPU seconds / (wall seconds × torch threads) of each worker's
    generation (GRPO on CPU); below CPU_CONTENTION it shared its cores with other work, on one
    machine usually the reward actors: evaluation and sampling then slow each other down."""
    frac = tf.get("generate_cpu_frac_mean")
    if not _num(frac) or frac >= CPU_CONTENTION:
        return "", ""
    return (f" Generation got {_pct(frac)} of its cores (process CPU / wall / threads): the train workers "
            f"shared their CPUs with other work, on one machine the reward actors, so sampling and evaluation "
            f"slowed each other.",
            "give the reward pool CPUs the trainers do not use (CPU nodes, or fewer train workers); ")


def _generation(tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Finding:
    s = tf["generate_share"]
    extra = f", {tf['gen_tokens_per_s_mean']:.0f} generated tokens/s" if _num(tf["gen_tokens_per_s_mean"]) else ""
    extra += f", {_pct(tf['trunc_rate_mean'])} of completions truncated" if _num(tf["trunc_rate_mean"]) else ""
    below = "" if s >= THRESHOLDS["generation"] else (
        f" Nothing reaches its threshold; sampling (below its {_pct(THRESHOLDS['generation'])}) is the largest part, "
        f"log-probs and updates {_pct(tf['compute_share'])}.")
    shared, apart = _cpu_contention(tf)
    return Finding("generation", s, THRESHOLDS["generation"],
                   f"sampling completions took {_pct(s)} of GRPO step time{extra}.{below}{shared}",
                   apart + f"shorter completions: rl.max_new_tokens{_now(config, 'rl.max_new_tokens')}; fewer per step: "
                   f"rl.group_size{_now(config, 'rl.group_size')} × rl.prompts_per_step"
                   f"{_now(config, 'rl.prompts_per_step')}; or a faster batched KV-cache sampler")


def _rollout_wait(s: float, tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Finding:
    """Disaggregated RL: the trainers waited for the rollout fleet."""
    ev = f"the trainers waited for the rollout fleet {_pct(s)} of step time"
    if _num(tf["rollout_fleet_mean"]):
        ev += f" ({tf['rollout_fleet_mean']:.3g} rollout actors"
        ev += f", {tf['rollout_tokens_per_s_mean']:.0f} generated tokens/s" if _num(tf["rollout_tokens_per_s_mean"]) else ""
        ev += f", idle {_pct(tf['rollout_idle_frac_mean'])} of their time)" if _num(tf["rollout_idle_frac_mean"]) else ")"
    return Finding("rollout_wait", s, THRESHOLDS["rollout_wait"], ev + ".",
                   f"more rollout actors: rl.rollout.workers{_now(config, 'rl.rollout.workers')} (scripts/scale_rollouts.sh "
                   f"on a running job); a larger rl.max_staleness{_now(config, 'rl.max_staleness')} so more generation "
                   f"overlaps training; or shorter completions: rl.max_new_tokens{_now(config, 'rl.max_new_tokens')}")


def _fleet_idle_note(tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> str:
    """When a disaggregated run's fleet mostly waited on the trainers: say so, with the lever."""
    idle = tf.get("rollout_idle_frac_mean")
    if not _num(idle) or idle < FLEET_IDLE:
        return ""
    return (f" The rollout fleet was idle {_pct(idle)} of its time: training limits the run; more trainers "
            f"(scaling.max_workers{_now(config, 'scaling.max_workers')}) or fewer rollout actors "
            f"(rl.rollout.workers{_now(config, 'rl.rollout.workers')}).")


def _grpo_largest_part(tf: Dict[str, Any], config: Optional[Dict[str, Any]]) -> Optional[Finding]:
    """GRPO's fallback: when nothing is a finding, the larger of sampling and the training
    passes (log-probs + update) limits the step, so name sampling when it is the larger; a
    plain "compute" would point at the update's levers while sampling costs more."""
    g, c = tf["generate_share"], tf["compute_share"]
    if _num(g) and (not _num(c) or g >= c):
        return _generation(tf, config)
    return None


def _compute(tf: Dict[str, Any], device: str, config: Optional[Dict[str, Any]]) -> Finding:
    cs, mfu = tf["compute_share"], tf["mfu"]
    waits = (f"data wait {_pct(tf['data_wait_share'])}, exposed comm {_pct(tf['comm_share'])}")
    if device.startswith("cuda") and _num(mfu):
        if mfu < GPU_LOW_MFU:
            return Finding("compute", cs if _num(cs) else 1.0, None,
                           f"MFU {_pct(mfu)} on {device} is low while nothing waits ({waits}).",
                           f"train.compile: true{_now(config, 'train.compile')}; fused kernels; a flash attention backend, "
                           f"model.attention{_now(config, 'model.attention')}; a larger train.micro_batch_size"
                           f"{_now(config, 'train.micro_batch_size')} if memory allows")
        return Finding("compute", cs if _num(cs) else 1.0, None,
                       f"compute-bound at MFU {_pct(mfu)} on {device}; nothing waits ({waits}).",
                       "more devices (scaling.max_workers): the step is doing useful math")
    share = f"compute is {_pct(cs)} of step time" if _num(cs) else "the step is not broken down"
    mfu_note = f"; MFU {_pct(mfu)} is nominal on {device} (docs/report.md#metrics) and is not the evidence" if _num(mfu) else ""
    return Finding("compute", cs if _num(cs) else 1.0, None,
                   f"on {device} nothing waits above its threshold ({waits}): {share}{mfu_note}.",
                   f"compute-bound: more cores per worker, scaling.cpus_per_worker{_now(config, 'scaling.cpus_per_worker')}, "
                   "or more workers; on a GPU, MFU decides (train.compile, flash attention)")


MEASURES = (
    ("input", "data_wait_share", "data wait / step time"),
    ("communication", "comm_share", "exposed comm / step time (profiled steps)"),
    ("checkpoint", "checkpoint_share", "checkpoint / step time"),
    ("generation", "generate_share", "generate / step time (GRPO)"),
    ("reward_wait", "reward_wait_share", "reward wait / step time (GRPO)"),
    ("rollout_wait", "rollout_wait_share", "rollout wait / step time (disaggregated RL)"),
    ("pipeline_bubble", "pp_idle_share", "pipeline stages' idle time / step time"),
    ("restarts", "lost_share", "1 − goodput (with restarts: restarts, else overhead)"),
    ("instability", "affected_share", "bad or spiking steps / steps"),
    ("memory", "mem_frac", "peak memory / device memory"),
)


def measures(diag: Diagnosis) -> List[Dict[str, Any]]:
    """Every class's measure, threshold and whether it is a finding (for the report's table)."""
    f = diag.figures
    gp = f.get("goodput")
    vals = {**f, "lost_share": (1.0 - gp) if _num(gp) else None,
            "affected_share": (f.get("stability") or {}).get("affected_share")}
    named = {x.name for x in diag.findings}
    rows = []
    for name, key, what in MEASURES:
        if name == "restarts" and "overhead" in named:
            name = "overhead"
        rows.append({"class": name, "measure": what, "value": vals.get(key), "threshold": THRESHOLDS[name],
                     "finding": name in named})
    return rows
