"""`python -m elastic.report <run dir> [--out DIR]`: write report.md and plots for a run
(finished, in progress or crashed) and print the named bottleneck."""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m elastic.report", description=__doc__)
    p.add_argument("run_dir", help="the run directory (<run.storage_path>/<run.name>) holding metrics.jsonl")
    p.add_argument("--out", default=None, help="where to write report.md and plots/ (default: the run directory)")
    a = p.parse_args(argv)
    from elastic.report import build_report

    t0 = time.perf_counter()
    try:
        path, run, d = build_report(a.run_dir, a.out)
    except FileNotFoundError as e:
        print(f"report error: {e}", file=sys.stderr)
        return 2
    print(f"[elastic] {run.name}: {run.status.state} ({run.status.detail})")
    print(f"[elastic] bottleneck: {d.name}: {d.evidence}")
    print(f"[elastic] lever: {d.lever}")
    print(f"[elastic] report: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
