"""The report's pipeline section: each stage's busy time, bubble and memory, beside the theory.

Why: a pipelined run's `pipeline` phase holds both the stages' compute and their waiting on each
other; this section splits it per stage from the run's own records (the `pp_*` fields that
elastic/train/pipeline_bubble.py defines) so the bubble is read off the run, not a benchmark.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

from elastic.report.run import RunData


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def pipeline_rows(steps: Sequence[Dict[str, Any]], virtual: int = 1) -> List[Dict[str, Any]]:
    """One row per pp rank over `steps` (records with `pp_stage_busy_s`): its stages (rank r
    holds r, r + pp, ...), mean busy and pipeline seconds, bubble = 1 - Σ busy / Σ pipeline, and
    the peak memory (the largest over the steps)."""
    recs = [r for r in steps if isinstance(r.get("pp_stage_busy_s"), list) and r["pp_stage_busy_s"]]
    if not recs:
        return []
    pp = len(recs[-1]["pp_stage_busy_s"])
    recs = [r for r in recs if len(r["pp_stage_busy_s"]) == pp]
    rows = []
    for rank in range(pp):
        busy = [r["pp_stage_busy_s"][rank] for r in recs]
        pipe = [r["pp_stage_pipeline_s"][rank] for r in recs]
        mem = [r["pp_stage_mem_gib"][rank] for r in recs if isinstance(r.get("pp_stage_mem_gib"), list)]
        rows.append({"pp_rank": rank, "stages": [rank + k * pp for k in range(virtual)], "busy_s": _mean(busy),
                     "pipeline_s": _mean(pipe), "bubble": max(0.0, 1.0 - sum(busy) / sum(pipe)) if sum(pipe) > 0 else float("nan"),
                     "mem_gib": max(mem) if mem else float("nan"), "steps": len(recs)})
    return rows


def pipeline_section(run: RunData) -> List[str]:
    """Markdown lines; empty for a run without pipeline stages."""
    steady = [r for r in run.steps if not r.get("warmup")]
    recs = [r for r in (steady or run.steps) if _num(r.get("pp_bubble"))]
    if not recs:
        return []
    last = recs[-1]  # the layout is the records' own (a resumed run's config may have another)
    virtual = int(last.get("pp_virtual_stages") or 1)
    rows = pipeline_rows(recs, virtual)
    theory = _mean([r["pp_bubble_theory"] for r in recs if _num(r.get("pp_bubble_theory"))])
    measured = _mean([r["pp_bubble"] for r in recs])
    pp, m, sched = len(rows), last.get("pp_microbatches", "m"), last.get("pp_schedule", "")
    formula = "(p - 1) / (v m + p - 1)" if virtual > 1 else "(p - 1) / (m + p - 1)"
    mem_key = "peak RSS GiB" if any("peak_rss_gib" in r for r in recs) else "peak allocated GiB"
    L = ["## Pipeline stages", "",
         f"{pp} stages per pipeline, schedule {sched}, {m} micro-batches per schedule step"
         + (f", {virtual} virtual stages per rank" if virtual > 1 else "") + f", over {rows[0]['steps']} steady steps. "
         "Busy: the rank's forward and backward chunks (elastic/train/pipeline_bubble.py); pipeline: the whole "
         "pipelined phase of the step; bubble = 1 - Σ busy / Σ pipeline.", "",
         "| pp rank | stages | busy s | pipeline s | bubble | " + mem_key + " |", "|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['pp_rank']} | {', '.join(map(str, r['stages']))} | {r['busy_s']:.4g} | {r['pipeline_s']:.4g} | "
                 f"{r['bubble']:.3f} | {r['mem_gib']:.3g} |")
    L += ["", f"Mean bubble over the stages {measured:.3f}; theory {formula} = {theory:.3f} "
          "(the measured share also holds the p2p sends and receives and the tied embedding's gradient sum).", ""]
    return L


__all__ = ["pipeline_rows", "pipeline_section"]
