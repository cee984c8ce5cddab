"""Pretrain a Llama-style model on Ray: `python jobs/pretrain.py [--config FILE] [--set key.sub=value ...]`.

Works locally and unchanged under `ray job submit --working-dir . -- python jobs/pretrain.py ...`.
The cluster is the one in RAY_ADDRESS, else the one `ray start` recorded on this machine, else
a private local instance (the first console line says which). With no --config it runs the
embedded default: the `tiny` model on the Python standard library's sources, with held-out
evaluation every 50 steps (jobs/configs/tiny.yaml spells it out).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import ConfigError, load_config  # noqa: E402
from elastic.data import DataError  # noqa: E402


# The embedded default is the schema's defaults plus held-out evaluation every 50 steps: the
# validation loss on held-out stdlib shards and bits per byte on the shipped heldout_text task
# (elastic/eval), both in the run report. jobs/configs/tiny.yaml spells out the same.
EMBEDDED_EVAL = ["eval.every_steps=50", "eval.tasks=[heldout_text]"]


def run_or_exit_code(run, *args):
    """(run(*args), 0), or (None, exit code) after a one-line message for the failures a user
    can act on: bad config or input 2, the run directory in use 3, a cluster that cannot hold
    the run 4 (README "The pipeline"), stopped by SIGINT 130 or SIGTERM 143 (with the command
    that resumes it: elastic/launch/runtime/stop.py). Shared by every entry point."""
    from elastic.launch.runtime import startup, stop
    from elastic.launch.runtime.cluster import ClusterError
    from elastic.launch.runtime.lease import LeaseHeld
    from elastic.reward.verifiers.code_opt.problems import ProblemError

    stop.install()
    startup.command_started()  # the first job's start-up counts from this process's start
    try:
        return run(*args), 0
    except (DataError, ProblemError, ConfigError) as e:  # ConfigError: checked against the inputs at plan time
        print(f"{'config' if isinstance(e, ConfigError) else 'data'} error: {e}", file=sys.stderr)
        return None, 2
    except LeaseHeld as e:
        print(f"run error: {e}", file=sys.stderr)
        return None, 3
    except ClusterError as e:
        print(f"cluster error: {e}", file=sys.stderr)
        return None, 4
    except BaseException as e:
        stopped = stop.as_stop(e)
        if stopped is None:
            raise
        where = (f"the relaunch resumes from {stopped.checkpoint}" if stopped.checkpoint
                 else "no checkpoint was registered yet: the relaunch starts the run over")
        print(f"[elastic] stopped by {stopped.name}; {where}. Resume with: {stop.relaunch_command()}",
              file=sys.stderr, flush=True)
        return None, stopped.exit_code


def main(argv=None, kind: str = "pretrain", default_config: str = "", doc: str = "") -> int:
    """The command line of the language-modelling jobs (pretrain, SFT)."""
    ap = argparse.ArgumentParser(description=(doc or __doc__).splitlines()[0])
    ap.add_argument("--config", help=f"YAML config (default: {default_config or 'the embedded tiny/stdlib default'})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set train.steps=20 (repeatable)")
    args = ap.parse_args(argv)
    try:
        embedded = not (args.config or default_config)
        cfg = load_config(args.config or default_config or None,
                          (EMBEDDED_EVAL if embedded and kind == "pretrain" else []) + args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from elastic.launch.pretrain import run_pretraining

    res, code = run_or_exit_code(run_pretraining, cfg, kind)
    if res is None:
        return code
    s = res.summary
    if res.stopped:
        print(f"[elastic] run stopped at its own request: {res.stopped}", file=sys.stderr)
        print(f"[elastic] last good checkpoint: {res.checkpoint}", file=sys.stderr)
        return 5
    goodput = f", goodput {s['goodput']:.0%}" if s.get("goodput") is not None else ""
    print(f"{res.done()}: loss {s.get('first_loss', float('nan')):.3f} -> "
          f"{s.get('last_loss', float('nan')):.3f}, {s.get('tokens_per_s', 0):.0f} tokens/s over {s.get('steady_steps', 0)} "
          f"steady steps{goodput}")
    ev = s.get("evaluation")
    if ev:
        print("[elastic] held-out: " + "; ".join(
            f"{k} {e['first']:.4g} (step {e['first_step']}) -> {e['last']:.4g} (step {e['last_step']})" if e["last_step"] != e["first_step"]
            else f"{k} {e['last']:.4g} (step {e['last_step']})" for k, e in ev.items()))
    bad = s.get("bad_rows_detail")
    if bad and bad.get("counts"):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(bad["counts"].items()))
        print(f"[elastic] skipped or cut {sum(bad['counts'].values())} rows ({counts}); first: {'; '.join(bad.get('examples', []))}")
    print(f"[elastic] checkpoints: {res.run_dir}  (latest: {res.checkpoint})")
    print(f"[elastic] metrics:     {os.path.join(res.records_dir or res.local_dir, 'metrics.jsonl')}")
    print(f"[elastic] summary:     {os.path.join(res.local_dir, 'summary.json')}")
    if s.get("report"):
        print(f"[elastic] report:      {s['report']} (plots in {os.path.join(res.local_dir, 'plots')})")
    print(f"[elastic] events:      {os.path.join(res.records_dir or res.local_dir, 'events.jsonl')}")
    print(f"[elastic] logs:        {res.ray_logs} (worker output)")
    if s.get("restarts"):
        from elastic.report.recovery import analyze, format_table

        print(format_table(analyze(res.records_dir or res.local_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
