"""Load a config from YAML plus ``--set key.sub=value`` overrides, and validate it.

Every problem is a :class:`ConfigError` whose message is one line naming the key, raised
before Ray starts anything: an unknown key, a wrong type or an impossible value.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional

import yaml

from elastic.config.schema import Config


class ConfigError(ValueError):
    """A bad config: the message is a single line that names the offending key."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check (and gently coerce) `value` against the annotated type `tp`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        kt, vt = args or (str, Any)
        return {_coerce(f"{key}.{k}", k, kt): _coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    if origin in (list, typing.List):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (et,) = args or (Any,)
        return [_coerce(f"{key}[{i}]", v, et) for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{key}: unknown key (known: {known})")
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            if not isinstance(v, Mapping):
                raise ConfigError(f"{key}: expected a section (mapping), got {v!r}")
            kwargs[k] = _build(tp, v, f"{key}.")
        else:
            kwargs[k] = _coerce(key, v, tp)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """`--set` values are YAML scalars: 3, 0.1, true, null, [1, 2], {a: 1}, or a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


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
        node[parts[-1]] = _parse_scalar(text)
    return raw


def from_dict(raw: Optional[Mapping[str, Any]]) -> Config:
    """Build and validate a Config from a nested mapping."""
    cfg = _build(Config, raw or {}, "")
    validate(cfg)
    return cfg


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Config:
    """Read YAML at `path` (optional), apply overrides, validate; ConfigError on any problem."""
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
    return from_dict(raw)


def to_dict(cfg: Config) -> Dict[str, Any]:
    return dataclasses.asdict(cfg)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


ATTENTION_BACKENDS = ("auto", "flash_varlen", "torch_varlen", "flex", "sdpa_mask", "sdpa_loop")


def validate(cfg: Config) -> None:
    """Cross-field checks that make a run impossible; one line naming the key."""
    from elastic.config.presets import PRESETS

    d, m, t, s, c = cfg.data, cfg.model, cfg.train, cfg.scaling, cfg.checkpoint
    _check(bool(cfg.run.name) and "/" not in cfg.run.name, "run.name", f"must be a non-empty name without '/', got {cfg.run.name!r}")
    _check(d.format in ("auto", "text", "jsonl", "parquet"), "data.format", f"must be auto|text|jsonl|parquet, got {d.format!r}")
    _check(d.seq_len >= 8, "data.seq_len", f"must be >= 8, got {d.seq_len}")
    _check(d.vocab_size >= 260, "data.vocab_size", f"must be >= 260 (256 bytes + specials), got {d.vocab_size}")
    _check(d.shard_mb > 0, "data.shard_mb", f"must be > 0, got {d.shard_mb}")
    _check(d.tokenize_cpus > 0, "data.tokenize_cpus", f"must be > 0, got {d.tokenize_cpus}")
    _check(m.preset in PRESETS, "model.preset", f"unknown preset {m.preset!r} (known: {', '.join(PRESETS)})")
    _check(m.attention in ATTENTION_BACKENDS, "model.attention", f"must be one of {'|'.join(ATTENTION_BACKENDS)}, got {m.attention!r}")
    dims = resolved_model_dims(cfg)
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
    _check(t.activation_checkpointing in ("none", "full"), "train.activation_checkpointing", f"must be none|full, got {t.activation_checkpointing!r}")
    _check(0 <= t.until_step <= t.steps, "train.until_step", f"must be in [0, train.steps={t.steps}], got {t.until_step}")
    _check(t.log_every >= 1, "train.log_every", f"must be >= 1, got {t.log_every}")
    _check(s.min_workers >= 1, "scaling.min_workers", f"must be >= 1, got {s.min_workers}")
    _check(s.max_workers >= s.min_workers, "scaling.max_workers", f"must be >= scaling.min_workers={s.min_workers}, got {s.max_workers}")
    _check(s.use_gpu in ("auto", "true", "false"), "scaling.use_gpu", f"must be auto|true|false, got {s.use_gpu!r}")
    _check(s.cpus_per_worker >= 0, "scaling.cpus_per_worker", f"must be >= 0, got {s.cpus_per_worker}")
    _check(s.max_failures >= -1, "scaling.max_failures", f"must be >= -1 (-1 = unlimited), got {s.max_failures}")
    _check(s.worker_group_start_timeout_s > 0, "scaling.worker_group_start_timeout_s", "must be > 0")
    _check(s.elastic_resize_monitor_interval_s > 0, "scaling.elastic_resize_monitor_interval_s", "must be > 0")
    # Every world size the run may take must split the global batch into whole micro-batches.
    for w in range(s.min_workers, s.max_workers + 1):
        per = t.global_batch_size / w
        _check(
            t.global_batch_size % w == 0 and (t.global_batch_size // w) % t.micro_batch_size == 0,
            "train.global_batch_size",
            f"{t.global_batch_size} sequences cannot be split over {w} workers into micro-batches of "
            f"{t.micro_batch_size} (per worker: {per:g}); every world size in scaling.min_workers.."
            f"scaling.max_workers={s.min_workers}..{s.max_workers} must divide it",
        )
    _check(c.every_steps >= 1, "checkpoint.every_steps", f"must be >= 1, got {c.every_steps}")
    _check(c.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1, got {c.keep_last}")
    _check(cfg.wandb.mode in ("auto", "online", "offline", "disabled"), "wandb.mode", f"must be auto|online|offline|disabled, got {cfg.wandb.mode!r}")
    r = cfg.reward
    _check(r.num_actors >= 1, "reward.num_actors", f"must be >= 1, got {r.num_actors}")
    _check(r.timing in ("wall", "instructions"), "reward.timing", f"must be wall|instructions, got {r.timing!r}")
    _check(r.max_in_flight_per_actor >= 1, "reward.max_in_flight_per_actor", f"must be >= 1, got {r.max_in_flight_per_actor}")
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


def resolved_model_dims(cfg: Config) -> Dict[str, Any]:
    """The preset's sizes with every explicitly set model field applied on top."""
    from elastic.config.presets import PRESETS

    dims = dict(PRESETS[cfg.model.preset])
    for f in dataclasses.fields(cfg.model):
        v = getattr(cfg.model, f.name)
        if f.name in dims and v is not None:
            dims[f.name] = v
    dims["vocab_size"] = cfg.data.vocab_size
    dims["max_seq_len"] = cfg.data.seq_len
    return dims


def run_dir(cfg: Config) -> str:
    """`<storage_path>/<name>`, absolute for local paths (Ray workers may run elsewhere)."""
    sp = cfg.run.storage_path
    if "://" not in sp:
        sp = os.path.abspath(sp)
    return f"{sp.rstrip('/')}/{cfg.run.name}"
