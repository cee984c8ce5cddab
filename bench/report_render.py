"""Run-report cost: seconds to write report.md + plots for synthetic runs of N steps.

Each run (with two restarts, a few bad steps and validation every 50 steps; pretraining and
GRPO) is written by the test suite's simulator (tests/report_synth.py) and then reported with
`elastic.report.write_report`. Columns: the baseline `read` (load_run: parse metrics.jsonl and
events.jsonl, recovery accounting), `diagnose` (the classifier), and `report` (the whole
write_report, which includes its own read); `x read` = report / read, measured in the same run.

    python bench/report_render.py --steps 1000 10000

Prints a table and writes bench/results/report_render.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elastic.report import diagnose_run, load_run, write_report  # noqa: E402
from tests.report_synth import Sim, write_run  # noqa: E402


def best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--repeat", type=int, default=3, help="timings are the best of this many")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "report_render.json"))
    a = p.parse_args()
    import matplotlib

    write_report(tempfile.mkdtemp())  # import matplotlib & co. once, outside the timings
    rows = []
    for kind in ("pretrain", "grpo"):
        for n in a.steps:
            d = Path(tempfile.mkdtemp()) / f"{kind}-{n}"
            sim = Sim(steps=n, grpo=kind == "grpo", restarts=[(n // 3 + 3, "resize", 1), (2 * n // 3 + 7, "failure", 2)],
                      skipped={n // 2, n // 2 + 1})
            write_run(str(d), sim)
            read = best_of(a.repeat, lambda: load_run(str(d)))
            run = load_run(str(d))
            diag = best_of(a.repeat, lambda: diagnose_run(run))
            report = best_of(a.repeat, lambda: write_report(str(d)))
            pngs = len(list((d / "plots").glob("*.png")))
            rows.append({"kind": kind, "steps": n, "records": len(run.metrics), "read_s": read, "diagnose_s": diag,
                         "report_s": report, "report_over_read": report / read, "pngs": pngs,
                         "bottleneck": diagnose_run(run).name})
    print(f"{'kind':9} {'steps':>6} {'records':>7} {'read s':>7} {'diagnose s':>10} {'report s':>8} {'x read':>7} {'pngs':>4}")
    for r in rows:
        print(f"{r['kind']:9} {r['steps']:>6} {r['records']:>7} {r['read_s']:>7.3f} {r['diagnose_s']:>10.3f} "
              f"{r['report_s']:>8.2f} {r['report_over_read']:>7.1f} {r['pngs']:>4}")
    out = {"results": rows, "environment": {"python": platform.python_version(), "matplotlib": matplotlib.__version__,
                                            "machine": platform.machine(), "cpus": __import__("os").cpu_count()}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
