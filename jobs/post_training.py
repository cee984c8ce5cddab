"""The command line shared by the jobs that start from a fine-tuned policy (jobs/grpo.py,
jobs/dpo.py, jobs/reward_model.py): `--config`/`--set`, the SFT chain when `model.init_from` is
empty, the reward-model chain when `reward.kind` has a `model` term and `reward.model_path` is
empty (`reward.model_config`), one-line errors with the documented exit codes, and the closing
console lines. Each job supplies its runner and the lines that say how its run went.
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


# Where runs live, logging, and how the cluster is used carry over to a chained run (SFT, reward model).
CARRIED = ("run.storage_path=", "wandb.", "scaling.use_gpu=", "scaling.fit=", "scaling.resource_wait_s=")


def carried(overrides: List[str]) -> List[str]:
    return [o for o in overrides if o.startswith(CARRIED)]


def starting_policy(label: str, overrides: List[str], sft_config: str = "") -> str:
    """The SFT run's final checkpoint (`sft_config`, default jobs/configs/sft-code-opt.yaml; its
    train.until_step when set), training it first when it is missing."""
    from elastic.config import run_dir
    from elastic.launch.grpo import latest_checkpoint
    from elastic.launch.pretrain import run_pretraining

    sft_config = sft_config or SFT_DEFAULT
    sft = load_config(sft_config, carried(overrides))
    ckpt = latest_checkpoint(run_dir(sft))
    last = sft.train.until_step or sft.train.steps  # a schedule stopped early (train.until_step) ends there
    if ckpt is None or not ckpt.endswith(f"step_{last:08d}"):
        print(f"[elastic] no finished SFT policy at {run_dir(sft)}: running jobs/sft.py --config "
              f"{os.path.relpath(sft_config)} first")
        res = run_pretraining(sft, kind="sft")
        if res.stopped:
            raise SystemExit(f"[elastic] SFT stopped: {res.stopped}")
        ckpt = res.checkpoint
    print(f"[elastic] {label} starts from {ckpt}")
    return ckpt


def needs_reward_model(cfg) -> bool:
    from elastic.reward.verifiers.registry import parse_kind

    return "model" in dict(parse_kind(cfg.reward.kind))


def check_reward_model_source(cfg) -> None:
    """Before any work (the SFT chain included): a `model` reward term has a reward model to
    read, or a config that makes one. One ConfigError line naming the key and the command."""
    from elastic.config import ConfigError as Err

    r = cfg.reward
    make = (f"python jobs/reward_model.py --config {r.model_config}" if r.model_config
            else "python jobs/reward_model.py --config jobs/configs/rm-math-tasks.yaml (or your own reward-model config)")
    if not r.model_path and not r.model_config:
        raise Err("reward.model_path: reward.kind has a 'model' term but neither reward.model_path nor "
                  f"reward.model_config is set; train one with: {make}")
    if r.model_path and "://" not in r.model_path and not os.path.exists(r.model_path):
        raise Err(f"reward.model_path {r.model_path}: not found; make it with: {make}, "
                  "or leave reward.model_path empty and set reward.model_config to train it first")
    if not r.model_path and not os.path.exists(r.model_config):
        raise Err(f"reward.model_config {r.model_config}: no such file")


def reward_model_checkpoint(overrides: List[str], rm_config: str) -> str:
    """The reward-model run's final checkpoint (`rm_config`), trained first when it is missing,
    from its own starting policy (its `model.init_from`, or its SFT chain)."""
    from elastic.config import run_dir
    from elastic.launch.grpo import latest_checkpoint
    from elastic.launch.reward_model import run_reward_model

    keep = carried(overrides)
    rm = load_config(rm_config, keep, job="reward_model")
    ckpt = latest_checkpoint(run_dir(rm))
    if ckpt is None or not ckpt.endswith(f"step_{rm.train.steps:08d}"):
        print(f"[elastic] no finished reward model at {run_dir(rm)}: running jobs/reward_model.py --config "
              f"{os.path.relpath(rm_config)} first")
        if not rm.model.init_from:
            policy = starting_policy("reward-model training", overrides, rm.model.init_sft_config)
            rm = load_config(rm_config, keep + [f"model.init_from={policy}"], job="reward_model")
        res = run_reward_model(rm)
        if res.stopped:
            raise SystemExit(f"[elastic] reward-model training stopped: {res.stopped}")
        ckpt = res.checkpoint
    print(f"[elastic] reward model: {ckpt}")
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
        chained: List[str] = []
        rm_chain = job == "grpo" and needs_reward_model(cfg)
        if rm_chain:
            check_reward_model_source(cfg)
        if not cfg.model.init_from:
            # The SFT chain is a run of its own: its cluster, lease and data errors are one line too.
            policy, code = run_or_exit_code(starting_policy, label, args.overrides, cfg.model.init_sft_config)
            if policy is None:
                return code
            chained.append(f"model.init_from={policy}")
        if rm_chain and not cfg.reward.model_path:  # the reward model is a run of its own too
            rm, code = run_or_exit_code(reward_model_checkpoint, args.overrides, cfg.reward.model_config)
            if rm is None:
                return code
            chained.append(f"reward.model_path={rm}")
        if chained:
            cfg = load_config(path, args.overrides + chained, job=job)
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
