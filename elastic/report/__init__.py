"""Run report: `report.md` with a summary table naming the run's bottleneck, plus PNG plots.

`write_report(run_dir)` is what the launcher calls at the end of every run (finished, stopped or
crashed) and what `python -m elastic.report <run dir>` runs by hand, also on a run still in
progress. `diagnose` (elastic/report/bottleneck.py) is the pure classifier behind the verdict;
matplotlib is imported only when plots are drawn.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

from elastic.report.bottleneck import THRESHOLDS, Diagnosis, Finding, diagnose
from elastic.report.run import RunData, Status, load_run

REPORT = "report.md"
BOTTLENECK = "bottleneck.json"
PLOTS_DIR = "plots"

__all__ = ["THRESHOLDS", "Diagnosis", "Finding", "RunData", "Status", "diagnose", "diagnose_run", "load_run",
           "write_report", "build_report", "REPORT"]


def diagnose_run(run: RunData) -> Diagnosis:
    """The named bottleneck of a loaded run."""
    return diagnose(run.metrics, run.events, run.recovery, run.config, run.device)


def write_report(run_dir: str, out_dir: Optional[str] = None, now: Optional[float] = None) -> str:
    """Write `report.md`, `plots/*.png` and `bottleneck.json` into `out_dir` (default: the run
    directory) and return the path of report.md. Raises FileNotFoundError when `run_dir` does
    not exist; any content it holds (even none) gives a report. `now` (unix seconds) is only
    for deciding whether a run without a summary is still in progress."""
    return build_report(run_dir, out_dir, now)[0]


def build_report(run_dir: str, out_dir: Optional[str] = None, now: Optional[float] = None,
                 records_dir: Optional[str] = None, job_s: Optional[float] = None) -> Tuple[str, RunData, Diagnosis]:
    """write_report, also returning the loaded run and its diagnosis (for the console).
    `records_dir`: metrics/events when they are not in `run_dir` (a remote run directory).
    `job_s`: this invocation's job time, from the driver (its summary.json comes later)."""
    from elastic.report.plots import write_plots
    from elastic.report.render import render_markdown

    run = load_run(run_dir, now=now, records_dir=records_dir)
    if job_s is not None:
        run.job_s = job_s
    out_dir = out_dir or run_dir
    os.makedirs(out_dir, exist_ok=True)
    diag = diagnose_run(run)
    plots = write_plots(run, os.path.join(out_dir, PLOTS_DIR), diag)
    path = os.path.join(out_dir, REPORT)
    verdict = {"status": {"state": run.status.state, "detail": run.status.detail}, **diag.to_dict()}
    _replace(os.path.join(out_dir, BOTTLENECK), json.dumps(verdict, indent=2, default=str))
    _replace(path, render_markdown(run, diag, plots, out_dir))
    return path, run, diag


def _replace(path: str, text: str) -> None:
    """Write then rename: a reader of a live run's report never sees half a file."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
