"""Driver side of GRPO: check the problems and the starting policy, start the run's one shared
reward service, run the elastic TorchTrainer with the GRPO job, stop the service.

Everything that can be wrong with the input (a missing problem directory or held-out id, a
malformed problem, a starting checkpoint without a tokenizer) is a one-line error here, before
any worker starts.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, TextIO, Tuple

from elastic.config import Config, ConfigError
from elastic.config.load import resolved_tokenizer
from elastic.data.chat import ChatFormat
from elastic.data.sources import DataError
from elastic.data.tokenizer import load_or_train
from elastic.launch.data_plans import keep_tokenizer, role_marker_warning
from elastic.launch.driver import JobLaunch, JobResult, RunPaths, build_torch_trainer, run_job
# (before any Ray activity: see elastic/launch/pretrain.py)
from elastic.reward.service import start_service
from elastic.rl.grpo import grpo_loop_per_worker
from elastic.data.code_opt import prompt_text


def policy_tokenizer(cfg: Config) -> str:
    """The tokenizer.json of the starting policy (the one that comes with `model.init_from`:
    our run directory for `<run>/step_N`, or the Hugging Face directory)."""
    if not cfg.model.init_from:
        raise ConfigError("model.init_from: GRPO starts from a trained policy (an SFT checkpoint <run>/step_N "
                          "or a Hugging Face directory); jobs/grpo.py runs the default SFT first when it is empty")
    path = resolved_tokenizer(cfg)
    if not path or not os.path.isfile(path):
        raise DataError(f"model.init_from {cfg.model.init_from}: no tokenizer.json with it (set data.tokenizer)")
    return path


def reward_service_name(cfg: Config) -> str:
    return f"elastic-reward-{cfg.run.name}"


def reward_spec(cfg: Config):
    """reward.kind and its options (or rl.env, which then scores instead), parsed; ConfigError
    (one line) when they are wrong."""
    from elastic.reward.verifiers.registry import spec_from_section

    try:
        return spec_from_section(cfg.reward, cfg.rl.env)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def plan_tasks(cfg: Config, spec) -> Tuple[Dict[str, Any], Any, List[str]]:
    """(every task by id, the train/held-out split, lines for the console). code_opt: the problem
    directory rl.problems, held out by rl.heldout ids. Other verifiers: rl.tasks (+ rl.heldout_tasks),
    bad rows counted and reported; rl.env: the same, each row needing only an id and a prompt.
    Also refuses untrusted programs without bubblewrap, before any work."""
    from elastic.reward.verifiers.code_opt.problems import load_problems
    from elastic.reward.tasks import TaskError, load_tasks, tasks_from_problems
    from elastic.rl.split import ProblemSplit, split_problems

    rl, rw = cfg.rl, cfg.reward
    notes: List[str] = []
    if "code_opt" in spec.kinds and not spec.env:
        problems = load_problems(rl.problems)  # ProblemError: one line naming the file and field
        tasks = tasks_from_problems(problems, lambda p: prompt_text(p.root))
        split = split_problems(tasks, rl.heldout, where=rl.problems)
    else:
        needs, limits = () if spec.env else spec.needs(), (rw.python_time_limit_s, rw.python_memory_mb)
        train = load_tasks(rl.tasks, rl.fields, needs, limits)
        notes.append(train.describe())
        tasks = dict(train.tasks)
        if rl.heldout_tasks:
            held = load_tasks(rl.heldout_tasks, rl.fields, needs, limits)
            notes.append(held.describe() + " (held out)")
            clash = sorted(set(held.tasks) & set(tasks))
            if clash:
                raise TaskError(f"{rl.heldout_tasks}: task id {clash[0]!r} is also in {rl.tasks} "
                                f"({len(clash)} shared ids); held-out ids must be distinct")
            inner = split_problems(tasks, rl.heldout, where=rl.tasks)
            tasks.update(held.tasks)
            split = ProblemSplit(train=inner.train, heldout=tuple(rl.heldout) + tuple(held.tasks))
        else:
            split = split_problems(tasks, rl.heldout, where=rl.tasks)
    check_isolation(cfg, spec)
    return tasks, split, notes


def check_isolation(cfg: Config, spec) -> None:
    """Verifiers that run untrusted programs need bubblewrap here too (the driver usually shares
    the reward actors' image): say so now, in one line, rather than from every actor later."""
    from elastic.reward.pool import SANDBOXED

    if not (SANDBOXED & set(spec.kinds)) or cfg.reward.allow_weak_isolation or spec.env:
        return
    from elastic.sandbox.isolation import detect, unavailable_message

    iso = detect()
    if iso.wrapper != "bwrap":
        raise ConfigError(f"reward.kind {cfg.reward.kind!r}: {unavailable_message(iso)}")


def check_reward_model(cfg: Config, policy_tokenizer_json: str) -> None:
    """reward.kind's `model` term: reward.model_path is a reward model (a scalar head) whose
    tokenizer is the policy's (sequences go to it as the policy's token ids). One line, before
    any worker starts."""
    from elastic.config.init_from import resolve_init_from
    from elastic.data.tokenizer import info_from_file

    path = cfg.reward.model_path
    if not path:
        raise ConfigError("reward.model_path: reward.kind has a 'model' term but no reward model is given "
                          "(a jobs/reward_model.py checkpoint <run>/step_N or a Hugging Face *ForSequenceClassification directory; "
                          "jobs/grpo.py trains reward.model_config's first)")
    src = resolve_init_from(path, key="reward.model_path")
    if not src.dims.get("num_labels"):
        raise ConfigError(f"reward.model_path {path}: a causal language model, not a reward model (no score head)")
    if info_from_file(src.tokenizer).json != policy_tokenizer_json:
        raise ConfigError(f"reward.model_path {path}: its tokenizer ({src.tokenizer}) is not the policy's; train the reward "
                          "model from the same policy (jobs/reward_model.py) so scores read the policy's tokens")


class GRPOLaunch(JobLaunch):
    job = "grpo"

    def plan(self, cfg: Config, paths: RunPaths, say) -> None:
        from elastic.model.hf import check_init_from

        self.spec = reward_spec(cfg)
        # Paths the workers open: absolute, since a worker's working directory is not the driver's.
        for sec, key in ((cfg.reward, "model_path"), (cfg.rl, "critic_init"), (cfg.model, "init_from")):
            v = getattr(sec, key)
            if v and "://" not in v:
                setattr(sec, key, os.path.abspath(v))
        self.tasks, self.split, self.task_note = plan_tasks(cfg, self.spec)
        tok_path = policy_tokenizer(cfg)
        check_init_from(cfg)  # names and shapes from headers/metadata: one line, before any worker
        if cfg.rl.algorithm == "ppo":
            from elastic.rl.ppo import critic_config

            try:
                check_init_from(critic_config(cfg))
            except ConfigError as e:
                raise ConfigError(f"rl.critic_init: {str(e).split(': ', 1)[-1]}") from None
        self.tok = load_or_train(tok_path, "", [], cfg.data.vocab_size)
        keep_tokenizer(tok_path, paths.local_dir)  # the run carries its tokenizer (export, reports)
        self.chat = ChatFormat(chat_template=None if cfg.sft.template == "builtin" else self.tok.chat_template,
                               eos_token=self.tok.eos_token, bos_token=self.tok.bos_token,
                               parse_special_tokens=cfg.data.parse_special_tokens)
        warning = role_marker_warning(self.tok.json, self.chat)
        if warning:
            say(warning)
        self.cfg = cfg
        self.service = None
        self.rm = None
        self.fleet = None
        self.rm_term = "model" in self.spec.kinds and not self.spec.env  # with rl.env reward.kind scores nothing
        if self.rm_term:
            check_reward_model(cfg, self.tok.json)

    def describe(self) -> list:
        rl = self.cfg.rl
        what = "problems" if "code_opt" in self.spec.kinds and not self.spec.env else "tasks"
        algo = "PPO" if rl.algorithm == "ppo" else "GRPO"
        lines = [f"[elastic] {algo}: {len(self.split.train)} training {what}, {len(self.split.heldout)} held out; "
                 f"{rl.prompts_per_step} prompts x {rl.group_size} samples per step; "
                 f"reward {'rl.env ' + self.spec.env if self.spec.env else self.spec.text}; "
                 f"policy from {self.cfg.model.init_from}"]
        if rl.algorithm == "ppo":
            from elastic.rl.ppo import critic_config

            lines.append(f"[elastic] critic from {critic_config(self.cfg).model.init_from} (lr {rl.critic_lr:g}, "
                         f"{rl.critic_warmup_steps} warm-up steps); GAE gamma {rl.gamma:g} lam {rl.lam:g}; KL in the reward: "
                         + (f"{rl.kl_ctl} from {rl.kl_coef:g}" if rl.kl_coef > 0 else "off"))
        return lines + [f"[elastic] {n}" for n in self.task_note]

    def start(self, cfg: Config, paths: RunPaths) -> None:
        self.service = start_service(cfg.reward, cfg.rl.problems, name=reward_service_name(cfg), tasks=self.tasks,
                                     env=cfg.rl.env)
        if self.rm_term:
            from elastic.launch.reward_model_service import start_rm_service

            self.rm = start_rm_service(cfg.reward, name=reward_service_name(cfg))
        if cfg.rl.rollout.placement == "disaggregated":  # the rollout fleet, apart from the trainers
            from elastic.launch.rollouts import start_fleet
            from elastic.records import EVENTS

            self.fleet, _ = start_fleet(cfg, {
                "tokenizer_json": self.tok.json, "chat_format": self.chat, "eos_id": self.tok.eos_id,
                "prompt_texts": {t: self.tasks[t].prompt for t in self.split.train}, "train_ids": list(self.split.train),
                "reward_service": reward_service_name(cfg), "events": os.path.join(paths.records_dir, EVENTS)})

    def trainer(self, cfg: Config, paths: RunPaths, gpu: bool):
        ids = list(self.split.train) + list(self.split.heldout)
        loop = grpo_loop_per_worker
        if cfg.rl.algorithm == "ppo":
            from elastic.rl.ppo import ppo_loop_per_worker as loop
        return build_torch_trainer(cfg, paths, gpu, loop,
                                   {"tokenizer_json": self.tok.json, "chat_format": self.chat, "eos_id": self.tok.eos_id,
                                    "reward_service": reward_service_name(cfg), "rm_service": self.rm,
                                    "prompt_texts": {t: self.tasks[t].prompt for t in ids},
                                    "train_ids": list(self.split.train), "heldout_ids": list(self.split.heldout)})

    def stop(self) -> None:
        if getattr(self, "fleet", None) is not None:
            from elastic.launch.rollouts import stop_fleet

            stop_fleet(self.fleet)
            self.fleet = None
        if self.service is not None:
            self.service.shutdown()
        if self.rm is not None:
            from elastic.launch.reward_model_service import stop_rm_service

            stop_rm_service(self.rm)


def run_grpo(cfg: Config, out: Optional[TextIO] = None, progress: bool = True) -> JobResult:
    return run_job(cfg, GRPOLaunch(), out, progress)


def latest_checkpoint(run_dir: str) -> Optional[str]:
    from elastic.train.checkpoint_files import latest_complete

    found = latest_complete(run_dir)
    return found[0] if found else None
