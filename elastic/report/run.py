"""Everything the report knows about one run directory, read once and tolerantly.

Why a loader of its own: the report must work on a finished run, on a run still writing its
records and on a run that crashed, and on runs written by older trainers that lack fields. So
nothing here assumes a file or a field exists: records come through `elastic.records` (a last
line cut by a crash is skipped), recovery accounting through `elastic.report.recovery.analyze`
(its failure is reported, not raised), and the run's state is inferred from what is there:

  crashed      the Ray Train controller went to ErroredState or AbortedState after the last
               worker-group start (its error is quoted), or the
               records stopped long ago (below) with no summary and no stop event
  finished     summary.json exists, or the Ray Train controller reached FinishedState after the
               last worker-group start, and the last step reached train.steps
  stopped      summary.json or a "stop" event exists before train.steps (until_step, a stop rule);
               either must belong to the current invocation (a relaunch appends new steps)
  in progress  none of the above and the last record is recent: younger than
               max(STALE_MIN_S, STALE_STEPS × median step time)
  not started  no step record yet
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from elastic.records import EVENTS, METRICS, read_records

SUMMARY = "summary.json"
CONFIG = "config.json"
# A run with no summary whose newest record is older than this is not "in progress" any more.
STALE_MIN_S = 600.0
STALE_STEPS = 20


@dataclass
class Status:
    state: str  # finished | stopped | crashed | in progress | not started
    detail: str


@dataclass
class RunData:
    """One run's records. `metrics` keeps every step completion in file order (a step redone
    after a restart appears twice); `steps` keeps the last completion of each step."""

    run_dir: str
    config: Dict[str, Any]
    metrics: List[Dict[str, Any]]
    events: List[Dict[str, Any]]
    summary: Optional[Dict[str, Any]]
    recovery: Optional[Dict[str, Any]]
    status: Status
    notes: List[str] = field(default_factory=list)  # what could not be read, one line each
    # This invocation's job time (summary.json `job_s`, or handed in by the driver, which writes
    # the report before the summary): None when unknown or when the summary is an earlier one's.
    job_s: Optional[float] = None

    @property
    def name(self) -> str:
        return str(cfg_get(self.config, "run.name") or os.path.basename(os.path.normpath(self.run_dir)))

    @property
    def steps(self) -> List[Dict[str, Any]]:
        final: Dict[int, Dict[str, Any]] = {}
        for r in self.metrics:
            final[int(r["step"])] = r
        return [final[s] for s in sorted(final)]

    @property
    def checkpoints(self) -> List[str]:
        """Checkpoint directories (step_NNNNNNNN) in the run directory, oldest first."""
        try:
            return sorted(n for n in os.listdir(self.run_dir) if n.startswith("step_") and n[5:].isdigit())
        except OSError:
            return []

    @property
    def total_steps(self) -> Optional[int]:
        v = cfg_get(self.config, "train.steps")
        return int(v) if isinstance(v, (int, float)) else None

    @property
    def device(self) -> str:
        """The device of the latest worker-group start ("cpu", "cuda:0"), else a guess from the
        records' memory fields, else "unknown"."""
        starts = [e for e in self.events if e.get("event") == "start" and e.get("device")]
        if starts:
            return str(starts[-1]["device"])
        if any("device_mem_gib" in r or "max_mem_gib" in r for r in self.metrics):
            return "cuda"
        return "unknown"

    @property
    def t0(self) -> Optional[float]:
        """Run start: the first worker-group start, else the first step's start."""
        starts = [e["time"] for e in self.events if e.get("event") == "start" and _num(e.get("time"))]
        if starts:
            return min(starts)
        if self.metrics and _num(self.metrics[0].get("time")):
            return self.metrics[0]["time"] - float(self.metrics[0].get("step_s") or 0.0)
        return None


