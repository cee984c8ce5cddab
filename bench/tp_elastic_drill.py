"""An elastic run under tensor or pipeline parallelism on one machine: it grows from 2 workers
(FSDP 1 x TP 2, or PP 2 x FSDP 1) to 4 (2 data-parallel replicas) when a node joins, optionally
loses that node again (--shrink: SIGKILL, back to 2 workers from the last checkpoint), and its
ledger and losses equal a fixed 2-worker FSDP run's. The data-parallel axis is the elastic one:
tp and pp stay as they are.

  python bench/tp_elastic_drill.py [--layout tp|pp] [--shrink] [--steps 16] [--json out.json]

A local Ray cluster (head with 2 `trainer` slots), the drill's tiny pretraining config
(elastic/launch/drill.py) with parallel.tp 2 or parallel.pp 2 (pp: without in-training task
evaluation, which does not pipeline yet); after 3 steps a second node with 2 slots joins; with
--shrink it is killed after 2 steps at 4 workers. Prints the world size of every step, whether
the ledgers match, and the largest relative loss difference (redone steps included); writes JSON
with --json; deletes its run directories.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from elastic.launch.drill import Job, drill_overrides  # noqa: E402
from elastic.launch.runtime.local_cluster import LocalCluster  # noqa: E402
from elastic.records import read_records  # noqa: E402


def ledger(path: str) -> dict:
    """step -> the sample ids of its last completion, ranks in order. A step redone after a
    resize replaces the aborted attempt's records (another world size: other ranks)."""
    by: dict = {}
    world: dict = {}
    for r in read_records(path):
        if world.get(r["step"]) != r["world_size"]:
            by[r["step"]], world[r["step"]] = {}, r["world_size"]
        by[r["step"]][r["rank"]] = r["sample_ids"]
    return {s: sum((v[k] for k in sorted(v)), []) for s, v in by.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", default="")
    ap.add_argument("--layout", choices=("tp", "pp"), default="tp", help="parallel.tp 2 or parallel.pp 2")
    ap.add_argument("--shrink", action="store_true", help="kill the joined node after 2 steps at 4 workers")
    a = ap.parse_args(argv)
    layout = (["parallel.tp=2"] if a.layout == "tp"
              else ["parallel.pp=2", "parallel.pp_microbatches=2", "eval.tasks=[]"])
    out = tempfile.mkdtemp(prefix="elastic-tp-drill-")
    storage = os.path.join(out, "runs")
    cluster = LocalCluster(head_cpus=3, head_resources={"trainer": 2},
                           env={"PYTHONPATH": REPO, "RAY_TRAIN_ENABLE_STATE_TRACKING": "0"}).start()
    try:
        t0 = time.time()
        grow = Job(cluster, storage, "grow", drill_overrides(storage, "grow", a.steps, 2, 4, layout + ["scaling.cpus_per_worker=0.5"]),
                   os.path.join(out, "grow.log"))
        grow.wait_for(lambda: grow.steps_at(2, t0) >= 3, "3 steps at world size 2", 600)
        node = cluster.add_node(num_cpus=2, resources={"trainer": 2})
        t1 = time.time()
        grow.wait_for(lambda: grow.steps_at(4, t1) >= 2, "2 steps at world size 4", 600)
        if a.shrink:
            node.kill()
            t2 = time.time()
            grow.wait_for(lambda: grow.steps_at(2, t2) >= 2, "2 steps at world size 2 after the node's loss", 600)
        rc_grow = grow.finish(600)
        rc_base = Job(cluster, storage, "base", drill_overrides(storage, "base", a.steps, 2, 2), os.path.join(out, "base.log")).finish(600)
        mg = [r for r in read_records(os.path.join(storage, "grow", "metrics.jsonl")) if "step" in r]
        mb = [r for r in read_records(os.path.join(storage, "base", "metrics.jsonl")) if "step" in r]
        base_loss = {r["step"]: r["loss"] for r in mb}
        res = {
            "layout": a.layout, "shrink": a.shrink,
            "exit": [rc_grow, rc_base],
            "worlds": [(r["step"], r["world_size"]) for r in mg],
            "meshes": [e.get("mesh") for e in read_records(os.path.join(storage, "grow", "events.jsonl")) if e.get("event") == "start"],
            "ledger_equal": ledger(os.path.join(storage, "grow", "ledger.jsonl")) == ledger(os.path.join(storage, "base", "ledger.jsonl")),
            "max_rel_loss_diff": max(abs(r["loss"] - base_loss[r["step"]]) / abs(base_loss[r["step"]]) for r in mg),
        }
    finally:
        cluster.stop()
        shutil.rmtree(out, ignore_errors=True)
    print(f"exit codes (grow, base): {res['exit']}")
    print(f"layouts: {' -> '.join(res['meshes'])}")
    print("step: world size  " + " ".join(f"{s}:{w}" for s, w in res["worlds"]))
    print(f"ledger equal to the fixed 2-worker FSDP run: {res['ledger_equal']}; "
          f"max |loss - base| / base over every step: {res['max_rel_loss_diff']:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["ledger_equal"] and res["exit"] == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
