"""Recovery accounting: restarts, their causes and costs, and goodput, from a run's logs.

Inputs (all in the run's local dir): `events.jsonl` (worker-group `start` events written by
rank 0, and the controller's `failure_decision` / `resize_decision` events) and
`metrics.jsonl` (one record per completed step, with its wall time `time` and `step_s`); a
`checkpoint_start` event marks a step that finished training before its checkpoint write.

For every start after the first:
  cause        "failure" if the controller made a failure decision since the previous start
               (it then also decides a resize to restart), else "resize" if it decided a
               resize; "relaunch" when a new controller started (a new driver resumed the run)
  recovery_s   from that decision (for a relaunch: from the previous attempt's last step)
               to the first step completed by the new worker group
  steps_redone last step completed before the restart minus the step resumed from
Goodput = seconds spent in steps that count (the last completion of each step) divided by the
run's *training time* (`training_s`): from the first worker-group start to the last completed
step. (The *job time* of one invocation, `job_s` in summary.json, runs from the driver taking
the run's lease to the end of training and also holds Ray start-up and data planning.)
"""

from __future__ import annotations

import os
from typing import Dict

from elastic.records import EVENTS, METRICS, read_records

read_jsonl = read_records  # the one tolerant reader (elastic/records.py)


def analyze(local_dir: str) -> Dict:
    events = read_records(os.path.join(local_dir, EVENTS))
    steps = [r for r in read_records(os.path.join(local_dir, METRICS)) if "step" in r]
    starts = sorted((e for e in events if e.get("event") == "start"), key=lambda e: e["time"])
    decisions = sorted((e for e in events if e.get("event") in ("failure_decision", "resize_decision")), key=lambda e: e["time"])
    restarts = []
    for prev, cur in zip(starts, starts[1:]):
        before = [d for d in decisions if prev["time"] <= d["time"] <= cur["time"]]
        # A step whose checkpoint write began had finished training, even if the crash came
        # before its metrics record (written after the save, with checkpoint_s).
        done_before = [r for r in steps + [e for e in events if e.get("event") == "checkpoint_start"]
                       if prev["time"] <= r["time"] <= cur["time"]]
        last_step = max((r["step"] for r in done_before), default=prev["step"])
        failures = [d for d in before if d["event"] == "failure_decision"]
        relaunched = any(e.get("event") == "controller_state" and e.get("from") == "InitializingState"
                         and prev["time"] <= e["time"] <= cur["time"] for e in events)
        if relaunched:  # a new driver/controller resumed the run (its first decision is no cause)
            cause, t0 = "relaunch", max((r["time"] for r in done_before), default=prev["time"])
        elif failures:  # a failure is followed by the policy's resize decision to restart: failure wins
            cause, t0 = "failure", failures[0]["time"]
        elif before:
            cause, t0 = "resize", before[0]["time"]
        else:
            cause, t0 = "unknown", max((r["time"] for r in done_before), default=prev["time"])
        after = [r for r in steps if r["time"] >= cur["time"]]
        first_after = min(after, key=lambda r: r["time"]) if after else None
        restarts.append({
            "cause": cause,
            "world_size_before": prev["world_size"],
            "world_size_after": cur["world_size"],
            "decision_time": t0,
            "resumed_from_step": cur["step"],
            "last_step_before": last_step,
            "steps_redone": max(0, last_step - cur["step"]),
            "recovery_s": (first_after["time"] - t0) if first_after else None,
        })
    final: Dict[int, Dict] = {}
    for r in steps:
        final[r["step"]] = r  # later completions of a redone step replace earlier ones
    useful = sum(r["step_s"] for r in final.values())
    wall = (max(r["time"] for r in steps) - starts[0]["time"]) if steps and starts else 0.0
    return {
        "restarts": restarts,
        "goodput": useful / wall if wall > 0 else None,
        "useful_s": useful,
        "training_s": wall,
        "steps_completed": len(final),
        "step_completions": len(steps),
    }


def format_table(acc: Dict) -> str:
    lines = [f"{'#':>2} {'cause':8} {'world':>7} {'resumed@':>8} {'redone':>6} {'recovery_s':>10}"]
    for i, r in enumerate(acc["restarts"], 1):
        rec = f"{r['recovery_s']:.1f}" if r["recovery_s"] is not None else "-"
        lines.append(f"{i:>2} {r['cause']:8} {r['world_size_before']:>3}->{r['world_size_after']:<3} {r['resumed_from_step']:>8} {r['steps_redone']:>6} {rec:>10}")
    gp = acc["goodput"]
    lines.append(f"goodput {gp:.1%} ({acc['useful_s']:.1f}s useful of {acc['training_s']:.1f}s training time)" if gp is not None else "goodput n/a")
    return "\n".join(lines)
