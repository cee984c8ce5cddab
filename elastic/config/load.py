"""Load a config from YAML plus ``--set key.sub=value`` overrides, and validate it.

Every problem is a :class:`ConfigError` whose message is one line naming the key, raised
before Ray starts anything: an unknown key, a wrong type or an impossible value.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional

import yaml

from elastic.config.build import _build, _coerce, _Override, _parse_scalar, _type_name  # noqa: F401 (re-exported)
from elastic.config.dims import preset_model_dims, with_num_labels  # noqa: F401 (re-exported)
from elastic.config.errors import ConfigError
from elastic.config.init_from import init_from_dims, resolve_init_from
from elastic.config.schema import Config


def apply_overrides(raw: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """Apply `key.sub=value` strings onto a nested dict (in place; returned for chaining)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected key.sub=value")
        key, _, text = item.partition("=")
        parts = key.strip().split(".")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {p} is not a section")
        node[parts[-1]] = _Override(text)
    return raw


def from_dict(raw: Optional[Mapping[str, Any]], job: str = "pretrain") -> Config:
    """Build and validate a Config from a nested mapping (`job`: see :func:`validate`)."""
    cfg = _build(Config, raw or {}, "")
    validate(cfg, job)
    return cfg


def load_config(path: Optional[str] = None, overrides: Iterable[str] = (), job: str = "pretrain") -> Config:
    """Read YAML at `path` (optional), apply overrides, validate; ConfigError on any problem.

    `job` names the entry point; checks that only matter to one job (the GRPO batch split over
    world sizes) run only for it (see :func:`validate`)."""
    raw: Dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path}: not found")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file {path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping of sections")
    apply_overrides(raw, overrides)
    return from_dict(raw, job)


def to_dict(cfg: Config) -> Dict[str, Any]:
    return dataclasses.asdict(cfg)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


