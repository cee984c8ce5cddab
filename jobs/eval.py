"""Evaluate checkpoints on tasks, on Ray: `python jobs/eval.py --model <run | run/step_N | hf dir> [...] --tasks <name | task.yaml> [...]`.

With a run directory, every checkpoint in it is evaluated (a metric-vs-step plot per task is
written). Tasks are shipped names (datasets/eval/tasks: hellaswag, arc_easy,
mmlu_elementary_mathematics, gsm8k, humaneval, heldout_text) or task YAML paths (format in
elastic/eval/spec.py). Results: a console table, `<out>/eval.json` with per-item records.
A rerun with the same --out computes only the items not done yet (--fresh to start over).
`--contamination RUN` reports 13-gram overlap of each task's items with RUN's training data.

With no arguments it evaluates every checkpoint of the default pretraining run (runs/tiny-demo)
on every shipped task and checks them for contamination with that run's training data.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_MODEL = "runs/tiny-demo"
DEFAULT_TASKS = ["heldout_text", "hellaswag", "arc_easy", "mmlu_elementary_mathematics", "gsm8k", "humaneval", "python_heldout"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=[DEFAULT_MODEL], help=f"run dirs, checkpoints or HF dirs (default {DEFAULT_MODEL})")
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, help=f"task names or YAML paths (default {' '.join(DEFAULT_TASKS)})")
    ap.add_argument("--out", default="", help="output directory (default <run>/eval, or ./eval-results)")
    ap.add_argument("--limit", type=int, default=0, help="first N items of every task (0: each task's own limit)")
    ap.add_argument("--workers", type=int, default=0, help="Ray workers (default: one per GPU, else 2)")
    ap.add_argument("--cpus-per-worker", type=float, default=1.0)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--weights", default="full", choices=("full", "int8", "int4"),
                    help="generation tasks: generate with weight-only quantized weights (int4: CUDA only; default full)")
    ap.add_argument("--token-budget", type=int, default=8192, help="tokens per scoring forward")
    ap.add_argument("--fresh", action="store_true", help="recompute every item (default: resume)")
    ap.add_argument("--contamination", default="", metavar="RUN", help="report 13-gram overlap with RUN's training data cache")
    ap.add_argument("--allow-weak-isolation", action="store_true", help="run code tasks without bubblewrap (not for untrusted models)")
    args = ap.parse_args(argv)
    if args.model == [DEFAULT_MODEL] and not args.contamination:
        args.contamination = DEFAULT_MODEL
        if not os.path.isdir(DEFAULT_MODEL):
            print(f"config error: {DEFAULT_MODEL}: no such run (run `python jobs/pretrain.py` first, or pass --model)", file=sys.stderr)
            return 2

    from elastic.eval.spec import EvalConfigError
    from elastic.launch.eval import EvalRequest, run_eval
    from jobs.pretrain import run_or_exit_code

    req = EvalRequest(models=args.model, tasks=args.tasks, out_dir=args.out, workers=args.workers,
                      cpus_per_worker=args.cpus_per_worker, limit=args.limit, token_budget=args.token_budget,
                      dtype=args.dtype, resume=not args.fresh, allow_weak_isolation=args.allow_weak_isolation, weights=args.weights)
    try:
        res, code = run_or_exit_code(run_eval, req)
    except EvalConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if res is None:
        return code
    if args.contamination:
        from elastic.launch.eval import contamination_report

        for line in contamination_report(args.contamination, res):
            print(line)
    for p in res.plots:
        print(f"[eval] plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
