"""Elastic drill on one machine: `python jobs/elastic_drill.py [--steps 30] [--out DIR]`.

Starts a real multi-node Ray cluster (`ray start` head + nodes, token auth), runs the tiny
pretraining job elastically (1..2 workers), adds a node, kills a node, SIGKILLs a train
worker, then prints restarts, recovery seconds, steps redone, goodput, the sample-ledger
check and the loss difference from a fixed-size run; writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.launch.drill import print_report, run_drill  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None, help="working directory (default: a new temp dir)")
    ap.add_argument("--json", default="bench/results/elastic_drill.json", help="where to write the figures")
    ap.add_argument("--no-baseline", action="store_true", help="skip the fixed-world-size comparison run")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="elastic-drill-")
    r = run_drill(out, steps=a.steps, baseline=not a.no_baseline)
    print_report(r)
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)
        print(f"figures: {a.json}; logs and run dirs: {out}")
    ok = r["exit_code"] == 0 and r["ledger"]["ok"] and r["cache"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