def cfg_get(config: Dict[str, Any], dotted: str, default: Any = None) -> Any:
    cur: Any = config
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read_json(path: str, notes: List[str]) -> Optional[Dict[str, Any]]:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            v = json.load(f)
        return v if isinstance(v, dict) else None
    except (OSError, ValueError) as e:
        notes.append(f"{os.path.basename(path)}: unreadable ({type(e).__name__}: {e})")
        return None


def load_run(run_dir: str, now: Optional[float] = None, records_dir: Optional[str] = None) -> RunData:
    """Read a run directory. Raises FileNotFoundError only when the directory does not exist.
    `records_dir`: where metrics/events live when not beside config.json (a remote run dir URI)."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    notes: List[str] = []
    config = _read_json(os.path.join(run_dir, CONFIG), notes) or {}
    rec = records_dir or run_dir
    metrics = [r for r in read_records(os.path.join(rec, METRICS)) if _num(r.get("step"))]
    events = [e for e in read_records(os.path.join(rec, EVENTS)) if "event" in e]
    summary = _read_json(os.path.join(run_dir, SUMMARY), notes)
    recovery = None
    if metrics or events:
        try:
            from elastic.report.recovery import analyze

            recovery = analyze(rec)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            notes.append(f"recovery accounting unavailable ({type(e).__name__}: {e})")
    run = RunData(run_dir, config, metrics, events, summary, recovery, Status("not started", ""), notes)
    run.status = infer_status(run, time.time() if now is None else now)
    last_step = run.steps[-1]["step"] if run.metrics else 0
    if summary and _num(summary.get("job_s")) and (not _num(summary.get("last_step")) or summary["last_step"] >= last_step):
        run.job_s = summary["job_s"]
    return run


def infer_status(run: RunData, now: float) -> Status:
    """See the module docstring for the rules."""
    last_start = max((e["time"] for e in run.events if e.get("event") == "start" and _num(e.get("time"))), default=0.0)
    ended = [e for e in run.events if e.get("event") == "controller_state" and e.get("to") in ("ErroredState", "AbortedState")
             and _num(e.get("time")) and e["time"] >= last_start]
    last_step = run.steps[-1]["step"] if run.metrics else 0
    total = run.total_steps
    of = f"/{total}" if total else ""
    if ended:
        err = ended[-1].get("error") or "no error message recorded"
        verb = "errored" if ended[-1]["to"] == "ErroredState" else "was aborted"
        return Status("crashed", f"Ray Train controller {verb} after step {last_step}{of}: {err}")
    # A stop or summary from an earlier invocation (train.until_step, then relaunched) does not
    # end the current one: a stop counts after the last start, a summary if it covers the last step.
    stops = [e for e in run.events if e.get("event") == "stop" and _num(e.get("time")) and e["time"] >= last_start]
    summary_current = run.summary is not None and (
        not _num(run.summary.get("last_step")) or run.summary["last_step"] >= last_step)
    # The controller reached FinishedState after the last start: the report written at the end
    # of a run comes before its summary.json.
    done = any(e.get("event") == "controller_state" and e.get("to") == "FinishedState" and _num(e.get("time"))
               and e["time"] >= last_start for e in run.events)
    if summary_current or stops or done:
        reason = stops[-1].get("reason") if stops else None
        if total and last_step >= total:
            return Status("finished", f"step {last_step}{of}" + (f" ({reason})" if reason else ""))
        return Status("stopped", f"at step {last_step}{of}" + (f": {reason}" if reason else ""))
    if not run.metrics:
        return Status("not started", "no step recorded yet")
    times = [r["time"] for r in run.metrics if _num(r.get("time"))] + [e["time"] for e in run.events if _num(e.get("time"))]
    step_times = [r["step_s"] for r in run.metrics if _num(r.get("step_s"))]
    stale = max(STALE_MIN_S, STALE_STEPS * (statistics.median(step_times) if step_times else 0.0))
    age = now - max(times) if times else 0.0
    if age > stale:
        return Status("crashed", f"no summary and no record for {age / 60:.0f} min after step {last_step}{of} "
                                 "(killed, or the driver died)")
    return Status("in progress", f"step {last_step}{of}, last record {age:.0f} s ago")
