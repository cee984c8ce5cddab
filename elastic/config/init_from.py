"""Resolve `model.init_from`: where the starting weights, sizes and tokenizer come from.

Two kinds of source, told apart by their files:

* a Hugging Face directory (`config.json`, safetensors, `tokenizer.json`): sizes from its
  config.json (elastic/config/hf_config.py), tokenizer from the same directory;
* one of our checkpoints, `<run>/step_N` (has `train_state.json`): sizes from the run's
  resolved config `<run>/config.json` (recursively, if that run itself started from
  another source), tokenizer from the run (its `data.tokenizer`, else `<run>/tokenizer.json`).

The dims carry `num_labels` only for a scalar-head model (reward model, critic): an HF
*ForSequenceClassification directory, or a run with `model.num_labels: 1` (whatever it started
from: its checkpoints hold its own head). A causal LM's dims have no such key.

Only the driver-side facts live here (plain files, no torch). Weight checks and loading are
in elastic/model/hf.py. Local paths only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict

from elastic.config.build import _build
from elastic.config.dims import preset_model_dims, with_num_labels
from elastic.config.errors import ConfigError
from elastic.config.hf_config import HFConfigError, hf_model_dims, is_hf_dir
from elastic.config.schema import Config

KEY = "model.init_from"


@dataclass(frozen=True)
class InitFrom:
    kind: str         # "hf" | "dcp"
    path: str         # absolute: the HF directory, or the step_N checkpoint directory
    config_path: str  # the HF config.json, or the run's config.json
    tokenizer: str    # the tokenizer.json that goes with these weights
    dims: Dict[str, Any]  # ModelArgs fields (max_seq_len: the source's own)


def _error(msg: str, key: str = KEY):
    return ConfigError(f"{key}: {msg}")


def resolve_init_from(path: str, key: str = KEY) -> InitFrom:
    """Classify and read a `model.init_from` path; ConfigError (one line, starting with
    `key`) if unusable."""
    try:
        return _resolve(path, ())
    except ValueError as e:  # ConfigError; re-keyed for callers other than the config
        if isinstance(e, ConfigError) and key != KEY and str(e).startswith(KEY + ": "):
            raise ConfigError(f"{key}: {str(e)[len(KEY) + 2:]}") from None
        raise


def _resolve(path: str, seen: tuple) -> InitFrom:
    if "://" in path:
        raise _error(f"{path}: only local paths are supported")
    p = os.path.abspath(path)
    if p in seen:
        raise _error(f"{path}: checkpoints start from each other in a cycle")
    if not os.path.isdir(p):
        raise _error(f"{path}: no such directory")
    if os.path.isfile(os.path.join(p, "train_state.json")):
        return _from_checkpoint(p, seen + (p,))
    if not os.path.isfile(os.path.join(p, "config.json")):
        raise _error(f"{path}: neither a Hugging Face directory (config.json) nor a checkpoint (train_state.json)")
    assert is_hf_dir(p)
    try:
        dims = hf_model_dims(p)
    except HFConfigError as e:
        raise _error(str(e)) from None
    tok = os.path.join(p, "tokenizer.json")
    if not os.path.isfile(tok):
        raise _error(f"{tok}: not found (the tokenizer must come with the weights)")
    return InitFrom("hf", p, os.path.join(p, "config.json"), tok, dims)


def _from_checkpoint(step_dir: str, seen: tuple) -> InitFrom:
    if not os.path.isfile(os.path.join(step_dir, ".metadata")):
        raise _error(f"{step_dir}: no .metadata (not a complete checkpoint)")
    run = os.path.dirname(step_dir)
    cfg_path = os.path.join(run, "config.json")
    if not os.path.isfile(cfg_path):
        raise _error(f"{cfg_path}: not found (the run directory of a checkpoint holds its config)")
    try:
        with open(cfg_path) as f:
            raw = json.load(f)
        # Only the sections that decide sizes and tokenizer: the rest may come from another version.
        run_cfg = _build(Config, {k: raw.get(k, {}) for k in ("model", "data")}, "")
    except (OSError, json.JSONDecodeError, ConfigError) as e:
        raise _error(f"{cfg_path}: {str(e).splitlines()[0]}") from None
    if run_cfg.model.init_from:
        parent = _resolve(run_cfg.model.init_from, seen)
        dims, parent_tok = dict(parent.dims), parent.tokenizer
        dims = _apply_explicit(run_cfg, dims, parent.config_path)
    else:
        dims, parent_tok = preset_model_dims(run_cfg), ""
    dims = with_num_labels(dims, run_cfg.model.num_labels)
    dims["max_seq_len"] = run_cfg.data.seq_len
    if run_cfg.data.tokenizer:
        tok = run_cfg.data.tokenizer
    elif parent_tok:
        tok = parent_tok
    else:
        tok = os.path.join(run, "tokenizer.json")
    if not os.path.isfile(tok):
        raise _error(f"{tok}: not found (the tokenizer of the run {run})")
    return InitFrom("dcp", step_dir, cfg_path, os.path.abspath(tok), dims)


DIM_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "tie_embeddings", "rope_theta", "norm_eps", "qkv_bias")


def _apply_explicit(cfg, dims: Dict[str, Any], source: str) -> Dict[str, Any]:
    """An explicitly set size field must agree with the source (it cannot change trained shapes)."""
    for f in DIM_FIELDS:
        v = getattr(cfg.model, f)
        if v is not None and v != dims[f]:
            raise ConfigError(f"model.{f}: {v!r} conflicts with {dims[f]!r} from {source} (model.init_from); leave it unset")
    return dims


def init_from_dims(cfg) -> Dict[str, Any]:
    """ModelArgs fields for a config with `model.init_from` set (max_seq_len = data.seq_len).

    `model.num_labels` decides the head: 1 on a causal LM's backbone is a new score head (the
    source's vocabulary projection is not used); a scalar-head source needs model.num_labels 1."""
    src = resolve_init_from(cfg.model.init_from)
    dims = _apply_explicit(cfg, dict(src.dims), src.config_path)
    if src.dims.get("num_labels") and not cfg.model.num_labels:
        raise ConfigError(f"model.num_labels: 0 (a causal LM) conflicts with {src.dims['num_labels']} from {src.config_path} "
                          "(model.init_from is a scalar-head model: a reward model or critic); set model.num_labels: "
                          f"{src.dims['num_labels']}")
    dims = with_num_labels(dims, cfg.model.num_labels)
    dims["max_seq_len"] = cfg.data.seq_len
    return dims
