"""Direct preference optimisation on Ray: `python jobs/dpo.py [--config FILE] [--set key.sub=value ...]`.

Rows `prompt`, `chosen`, `rejected` (text or message lists; JSONL or Parquet) train the policy
to prefer the chosen answers relative to a frozen reference (the starting policy), on the same
elastic FSDP2 trainer as pretraining, SFT and GRPO. With no --config it runs the embedded
default, jobs/configs/dpo-code-opt.yaml: pairs from the shipped code-optimisation problems
(chosen = the fast solution, rejected = the wrong one and the slow reference), starting from
the default SFT run's last checkpoint (jobs/configs/sft-code-opt.yaml), which it trains first
when it is not there yet. `--set model.lora.rank=8` trains LoRA adapters instead of all weights.
Works locally and unchanged under `ray job submit`.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastic.config import ConfigError, load_config  # noqa: E402
from elastic.data import DataError  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "dpo-code-opt.yaml")
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
    print(f"[elastic] DPO starts from {ckpt}")
    return ckpt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help=f"YAML config (default: {DEFAULT})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set dpo.beta=0.2 (repeatable)")
    args = ap.parse_args(argv)
    path = args.config or DEFAULT
    try:
        cfg = load_config(path, args.overrides, job="dpo")
        if not cfg.model.init_from:
            cfg = load_config(path, args.overrides + [f"model.init_from={starting_policy(args.overrides)}"], job="dpo")
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from elastic.launch.cluster import ClusterError
    from elastic.launch.dpo import run_dpo
    from elastic.launch.lease import LeaseHeld
    from elastic.reward.problems import ProblemError

    try:
        res = run_dpo(cfg)
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
    from elastic.records import METRICS, read_records

    recs = [r for r in read_records(os.path.join(res.local_dir, METRICS)) if "step" in r]
    evals = [r for r in recs if "heldout_accuracy" in r]
    s = res.summary
    line = f"[elastic] done in {res.wall_s:.0f}s: loss {s.get('first_loss', float('nan')):.3f} -> {s.get('last_loss', float('nan')):.3f}"
    if recs and "reward_margin" in recs[-1]:
        line += f", margin {recs[0].get('reward_margin', 0):.3f} -> {recs[-1]['reward_margin']:.3f}"
    if evals:
        line += (f"; held-out accuracy {evals[0]['heldout_accuracy']:.2f} (step {evals[0]['step']}) -> "
                 f"{evals[-1]['heldout_accuracy']:.2f} (step {evals[-1]['step']}), margin {evals[-1]['heldout_reward_margin']:.3f} "
                 f"on {evals[-1]['heldout_pairs']} pairs")
    print(line)
    print(f"[elastic] checkpoints: {res.run_dir}  (latest: {res.checkpoint})")
    print(f"[elastic] metrics:     {os.path.join(res.local_dir, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
