"""Driver side of GRPO: check the problems and the starting policy, start the run's one shared
reward service, run the elastic TorchTrainer with the GRPO job, stop the service.

Everything that can be wrong with the input (a missing problem directory or held-out id, a
malformed problem, a starting checkpoint without a tokenizer) is a one-line error here, before
any worker starts.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Optional

from elastic.config import Config, ConfigError, to_dict
from elastic.data.chat import ChatFormat
from elastic.data.sources import DataError
from elastic.data.tokenizer import load_or_train
from elastic.launch.pretrain import (PretrainResult, RunPaths, build_torch_trainer, ensure_ray, ray_logs_dir, run_paths,
                                     summarize, use_gpu)
from elastic.records import EVENTS, read_records


def policy_tokenizer(cfg: Config) -> str:
    """The tokenizer.json of the starting policy: `data.tokenizer` if set, else the one next to
    `model.init_from` (our run directory for `<run>/step_N`, or the Hugging Face directory)."""
    if cfg.data.tokenizer:
        return cfg.data.tokenizer
    src = cfg.model.init_from
    if not src:
        raise ConfigError("model.init_from: GRPO starts from a trained policy (an SFT checkpoint <run>/step_N "
                          "or a Hugging Face directory); jobs/grpo.py runs the default SFT first when it is empty")
    for cand in (os.path.join(src, "tokenizer.json"), os.path.join(os.path.dirname(os.path.abspath(src)), "tokenizer.json")):
        if os.path.isfile(cand):
            return cand
    raise DataError(f"model.init_from {src}: no tokenizer.json in it or in its run directory (set data.tokenizer)")


def reward_service_name(cfg: Config) -> str:
    return f"elastic-reward-{cfg.run.name}"


def run_grpo(cfg: Config) -> PretrainResult:
    from elastic.reward.problems import load_problems
    from elastic.reward.service import start_service
    from elastic.rl.grpo import grpo_loop_per_worker
    from elastic.rl.split import split_problems

    paths: RunPaths = run_paths(cfg)
    os.makedirs(paths.local_dir, exist_ok=True)
    t0 = time.time()
    problems = load_problems(cfg.rl.problems)  # ProblemError: one line naming the file and field
    split = split_problems(problems, cfg.rl.heldout, where=cfg.rl.problems)
    tok_path = policy_tokenizer(cfg)
    tok = load_or_train(tok_path, "", [], cfg.data.vocab_size)
    run_tok = os.path.join(paths.local_dir, "tokenizer.json")
    if os.path.abspath(tok_path) != os.path.abspath(run_tok):  # the run carries its tokenizer (export, reports)
        shutil.copyfile(tok_path, run_tok)
    chat = ChatFormat(chat_template=None if cfg.sft.template == "builtin" else tok.chat_template,
                      eos_token=tok.eos_token, bos_token=tok.bos_token)
    print(f"[elastic] GRPO: {len(split.train)} training problems, {len(split.heldout)} held out; "
          f"{cfg.rl.prompts_per_step} prompts x {cfg.rl.group_size} samples per step; policy from {cfg.model.init_from}")
    with open(os.path.join(paths.local_dir, "config.json"), "w") as f:
        json.dump(to_dict(cfg), f, indent=2)
    ensure_ray(cfg)
    service = start_service(cfg.reward, cfg.rl.problems, name=reward_service_name(cfg), problems=problems)
    try:
        trainer = build_torch_trainer(cfg, paths, use_gpu(cfg), grpo_loop_per_worker,
                                      {"tokenizer_json": tok.json, "chat_format": chat, "eos_id": tok.eos_id,
                                       "reward_service": reward_service_name(cfg)})
        result = trainer.fit()
    finally:
        service.shutdown()
    ckpt = result.checkpoint.path if result.checkpoint is not None else None
    if result.error is not None:
        raise result.error
    wall = time.time() - t0
    stops = [e for e in read_records(os.path.join(paths.local_dir, EVENTS)) if e.get("event") == "stop" and e["time"] >= t0]
    return PretrainResult(paths.run_dir, paths.local_dir, wall, ckpt, summarize(paths, wall, ckpt), ray_logs_dir(),
                          stopped=stops[-1]["reason"] if stops else None)


def latest_checkpoint(run_dir: str) -> Optional[str]:
    from elastic.train.checkpoint import latest_complete

    found = latest_complete(run_dir)
    return found[0] if found else None