ATTENTION_BACKENDS = ("auto", "flash_varlen", "torch_varlen", "flex", "sdpa_docs", "sdpa_mask", "sdpa_loop")
# Names of the elastic/rl registries (ADV_NORMS, KL_ESTIMATORS, LOSS_AGGS); config imports
# nothing, so they are repeated here and tests/test_rl_math.py checks the two agree.
RL_ADV_NORMS = ("group_std", "none")
RL_KL_ESTIMATORS = ("k1", "k2", "k3")
RL_LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def validate(cfg: Config, job: str = "pretrain") -> None:
    """Cross-field checks that make a run impossible; one line naming the key.

    Every field of every section is checked for every job (a bad value is a typo wherever it
    is). Checks that tie a section to the world sizes run only for the job that uses it:
    `job="grpo"` adds the split of the rollout batch over scaling.min_workers..max_workers, so a
    pretraining run is never refused over an rl batch it does not train on."""
    from elastic.config.presets import PRESETS

    d, m, t, s, c = cfg.data, cfg.model, cfg.train, cfg.scaling, cfg.checkpoint
    _check(bool(cfg.run.name) and "/" not in cfg.run.name, "run.name", f"must be a non-empty name without '/', got {cfg.run.name!r}")
    _check(d.format in ("auto", "text", "jsonl", "parquet"), "data.format", f"must be auto|text|jsonl|parquet, got {d.format!r}")
    _check(d.seq_len >= 8, "data.seq_len", f"must be >= 8, got {d.seq_len}")
    _check(d.vocab_size >= 260, "data.vocab_size", f"must be >= 260 (256 bytes + specials), got {d.vocab_size}")
    _check(d.shard_mb > 0, "data.shard_mb", f"must be > 0, got {d.shard_mb}")
    _check(d.tokenize_cpus > 0, "data.tokenize_cpus", f"must be > 0, got {d.tokenize_cpus}")
    _check(d.build_ahead >= 0, "data.build_ahead", f"must be >= 0, got {d.build_ahead}")
    _check(d.tokenize_actors >= 1, "data.tokenize_actors", f"must be >= 1, got {d.tokenize_actors}")
    bad = {k: w for k, w in d.mixture.items() if not w > 0}
    _check(not bad, "data.mixture", f"weights must be > 0, got {bad}")
    _check(d.prefetch_steps >= 0, "data.prefetch_steps", f"must be >= 0, got {d.prefetch_steps}")
    _check(m.preset in PRESETS, "model.preset", f"unknown preset {m.preset!r} (known: {', '.join(PRESETS)})")
    _check(m.attention in ATTENTION_BACKENDS, "model.attention", f"must be one of {'|'.join(ATTENTION_BACKENDS)}, got {m.attention!r}")
    _check(m.num_labels in (0, 1), "model.num_labels",
           f"must be 0 (a causal LM) or 1 (a scalar score head: reward model, critic), got {m.num_labels}")
    _check(not (m.num_labels and m.tie_embeddings), "model.tie_embeddings",
           "must not be true with model.num_labels 1 (a score head is never tied to the embeddings)")
    dims = resolved_model_dims(cfg)
    if m.init_from and d.tokenizer:
        own = resolve_init_from(m.init_from).tokenizer
        _check(os.path.realpath(d.tokenizer) == os.path.realpath(own), "data.tokenizer",
               f"{d.tokenizer} differs from the tokenizer that comes with model.init_from ({own}); leave data.tokenizer empty")
    _check(dims["dim"] % dims["n_heads"] == 0, "model.n_heads", f"dim {dims['dim']} is not divisible by n_heads {dims['n_heads']}")
    _check(dims["n_heads"] % dims["n_kv_heads"] == 0, "model.n_kv_heads", f"n_heads {dims['n_heads']} is not divisible by n_kv_heads {dims['n_kv_heads']}")
    _check((dims["dim"] // dims["n_heads"]) % 2 == 0, "model.n_heads", "head dim must be even for RoPE")
    _check(t.steps >= 1, "train.steps", f"must be >= 1, got {t.steps}")
    _check(t.global_batch_size >= 1, "train.global_batch_size", f"must be >= 1, got {t.global_batch_size}")
    _check(t.micro_batch_size >= 1, "train.micro_batch_size", f"must be >= 1, got {t.micro_batch_size}")
    _check(t.lr > 0, "train.lr", f"must be > 0, got {t.lr}")
    _check(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", f"must be in [0, 1], got {t.min_lr_ratio}")
    _check(t.warmup_steps >= 0, "train.warmup_steps", f"must be >= 0, got {t.warmup_steps}")
    _check(t.grad_clip >= 0, "train.grad_clip", f"must be >= 0, got {t.grad_clip}")
    _check(t.param_dtype in ("auto", "bf16", "fp32"), "train.param_dtype", f"must be auto|bf16|fp32, got {t.param_dtype!r}")
    _check(t.compile in ("auto", "true", "false"), "train.compile", f"must be auto|true|false, got {t.compile!r}")
    _check(t.activation_checkpointing in ("none", "full"), "train.activation_checkpointing", f"must be none|full, got {t.activation_checkpointing!r}")
    _check(0 <= t.until_step <= t.steps, "train.until_step", f"must be in [0, train.steps={t.steps}], got {t.until_step}")
    _check(t.log_every >= 1, "train.log_every", f"must be >= 1, got {t.log_every}")
    _check(t.max_bad_steps >= 0, "train.max_bad_steps", f"must be >= 0 (0 = never stop), got {t.max_bad_steps}")
    _check(t.spike_z > 0, "train.spike_z", f"must be > 0, got {t.spike_z}")
    _check(t.comm_sample_every >= 0, "train.comm_sample_every", f"must be >= 0 (0 = never), got {t.comm_sample_every}")
    _check(_valid_step_range(t.profile_steps), "train.profile_steps",
           f"must be empty or 'a:b' with 1 <= a <= b (1-based steps), got {t.profile_steps!r}")
    _check(s.min_workers >= 1, "scaling.min_workers", f"must be >= 1, got {s.min_workers}")
    _check(s.max_workers >= s.min_workers, "scaling.max_workers", f"must be >= scaling.min_workers={s.min_workers}, got {s.max_workers}")
    _check(s.use_gpu in ("auto", "true", "false"), "scaling.use_gpu", f"must be auto|true|false, got {s.use_gpu!r}")
    _check(s.fit in ("auto", "strict"), "scaling.fit", f"must be auto|strict, got {s.fit!r}")
    _check(s.cpus_per_worker >= 0, "scaling.cpus_per_worker", f"must be >= 0, got {s.cpus_per_worker}")
    _check(s.max_failures >= -1, "scaling.max_failures", f"must be >= -1 (-1 = unlimited), got {s.max_failures}")
    _check(s.worker_group_start_timeout_s > 0, "scaling.worker_group_start_timeout_s", "must be > 0")
    _check(s.elastic_resize_monitor_interval_s > 0, "scaling.elastic_resize_monitor_interval_s", "must be > 0")
    _check(s.resource_wait_s >= 0, "scaling.resource_wait_s", f"must be >= 0, got {s.resource_wait_s}")
    # Every world size the run may take must split the global batch evenly over the workers
    # (GRPO batches by rollouts instead: rl.prompts_per_step x rl.group_size, checked below). The
    # micro-batch size is an upper bound: each worker fits it to its share (config/micro_batch.py).
    _validate_parallel(cfg, job)
    for w in (dp_worlds(cfg) if job != "grpo" else ()):
        per = t.global_batch_size / w
        _check(
            t.global_batch_size % w == 0,
            "train.global_batch_size",
            f"{t.global_batch_size} sequences cannot be split evenly over {w} {_ranks(cfg)} "
            f"(per worker: {per:g}); every world size in scaling.min_workers.."
            f"scaling.max_workers={s.min_workers}..{s.max_workers} must divide it",
        )
    sft, ev = cfg.sft, cfg.eval
    _check(sft.template in ("auto", "builtin"), "sft.template", f"must be auto|builtin, got {sft.template!r}")
    _check(sft.overlong in ("truncate", "skip"), "sft.overlong", f"must be truncate|skip, got {sft.overlong!r}")
    for k in ("prompt_field", "completion_field", "messages_field"):
        _check(bool(getattr(sft, k)), f"sft.{k}", "must be a non-empty field name")
    _check(ev.every_steps >= 0, "eval.every_steps", f"must be >= 0 (0 = off), got {ev.every_steps}")
    _check(ev.samples >= 1, "eval.samples", f"must be >= 1, got {ev.samples}")
    _check(0 < ev.fraction < 1, "eval.fraction", f"must be in (0, 1), got {ev.fraction}")
    _check(ev.task_limit >= 0, "eval.task_limit", f"must be >= 0, got {ev.task_limit}")
    _check(c.every_steps >= 1, "checkpoint.every_steps", f"must be >= 1, got {c.every_steps}")
    _check(c.every_s >= 0, "checkpoint.every_s", f"must be >= 0 (0 = off), got {c.every_s}")
    _check(c.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1, got {c.keep_last}")
    _check(cfg.wandb.mode in ("auto", "online", "offline", "disabled"), "wandb.mode", f"must be auto|online|offline|disabled, got {cfg.wandb.mode!r}")
    r = cfg.reward
    _check(r.num_actors >= 1, "reward.num_actors", f"must be >= 1, got {r.num_actors}")
    _check(r.timing in ("wall", "instructions"), "reward.timing", f"must be wall|instructions, got {r.timing!r}")
    _check(r.max_in_flight_per_actor >= 1, "reward.max_in_flight_per_actor", f"must be >= 1, got {r.max_in_flight_per_actor}")
    _check(r.batch_size >= 1, "reward.batch_size", f"must be >= 1, got {r.batch_size}")
    _check(r.batch_wait_s >= 0, "reward.batch_wait_s", f"must be >= 0, got {r.batch_wait_s}")
    _check(r.item_deadline_s > 0, "reward.item_deadline_s", f"must be > 0, got {r.item_deadline_s}")
    _check(r.max_retries >= 0, "reward.max_retries", f"must be >= 0, got {r.max_retries}")
    _check(r.dedup_window >= 0, "reward.dedup_window", f"must be >= 0 (0 disables), got {r.dedup_window}")
    _check(r.unavailable_after_s > r.item_deadline_s, "reward.unavailable_after_s",
           f"must be > reward.item_deadline_s={r.item_deadline_s} (a healthy actor finishes or is replaced "
           f"within the item deadline), got {r.unavailable_after_s}")
    _check(r.timing_runs >= 1, "reward.timing_runs", f"must be >= 1, got {r.timing_runs}")
    _check(r.warmup_runs >= 0, "reward.warmup_runs", f"must be >= 0, got {r.warmup_runs}")
    _check(0 <= r.reward_floor < 1, "reward.reward_floor", f"must be in [0, 1), got {r.reward_floor}")
    _check(r.failure_reward <= r.reward_floor, "reward.failure_reward",
           f"must be <= reward.reward_floor={r.reward_floor} (a failing program may not beat a correct one), got {r.failure_reward}")
    _check(r.speedup_scale > 0, "reward.speedup_scale", f"must be > 0, got {r.speedup_scale}")
    _check(r.compile_time_limit_s > 0, "reward.compile_time_limit_s", f"must be > 0, got {r.compile_time_limit_s}")
    _check(r.instructions_time_limit_s > 0, "reward.instructions_time_limit_s", f"must be > 0, got {r.instructions_time_limit_s}")
    _validate_rl(cfg)
    _validate_rl_tasks(cfg)
    _validate_lora(cfg)
    _validate_dpo(cfg)
    rm = cfg.reward_model
    _check(cfg.reward.model_actors >= 1, "reward.model_actors", f"must be >= 1, got {cfg.reward.model_actors}")
    _check(cfg.reward.model_batch >= 1, "reward.model_batch", f"must be >= 1, got {cfg.reward.model_batch}")
    _check(cfg.reward.model_use_gpu in ("auto", "true", "false"), "reward.model_use_gpu",
           f"must be auto|true|false, got {cfg.reward.model_use_gpu!r}")
    _check(rm.center_rewards_coefficient >= 0, "reward_model.center_rewards_coefficient", f"must be >= 0, got {rm.center_rewards_coefficient}")
    if job == "grpo":
        _validate_rl_world_sizes(cfg)


def _validate_rl(cfg: Config) -> None:
    """The rl section on its own (elastic/rl); the world-size split is :func:`_validate_rl_world_sizes`."""
    rl = cfg.rl
    _check(bool(rl.problems), "rl.problems", "must name a problem directory")
    for i, h in enumerate(rl.heldout):
        _check(bool(h) and "/" not in h and h not in (".", ".."), f"rl.heldout[{i}]", f"must be a problem id (a directory name), got {h!r}")
    dup = sorted({h for h in rl.heldout if rl.heldout.count(h) > 1})
    _check(not dup, "rl.heldout", f"lists {', '.join(dup)} more than once")
    _check(rl.eval_every >= 0, "rl.eval_every", f"must be >= 0 (0 = off), got {rl.eval_every}")
    _check(rl.eval_every == 0 or bool(rl.heldout) or bool(rl.heldout_tasks), "rl.eval_every",
           f"held-out evaluation every {rl.eval_every} steps needs problems in rl.heldout (empty); set rl.eval_every=0 or hold some out")
    _check(rl.algorithm in ("grpo", "ppo"), "rl.algorithm", f"must be grpo|ppo, got {rl.algorithm!r}")
    _check(rl.group_size >= 2 or rl.algorithm == "ppo", "rl.group_size",
           f"must be >= 2 for GRPO (a group is its own baseline), got {rl.group_size}")
    if rl.algorithm == "ppo":
        _check(0 <= rl.gamma <= 1, "rl.gamma", f"must be in [0, 1], got {rl.gamma}")
        _check(0 <= rl.lam <= 1, "rl.lam", f"must be in [0, 1], got {rl.lam}")
        _check(rl.critic_lr > 0, "rl.critic_lr", f"must be > 0, got {rl.critic_lr}")
        _check(rl.cliprange_value > 0, "rl.cliprange_value", f"must be > 0, got {rl.cliprange_value}")
        _check(rl.vf_coef > 0, "rl.vf_coef", f"must be > 0, got {rl.vf_coef}")
        _check(rl.critic_warmup_steps >= 0, "rl.critic_warmup_steps", f"must be >= 0, got {rl.critic_warmup_steps}")
        _check(rl.kl_ctl in ("fixed", "adaptive"), "rl.kl_ctl", f"must be fixed|adaptive, got {rl.kl_ctl!r}")
        _check(rl.kl_target > 0 and rl.kl_horizon > 0, "rl.kl_target", "kl_target and kl_horizon must be > 0")
        # The adaptive factor 1 + clip(kl/target - 1, -0.2, 0.2) * n / horizon, n = the step's
        # samples, is <= 0 at a KL far below target once n >= 5 * horizon (a 0 or negative
        # coefficient, which the controller refuses to reach: docs/rlhf.md).
        n = rl.prompts_per_step * rl.group_size
        _check(rl.kl_ctl != "adaptive" or n < 5 * rl.kl_horizon, "rl.kl_horizon",
               f"{rl.prompts_per_step} prompts x {rl.group_size} samples = {n} samples per step >= 5 x rl.kl_horizon="
               f"{rl.kl_horizon} = {5 * rl.kl_horizon}: the adaptive KL factor 1 - 0.2 x {n} / {rl.kl_horizon} at a KL far "
               f"below rl.kl_target would make the coefficient <= 0; rl.kl_horizon must be at least {n // 5 + 1}")
        _check(cfg.model.lora.rank == 0, "model.lora.rank", "PPO with LoRA is not supported yet (the critic is a full model)")
    _validate_rollout(rl)
    _validate_turns(rl, cfg)
    _validate_generation(cfg)
    _check(rl.prompts_per_step >= 1, "rl.prompts_per_step", f"must be >= 1, got {rl.prompts_per_step}")
    _check(rl.max_new_tokens >= 1, "rl.max_new_tokens", f"must be >= 1, got {rl.max_new_tokens}")
    _check(rl.rollout_batch >= 1, "rl.rollout_batch", f"must be >= 1, got {rl.rollout_batch}")
    _check(rl.temperature > 0, "rl.temperature", f"must be > 0 for training rollouts (evaluation is greedy anyway), got {rl.temperature}")
    _check(0 < rl.top_p <= 1, "rl.top_p", f"must be in (0, 1], got {rl.top_p}")
    _check(rl.top_k >= 0, "rl.top_k", f"must be >= 0 (0 = off), got {rl.top_k}")
    _check(0 < rl.clip_low < 1, "rl.clip_low", f"must be in (0, 1) (the ratio is clipped below at 1 - clip_low), got {rl.clip_low}")
    _check(rl.clip_high > 0, "rl.clip_high", f"must be > 0, got {rl.clip_high}")
    _check(rl.clip_ratio_c == 0 or rl.clip_ratio_c > 1, "rl.clip_ratio_c",
           f"must be 0 (dual clip off) or > 1 (verl's default is 3), got {rl.clip_ratio_c}")
    _check(rl.kl_coef >= 0, "rl.kl_coef", f"must be >= 0 (0 = no KL term), got {rl.kl_coef}")
    _check(rl.kl_estimator in RL_KL_ESTIMATORS, "rl.kl_estimator", f"must be one of {'|'.join(RL_KL_ESTIMATORS)}, got {rl.kl_estimator!r}")
    _check(rl.loss_agg in RL_LOSS_AGGS, "rl.loss_agg", f"must be one of {'|'.join(RL_LOSS_AGGS)}, got {rl.loss_agg!r}")
    _check(rl.adv_norm in RL_ADV_NORMS, "rl.adv_norm", f"must be one of {'|'.join(RL_ADV_NORMS)}, got {rl.adv_norm!r}")
    _check(0 <= rl.negative_weight <= 1, "rl.negative_weight", f"must be in [0, 1] (1 = plain GRPO), got {rl.negative_weight}")
    _check(rl.updates_per_rollout >= 1, "rl.updates_per_rollout", f"must be >= 1, got {rl.updates_per_rollout}")
    _check(rl.minibatches_per_update >= 1, "rl.minibatches_per_update", f"must be >= 1, got {rl.minibatches_per_update}")
    _check(rl.micro_batch_size >= 1, "rl.micro_batch_size", f"must be >= 1, got {rl.micro_batch_size}")
    _check(rl.overlong_penalty >= 0, "rl.overlong_penalty", f"must be >= 0 (a magnitude; 0 = off), got {rl.overlong_penalty}")
    _check(rl.truncation_penalty >= 0, "rl.truncation_penalty", f"must be >= 0 (a magnitude; 0 = off), got {rl.truncation_penalty}")
    _check(rl.overlong_buffer >= 0, "rl.overlong_buffer", f"must be >= 0, got {rl.overlong_buffer}")
    if rl.overlong_penalty > 0:  # the buffer only matters when the soft penalty is on
        _check(1 <= rl.overlong_buffer <= rl.max_new_tokens, "rl.overlong_buffer",
               f"must be in [1, rl.max_new_tokens={rl.max_new_tokens}] when rl.overlong_penalty={rl.overlong_penalty} "
               f"(the penalty ramps over the last overlong_buffer tokens), got {rl.overlong_buffer}")


RL_PROMPT_FORMATS = ("chat", "raw")
RL_TURN_REWARDS = ("last", "discounted")  # elastic/rl/algorithms/turns.py TURN_REWARDS
RL_FEEDBACK = ("verdict", "details")  # elastic/reward/feedback.py MODES
# rl.env: "module:Class" (elastic/reward/verifiers/user_env.py check_spec says the same)
ENV_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def _validate_rl_tasks(cfg: Config) -> None:
    """Where GRPO's tasks come from and how they are scored and evaluated. The verifier names and
    weights in reward.kind are parsed by elastic/reward/verifiers/registry.py in the driver's plan, still
    before any work starts (the config layer imports nothing)."""
    rl, rw = cfg.rl, cfg.reward
    code_opt = "code_opt" in rw.kind and not rl.env  # with rl.env, reward.kind scores nothing
    _check(bool(rw.kind.strip()), "reward.kind", "must name a verifier (code_opt, python_tests, math_answer, "
                                                 "exact_match, regex, function) or a sum such as 'math_answer + 0.1*regex'")
    if rl.env:
        _check(ENV_SPEC.match(rl.env) is not None, "rl.env", f"must be 'module:Class' (e.g. 'my_envs:Counter'; the "
                                                             f"module importable on the reward actors), got {rl.env!r}")
        _check(bool(rl.tasks), "rl.tasks", f"rl.env {rl.env!r} steps the tasks of a task file (JSONL or Parquet; any row "
                                           "with an id and a prompt, the row reaches reset(task) as task['fields'])")
        _check(rl.eval_samples == 1, "rl.eval_samples", f"with rl.env held-out evaluation is one greedy episode per task "
                                                        f"(1), got {rl.eval_samples}")
        longest = rw.function_timeout_s * (rl.turns + 1)  # the replay of the last turn: reset + rl.turns steps
        _check(longest < rw.item_deadline_s, "reward.function_timeout_s",
               f"{rw.function_timeout_s:g} s per environment call x (rl.turns {rl.turns} + 1) = {longest:g} s for the last "
               f"turn's replay must stay under reward.item_deadline_s {rw.item_deadline_s:g} (else a slow environment "
               "is killed as a stuck actor, not scored timeout)")
    if code_opt:
        _check(not rl.tasks, "rl.tasks", f"reward.kind {rw.kind!r} scores the problems of rl.problems; rl.tasks "
                                         "is for the other verifiers (python_tests, math_answer, ...)")
        _check(not rl.heldout_tasks, "rl.heldout_tasks", "code_opt holds problems out by id (rl.heldout)")
    else:
        _check(bool(rl.tasks), "rl.tasks", f"reward.kind {rw.kind!r} needs a task file (JSONL or Parquet)")
        _check(not (rl.eval_every and not rl.heldout and not rl.heldout_tasks), "rl.eval_every",
               f"held-out evaluation every {rl.eval_every} steps needs rl.heldout_tasks or ids in rl.heldout; "
               "set rl.eval_every=0 or give held-out tasks")
    _check(rl.prompt_format in RL_PROMPT_FORMATS, "rl.prompt_format",
           f"must be one of {'|'.join(RL_PROMPT_FORMATS)}, got {rl.prompt_format!r}")
    _check(rl.eval_samples >= 1, "rl.eval_samples", f"must be >= 1 (1 = greedy pass@1), got {rl.eval_samples}")
    _check(bool(rl.eval_k), "rl.eval_k", "must list at least one k (e.g. [1])")
    for i, k in enumerate(rl.eval_k):
        _check(1 <= k <= rl.eval_samples, f"rl.eval_k[{i}]",
               f"must be in [1, rl.eval_samples={rl.eval_samples}] (pass@k needs k samples), got {k}")
    _check(rw.function_timeout_s > 0, "reward.function_timeout_s", f"must be > 0, got {rw.function_timeout_s}")
    _check(rw.python_time_limit_s > 0, "reward.python_time_limit_s", f"must be > 0, got {rw.python_time_limit_s}")
    _check(rw.python_memory_mb >= 32, "reward.python_memory_mb", f"must be >= 32, got {rw.python_memory_mb}")


# elastic/generation/quantized.py WEIGHTS (config imports nothing; tests check the two agree).
GENERATION_WEIGHTS = ("full", "int8", "int4")


def _validate_generation(cfg: Config) -> None:
    g = cfg.generation
    _check(g.kv_cache in ("static", "paged"), "generation.kv_cache", f"must be static|paged, got {g.kv_cache!r}")
    _check(g.block_size >= 1, "generation.block_size", f"must be >= 1, got {g.block_size}")
    _check(g.draft == "none" or g.kv_cache == "static", "generation.draft",
           f"speculative decoding runs on the static KV cache: set generation.kv_cache=static or draft=none "
           f"(got kv_cache={g.kv_cache!r})")
    _check(g.draft in ("none", "ngram") or os.path.isdir(g.draft), "generation.draft",
           f"must be none, ngram or an existing model directory (Hugging Face or checkpoint step), got {g.draft!r}")
    _check(g.draft_tokens >= 1, "generation.draft_tokens", f"must be >= 1, got {g.draft_tokens}")
    _check(g.draft_ngram >= 1, "generation.draft_ngram", f"must be >= 1, got {g.draft_ngram}")
    w = g.weights
    _check(w in GENERATION_WEIGHTS, "generation.weights", f"must be {'|'.join(GENERATION_WEIGHTS)}, got {w!r}")
    _check(w != "int4" or cfg.train.param_dtype in ("auto", "bf16"), "generation.weights",
           f"int4 runs on CUDA with bfloat16 weights only (torchao's tinygemm layout); train.param_dtype is "
           f"{cfg.train.param_dtype!r}: use int8, or train.param_dtype auto|bf16")


def _validate_rollout(rl) -> None:
    ro = rl.rollout
    _check(ro.placement in ("colocated", "disaggregated"), "rl.rollout.placement",
           f"must be colocated|disaggregated, got {ro.placement!r}")
    _check(ro.workers >= 1, "rl.rollout.workers", f"must be >= 1, got {ro.workers}")
    _check(ro.cpus_per_worker > 0, "rl.rollout.cpus_per_worker", f"must be > 0, got {ro.cpus_per_worker}")
    _check(ro.gpus_per_worker >= 0, "rl.rollout.gpus_per_worker", f"must be >= 0, got {ro.gpus_per_worker}")
    _check(ro.bucket_mb >= 1, "rl.rollout.bucket_mb", f"must be >= 1, got {ro.bucket_mb}")
    _check(rl.max_staleness >= 0, "rl.max_staleness", f"must be >= 0, got {rl.max_staleness}")
    _check(1 <= ro.sync_every <= rl.max_staleness + 1 or ro.placement == "colocated", "rl.rollout.sync_every",
           f"must be in [1, rl.max_staleness + 1 = {rl.max_staleness + 1}] (a step may not train on completions more "
           f"than max_staleness versions old), got {ro.sync_every}")
    _check(rl.is_correction in ("tis", "none"), "rl.is_correction", f"must be tis|none, got {rl.is_correction!r}")
    _check(rl.is_cap >= 1, "rl.is_cap", f"must be >= 1 (the largest importance weight a token gets), got {rl.is_cap}")


def _validate_turns(rl, cfg) -> None:
    """Multi-turn settings (issue 44): GRPO runs episodes, a user environment's (rl.env) too, in
    either placement (the trainers or the rollout fleet, elastic/rl/episodes.py), PPO colocated
    (its episodes on the fleet are not tested yet); on the static KV cache, full weights, no draft."""
    _check(rl.turns >= 1, "rl.turns", f"must be >= 1 (1 = single turn), got {rl.turns}")
    if rl.turns > 1 or rl.env:  # episodes (an environment's too, at any rl.turns)
        key, what = ("rl.turns", "rl.turns > 1") if rl.turns > 1 else ("rl.env", "rl.env")
        _check(rl.algorithm == "grpo" or rl.rollout.placement == "colocated", key,
               f"{what} with rl.algorithm {rl.algorithm} runs colocated (rl.rollout.placement colocated), "
               f"got {rl.rollout.placement}")
        g = cfg.generation
        _check(g.kv_cache == "static", "generation.kv_cache",
               f"{what} runs on the static KV cache (episodes keep a slot), got {g.kv_cache}")
        _check(g.draft == "none", "generation.draft", f"{what} runs without speculative decoding, got {g.draft}")
        _check(g.weights == "full", "generation.weights", f"{what} generates with full weights, got {g.weights}")
    _check(rl.turn_reward in RL_TURN_REWARDS, "rl.turn_reward",
           f"must be one of {'|'.join(RL_TURN_REWARDS)}, got {rl.turn_reward!r}")
    _check(0 < rl.turn_discount <= 1, "rl.turn_discount", f"must be in (0, 1], got {rl.turn_discount}")
    _check(rl.turn_cost >= 0, "rl.turn_cost", f"must be >= 0 (a cost per turn after the first), got {rl.turn_cost}")
    _check(rl.feedback in RL_FEEDBACK, "rl.feedback", f"must be one of {'|'.join(RL_FEEDBACK)}, got {rl.feedback!r}")
    _check(rl.feedback_max_tokens >= 16, "rl.feedback_max_tokens",
           f"must be >= 16 (room for a verdict and the truncation marker), got {rl.feedback_max_tokens}")


LORA_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")  # elastic/model/lora.py TARGETS (checked in tests)
QUANTIZE_BASE = ("none", "nf4")  # elastic/model/quantize.py QUANTIZE_BASE (checked in tests)
DPO_LOSSES = ("sigmoid", "ipo")


def _validate_lora(cfg: Config) -> None:
    lo = cfg.model.lora
    _check(lo.rank >= 0, "model.lora.rank", f"must be >= 0 (0 = no adapters), got {lo.rank}")
    _check(lo.alpha > 0, "model.lora.alpha", f"must be > 0, got {lo.alpha}")
    _check(0 <= lo.dropout < 1, "model.lora.dropout", f"must be in [0, 1), got {lo.dropout}")
    _check(bool(lo.targets), "model.lora.targets", f"must name at least one of {', '.join(LORA_TARGETS)}")
    for i, t in enumerate(lo.targets):
        _check(t in LORA_TARGETS, f"model.lora.targets[{i}]", f"unknown layer {t!r} (known: {', '.join(LORA_TARGETS)})")
    dup = sorted({t for t in lo.targets if lo.targets.count(t) > 1})
    _check(not dup, "model.lora.targets", f"lists {', '.join(dup)} more than once")
    q = cfg.model.quantize_base
    _check(q in QUANTIZE_BASE, "model.quantize_base", f"unknown {q!r} (known: {', '.join(QUANTIZE_BASE)})")
    _check(q == "none" or lo.rank > 0, "model.quantize_base",
           f"{q} quantizes the frozen base of LoRA: it needs model.lora.rank > 0 (QLoRA)")
    _check(q == "none" or cfg.dpo.reference != "precomputed", "dpo.reference",
           f"precomputed scores the unquantized base; under model.quantize_base {q} use model (the policy with its adapters off)")


def _validate_dpo(cfg: Config) -> None:
    d = cfg.dpo
    _check(d.loss_type in DPO_LOSSES, "dpo.loss_type", f"must be one of {'|'.join(DPO_LOSSES)}, got {d.loss_type!r}")
    _check(d.beta > 0, "dpo.beta", f"must be > 0, got {d.beta}")
    _check(0 <= d.label_smoothing < 0.5, "dpo.label_smoothing", f"must be in [0, 0.5) (the probability a label is flipped), got {d.label_smoothing}")
    _check(d.label_smoothing == 0 or d.loss_type == "sigmoid", "dpo.label_smoothing",
           f"applies to dpo.loss_type=sigmoid (cDPO), not {d.loss_type}; set it to 0")
    _check(d.reference in ("model", "precomputed"), "dpo.reference", f"must be model|precomputed, got {d.reference!r}")
    for k in ("prompt_field", "chosen_field", "rejected_field"):
        _check(bool(getattr(d, k)), f"dpo.{k}", "must be a non-empty field name")
    _check(d.overlong in ("truncate", "skip"), "dpo.overlong", f"must be truncate|skip, got {d.overlong!r}")
    _check(bool(d.code_opt_rejected), "dpo.code_opt_rejected", "must name wrong and/or reference")
    for i, r in enumerate(d.code_opt_rejected):
        _check(r in ("wrong", "reference"), f"dpo.code_opt_rejected[{i}]", f"must be wrong or reference, got {r!r}")


def dp_worlds(cfg: Config) -> List[int]:
    """The data-parallel world sizes the run may take: each world size in
    scaling.min_workers..max_workers that whole pipelines of tensor-parallel groups fill, over
    parallel.pp x parallel.tp (elastic sizes are whole units: elastic/launch/runtime/lean_train.py)."""
    unit = max(1, cfg.parallel.tp) * max(1, cfg.parallel.pp)
    return [w // unit for w in range(cfg.scaling.min_workers, cfg.scaling.max_workers + 1) if w % unit == 0]


def _ranks(cfg: Config) -> str:
    p = cfg.parallel
    if p.tp == 1 and p.pp == 1:
        return "workers"
    if p.pp == 1:
        return f"data-parallel ranks (workers / parallel.tp {p.tp})"
    return f"data-parallel ranks (workers / (parallel.pp {p.pp} x parallel.tp {p.tp}))"


def _validate_parallel(cfg: Config, job: str = "pretrain") -> None:
    """The layout (elastic/train/mesh.py): sizes, and what tensor and pipeline parallelism cannot
    split yet."""
    p, s = cfg.parallel, cfg.scaling
    _check(p.dp_replicate >= 1, "parallel.dp_replicate", f"must be >= 1, got {p.dp_replicate}")
    _check(p.tp >= 1, "parallel.tp", f"must be >= 1, got {p.tp}")
    _check(p.pp >= 1, "parallel.pp", f"must be >= 1, got {p.pp}")
    unit, what = p.tp * p.pp, ("parallel.tp" if p.pp == 1 else "parallel.pp")
    _check(s.min_workers % unit == 0 and s.max_workers % unit == 0, what,
           f"workers come in groups of {unit}{'' if p.pp == 1 else f' (parallel.pp {p.pp} x parallel.tp {p.tp})'}: "
           f"scaling.min_workers={s.min_workers} and max_workers={s.max_workers} must be multiples of it")
    _check(p.dp_replicate <= s.max_workers // unit, "parallel.dp_replicate",
           f"{p.dp_replicate} replicas need at least as many data-parallel ranks; scaling.max_workers / "
           f"{'parallel.tp' if p.pp == 1 else '(parallel.pp x parallel.tp)'} is {s.max_workers // unit}")
    _validate_pipeline(cfg, job)
    if p.tp == 1:
        return
    _check(cfg.model.lora.rank == 0, "parallel.tp", "LoRA under tensor parallelism is not supported yet (use tp 1)")
    _check(cfg.rl.rollout.placement == "colocated", "parallel.tp",
           "a disaggregated rollout fleet under tensor parallelism is not supported yet (rl.rollout.placement colocated)")
    why = tp_unsupported(resolved_model_dims(cfg), p.tp)
    _check(why is None, "parallel.tp", f"{why} (parallel.tp {p.tp})")
    _check(cfg.data.seq_len % p.tp == 0, "parallel.tp", f"data.seq_len {cfg.data.seq_len} must be a multiple of it "
           "(sequence parallelism splits the sequence)")


def _validate_pipeline(cfg: Config, job: str) -> None:
    """`parallel.pp*` (elastic/train/pipeline.py): the layout divides the model, the jobs that
    pipeline (pretraining and SFT), and each world size's micro-batches split into the
    schedule's pieces."""
    from elastic.config.micro_batch import fitted_micro_batch
    from elastic.config.pipeline_layout import pipeline_unsupported

    p, t = cfg.parallel, cfg.train
    dims = resolved_model_dims(cfg)
    why = pipeline_unsupported(dims["n_layers"], p.pp, p.pp_virtual_stages, p.pp_microbatches, p.pp_schedule)
    if why:
        raise ConfigError(why)  # it names its keys
    if p.pp == 1:
        return
    names = {"grpo": "GRPO / PPO (rl.*)", "dpo": "DPO", "reward_model": "reward-model training"}
    _check(job not in names, "parallel.pp",
           f"{names.get(job, job)} does not run pipelined; pipeline stages are for pretraining and SFT (set parallel.pp 1)")
    _check(cfg.model.lora.rank == 0 and getattr(cfg.model, "quantize_base", "none") == "none", "parallel.pp",
           "LoRA / QLoRA (model.lora, model.quantize_base) under pipeline stages is not supported yet (set parallel.pp 1)")
    _check(not cfg.eval.tasks, "eval.tasks", "in-training task evaluation under pipeline stages (parallel.pp "
           f"{p.pp}) is not built yet: evaluate the checkpoints with jobs/eval.py (the held-out loss still runs)")
    for w in dp_worlds(cfg):
        if t.global_batch_size % w:
            continue  # the global batch's own check names it
        share = t.global_batch_size // w
        mb = fitted_micro_batch(share, t.micro_batch_size)
        _check(mb % p.pp_microbatches == 0, "parallel.pp_microbatches",
               f"{p.pp_microbatches} pipeline micro-batches do not split a {mb}-row micro-batch "
               f"(train.micro_batch_size {t.micro_batch_size} fitted to each data-parallel rank's {share} rows "
               f"at {w} {_ranks(cfg)}): make train.micro_batch_size a multiple of it")


def tp_unsupported(dims: Mapping[str, Any], tp: int) -> Optional[str]:
    """Why a model of `dims` (ModelArgs fields) cannot be split over `tp` tensor-parallel ranks
    (elastic/train/parallelize.py); None: it can."""
    if tp == 1:
        return None
    if dims["n_heads"] % tp or dims.get("n_kv_heads", dims["n_heads"]) % tp:
        return f"{dims['n_heads']} query and {dims.get('n_kv_heads', dims['n_heads'])} key/value heads do not split over {tp} ranks"
    if dims["ffn_hidden"] % tp:
        return f"model.ffn_hidden {dims['ffn_hidden']} does not split over {tp} ranks"
    return None


def _validate_rl_world_sizes(cfg: Config) -> None:
    """Every world size the run may take must split each optimizer step's completions evenly
    over the workers (the rl analogue of train.global_batch_size's check); rl.micro_batch_size
    is an upper bound that each worker fits to its share (config/micro_batch.py)."""
    rl, s = cfg.rl, cfg.scaling
    n = rl.prompts_per_step * rl.group_size
    _check(n % rl.minibatches_per_update == 0, "rl.minibatches_per_update",
           f"{rl.prompts_per_step} prompts x {rl.group_size} samples = {n} completions cannot be split into "
           f"{rl.minibatches_per_update} equal minibatches")
    per_step = n // rl.minibatches_per_update
    for w in dp_worlds(cfg):
        _check(per_step % w == 0, "rl.prompts_per_step",
               f"{rl.prompts_per_step} prompts x {rl.group_size} samples / {rl.minibatches_per_update} minibatch(es) = "
               f"{per_step} completions per optimizer step cannot be split evenly over {w} {_ranks(cfg)} "
               f"(per worker: {per_step / w:g}); every world size in scaling.min_workers.."
               f"scaling.max_workers={s.min_workers}..{s.max_workers} must divide it")


def _valid_step_range(spec: str) -> bool:
    if not spec:
        return True
    a, _, b = spec.partition(":")
    try:
        lo, hi = int(a), int(b or a)
    except ValueError:
        return False
    return 1 <= lo <= hi


def resolved_model_dims(cfg: Config) -> Dict[str, Any]:
    """ModelArgs fields: the preset's sizes with every explicitly set model field applied on
    top; or, with `model.init_from`, the source's sizes and vocabulary (an explicit field
    that disagrees is a ConfigError). max_seq_len is data.seq_len either way. `num_labels`
    (with tie_embeddings false) is there only for a scalar head (model.num_labels 1)."""
    if cfg.model.init_from:
        return init_from_dims(cfg)
    return preset_model_dims(cfg)


def resolved_tokenizer(cfg: Config) -> str:
    """The tokenizer.json a run uses: `data.tokenizer`, else the one that comes with
    `model.init_from`, else "" (train a BPE on the corpus and save it with the run)."""
    if cfg.data.tokenizer:
        return cfg.data.tokenizer
    if cfg.model.init_from:
        return resolve_init_from(cfg.model.init_from).tokenizer
    return ""


def run_dir(cfg: Config) -> str:
    """`<storage_path>/<name>`, absolute for local paths (Ray workers may run elsewhere)."""
    sp = cfg.run.storage_path
    if "://" not in sp:
        sp = os.path.abspath(sp)
    return f"{sp.rstrip('/')}/{cfg.run.name}"
