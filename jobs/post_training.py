"""The command line shared by the jobs that start from a fine-tuned policy (jobs/grpo.py,
jobs/dpo.py): `--config`/`--set`, the SFT chain when `model.init_from` is empty, one-line errors
with the documented exit codes, and the closing console lines. Each job supplies its runner and
the lines that say how its run went.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastic.config import ConfigError, load_config  # noqa: E402
from jobs.pretrain import run_or_exit_code  # noqa: E402

SFT_DEFAULT = os.path.join(HERE, "configs", "sft-code-opt.yaml")


def starting_policy(label: str, overrides: List[str], sft_config: str = "") -> str:
    """The SFT run's final checkpoint (`sft_config`, default jobs/configs/sft-code-opt.yaml),
    training it first when it is missing."""
    from elastic.config import run_dir
    from elastic.launch.grpo import latest_checkpoint
    from elastic.launch.pretrain import run_pretraining

    # Where runs live, logging, and how the cluster is used carry over to the SFT run.
    carried = ("run.storage_path=", "wandb.", "scaling.use_gpu=", "scaling.fit=", "scaling.resource_wait_s=")
    sft_config = sft_config or SFT_DEFAULT
    sft = load_config(sft_config, [o for o in overrides if o.startswith(carried)])
    ckpt = latest_checkpoint(run_dir(sft))
    if ckpt is None or not ckpt.endswith(f"step_{sft.train.steps:08d}"):
        print(f"[elastic] no finished SFT policy at {run_dir(sft)}: running jobs/sft.py --config "
              f"{os.path.relpath(sft_config)} first")
        res = run_pretraining(sft, kind="sft")
        if res.stopped:
            raise SystemExit(f"[elastic] SFT stopped: {res.stopped}")
        ckpt = res.checkpoint
    print(f"[elastic] {label} starts from {ckpt}")
    return ckpt


def main(argv, *, job: str, label: str, default_config: str, doc: str, example: str,
         run: Callable, summary: Callable[[object], List[str]]) -> int:
    """Parse, load and validate the config (chaining the SFT default when `model.init_from` is
    empty), run `run(cfg)`, and print `summary(result)` and where the run's files are."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--config", help=f"YAML config (default: {default_config})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help=f"override a config value, e.g. --set {example} (repeatable)")
    args = ap.parse_args(argv)
    path = args.config or default_config
    try:
        cfg = load_config(path, args.overrides, job=job)
        if not cfg.model.init_from:
            # The SFT chain is a run of its own: its cluster, lease and data errors are one line too.
            policy, code = run_or_exit_code(starting_policy, label, args.overrides, cfg.model.init_sft_config)
            if policy is None:
                return code
            cfg = load_config(path, args.overrides + [f"model.init_from={policy}"], job=job)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    res, code = run_or_exit_code(run, cfg)
    if res is None:
        return code
    if res.stopped:
        print(f"[elastic] run stopped at its own request: {res.stopped}", file=sys.stderr)
        return 5
    for line in summary(res):
        print(line)
    records = res.records_dir or res.local_dir
    print(f"[elastic] checkpoints: {res.run_dir}  (latest: {res.checkpoint})")
    print(f"[elastic] metrics:     {os.path.join(records, 'metrics.jsonl')}")
    if res.summary.get("report"):
        print(f"[elastic] report:      {res.summary['report']}")
    return 0
