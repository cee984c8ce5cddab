"""Scaling-law ladder: `python jobs/ladder.py [--config FILE] [--set key.sub=value ...] [--smoke] [--fit-only]`.

A grid of ordinary pretraining runs (model sizes x FLOP budgets or token counts, the `ladder`
section of the config), each resumable on its own, then Chinchilla's approach 3 (with bootstrap
intervals) and approach 2 fitted to their held-out losses, the largest cells predicted from the
others, and fit.json plus plots written in the ladder directory (docs/ladder.md). A finished
cell is never re-run: the same command continues a killed ladder. Presets:
jobs/configs/ladder-cpu.yaml, jobs/configs/ladder-gpu.yaml; --smoke is a 2x2 ladder for CI.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import ConfigError  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="YAML config with a `ladder` section (e.g. jobs/configs/ladder-cpu.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set ladder.concurrent=4 (repeatable)")
    ap.add_argument("--smoke", action="store_true", help="a 2x2 ladder of tiny cells, a few steps each (CI)")
    ap.add_argument("--fit-only", action="store_true", help="run no cell: fit and plot the finished ones")
    args = ap.parse_args(argv)
    from jobs.pretrain import run_or_exit_code
    from elastic.launch.ladder import run_ladder

    try:
        from elastic.launch.ladder import plan_ladder

        plan_ladder(args.config, args.overrides, args.smoke)  # every config error before anything starts
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    res, code = run_or_exit_code(run_ladder, args.config, args.overrides, args.smoke, args.fit_only)
    if res is None:
        return code
    print(f"[ladder] done in {res.wall_s:.0f}s: {len(res.ran)} cell(s) run, {len(res.skipped)} already finished, "
          f"{len(res.failed)} failed")
    print(f"[ladder] cells:  {os.path.join(res.dir, 'cells')}/*.json")
    print(f"[ladder] events: {os.path.join(res.dir, 'ladder.jsonl')}")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
