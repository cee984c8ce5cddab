"""GRPO on Ray: `python jobs/grpo.py [--config FILE] [--set key.sub=value ...]`.

The policy writes C/C++ for the shipped code-optimisation problems, the sandboxed reward service
(a Ray actor pool on CPU workers) compiles, tests and times it, and the policy learns from the
group-normalised rewards. With no --config it runs the embedded default,
jobs/configs/grpo-code-opt.yaml, starting from the default SFT run's last checkpoint
(jobs/configs/sft-code-opt.yaml), which it trains first when it is not there yet. Works locally
and unchanged under `ray job submit`.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastic.config import ConfigError, load_config  # noqa: E402
from elastic.data import DataError  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "grpo-code-opt.yaml")
SFT_DEFAULT = os.path.join(HERE, "configs", "sft-code-opt.yaml")


def starting_policy(overrides) -> str:
    """The default SFT run's final checkpoint, training it first when it is missing."""
    from elastic.config import run_dir
    from elastic.launch.grpo import latest_checkpoint
    from elastic.launch.pretrain import run_pretraining

    sft = load_config(SFT_DEFAULT, [o for o in overrides if o.startswith(("run.storage_path=", "wandb."))])
    ckpt = latest_checkpoint(run_dir(sft))
    if ckpt is None or not ckpt.endswith(f"step_{sft.train.steps:08d}"):
        print(f"[elastic] no finished SFT policy at {run_dir(sft)}: running jobs/sft.py's default first")
        res = run_pretraining(sft, kind="sft")
        if res.stopped:
            raise SystemExit(f"[elastic] SFT stopped: {res.stopped}")
        ckpt = res.checkpoint
    print(f"[elastic] GRPO starts from {ckpt}")
    return ckpt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help=f"YAML config (default: {DEFAULT})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set rl.group_size=8 (repeatable)")
    args = ap.parse_args(argv)
    path = args.config or DEFAULT
    try:
        cfg = load_config(path, args.overrides, job="grpo")
        if not cfg.model.init_from:
            cfg = load_config(path, args.overrides + [f"model.init_from={starting_policy(args.overrides)}"], job="grpo")
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from elastic.launch.cluster import ClusterError
    from elastic.launch.grpo import run_grpo
    from elastic.launch.lease import LeaseHeld
    from elastic.reward.problems import ProblemError

    try:
        res = run_grpo(cfg)
    except (DataError, ProblemError, ConfigError) as e:
        print(f"{'config' if isinstance(e, ConfigError) else 'data'} error: {e}", file=sys.stderr)
        return 2
    except LeaseHeld as e:
        print(f"run error: {e}", file=sys.stderr)
        return 3
    except ClusterError as e:
        print(f"cluster error: {e}", file=sys.stderr)
        return 4
    if res.stopped:
        print(f"[elastic] run stopped at its own request: {res.stopped}", file=sys.stderr)
        return 5
    s = res.summary
    r = s.get("reward") or {}
    if r:
        print(f"[elastic] done in {res.wall_s:.0f}s: mean reward {r['first']:.3f} -> {r['last']:.3f}, pass rate "
              f"{r['first_pass']:.0%} -> {r['last_pass']:.0%} (means of the first and last {r['window']} steps)")
    print(f"[elastic] checkpoints: {res.run_dir}  (latest: {res.checkpoint})")
    print(f"[elastic] metrics:     {os.path.join(res.records_dir or res.local_dir, 'metrics.jsonl')}")
    print(f"[elastic] rollouts:    {os.path.join(res.records_dir or res.local_dir, 'rollouts.jsonl')} (every completion and its verdict)")
    if s.get("report"):
        print(f"[elastic] report:      {s['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
