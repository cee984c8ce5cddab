"""Start-up time: when the command started, and the two figures measured from it.

`first_step_s` (summary.json) = the end of the job's first training step - the command's start;
`startup_s` = the beginning of that step - the command's start. The step is the first one in
`metrics.jsonl` written after the start (a resumed run's earlier steps are not it); its end is
its record's `time` and its beginning that minus its `step_s` (rank 0's clock and step time).

The command's start is the driver process's start (from /proc: Python's own start-up and every
import count) for the first job of a command run from an entry point (jobs/*.py call
`command_started` through `run_or_exit_code`). A job run from Python (a notebook, a test) or
chained after another job in the same command (jobs/post_training.py) is measured from its
`run_job` call instead: the process started long before it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable

_pending: list = []  # the command's start, until the first job takes it


def process_start_time() -> float:
    """This process's start, in time.time() seconds: its age from /proc (clock ticks since boot,
    against /proc/uptime, both to 10 ms; psutil's create_time rounds the boot time to a second)."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux
        import psutil

        return psutil.Process().create_time()


def command_started() -> None:
    """An entry point runs: its first job measures start-up from the process's start."""
    if not _pending:
        _pending.append(process_start_time())


def take_command_start(default: float) -> float:
    """The command's start for the job starting now (once per command), else `default`."""
    if _pending and _pending[0] is not None:
        t, _pending[0] = _pending[0], None
        return t
    return default


def first_step_figures(step_records: Iterable[Dict[str, Any]], start: float) -> Dict[str, float]:
    """{"first_step_s", "startup_s"} from the first step record written after `start` (see the
    module docstring), or {} when this job ran no step."""
    for r in step_records:
        if r.get("time", 0.0) >= start and "step_s" in r:
            end = r["time"] - start
            return {"first_step_s": round(end, 2), "startup_s": round(end - r["step_s"], 2)}
    return {}
