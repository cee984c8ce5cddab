"""Model dimensions from a Hugging Face `config.json` (Llama / Qwen2), as plain JSON.

Lives in the config layer because config validation resolves `model.init_from` before any
work starts, and must not import torch or the model. elastic/model/hf.py builds on it (the
weight-name map, the safetensors checks, loading and export).

Supported: `LlamaForCausalLM` and `Qwen2ForCausalLM` with SiLU MLPs, default RoPE, no
sliding window, head_dim = hidden_size / num_attention_heads. Anything else is one line
naming the key in config.json.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


class HFConfigError(ValueError):
    """A Hugging Face directory this project cannot load; the message is one line."""


def is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and not os.path.isfile(os.path.join(path, "train_state.json"))


def read_hf_config(path: str) -> Dict[str, Any]:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise HFConfigError(f"{cfg_path}: not found")
    try:
        with open(cfg_path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise HFConfigError(f"{cfg_path}: not readable JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise HFConfigError(f"{cfg_path}: top level must be an object")
    return raw


def hf_architecture(raw: Dict[str, Any], where: str = "config.json") -> str:
    archs = raw.get("architectures")
    if archs:
        if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
            raise HFConfigError(f"{where}: architectures {archs!r} not supported (supported: {', '.join(ARCHITECTURES)})")
        return archs[0]
    mt = raw.get("model_type")
    if mt in _MODEL_TYPES:
        return _MODEL_TYPES[mt]
    raise HFConfigError(f"{where}: model_type {mt!r} not supported (supported: {', '.join(ARCHITECTURES)})")


def _rope_theta(raw: Dict[str, Any], where: str) -> float:
    # transformers >= 5 writes rope_parameters; 4.x writes rope_theta (+ rope_scaling).
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise HFConfigError(f"{where}: rope_parameters must be an object, got {params!r}")
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype not in (None, "default"):
        key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
        raise HFConfigError(f"{where}: {key}.rope_type {rtype!r} not supported (only default RoPE)")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise HFConfigError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def hf_model_dims(path: str) -> Dict[str, Any]:
    """ModelArgs fields from `<path>/config.json`; max_seq_len is max_position_embeddings."""
    raw = read_hf_config(path)
    where = os.path.join(path, "config.json")
    arch = hf_architecture(raw, where)

    def need_int(key: str) -> int:
        if key not in raw:
            raise HFConfigError(f"{where}: missing key {key}")
        v = raw[key]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise HFConfigError(f"{where}: {key} must be a positive integer, got {v!r}")
        return v

    dim, n_heads = need_int("hidden_size"), need_int("num_attention_heads")
    n_kv = raw.get("num_key_value_heads") or n_heads
    if dim % n_heads:
        raise HFConfigError(f"{where}: hidden_size {dim} is not divisible by num_attention_heads {n_heads}")
    if raw.get("head_dim") not in (None, dim // n_heads):
        raise HFConfigError(f"{where}: head_dim {raw['head_dim']} != hidden_size / num_attention_heads = {dim // n_heads} (not supported)")
    if not isinstance(n_kv, int) or n_heads % n_kv:
        raise HFConfigError(f"{where}: num_attention_heads {n_heads} is not divisible by num_key_value_heads {n_kv!r}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise HFConfigError(f"{where}: hidden_act {act!r} not supported (only silu)")
    if raw.get("mlp_bias"):
        raise HFConfigError(f"{where}: mlp_bias true not supported")
    if arch == "LlamaForCausalLM" and raw.get("attention_bias"):
        raise HFConfigError(f"{where}: attention_bias true not supported (it also biases o_proj)")
    if arch == "Qwen2ForCausalLM" and raw.get("use_sliding_window"):
        raise HFConfigError(f"{where}: use_sliding_window true not supported")
    eps = raw.get("rms_norm_eps", 1e-6)
    tie = raw.get("tie_word_embeddings", False)  # both classes default to untied
    if not isinstance(tie, bool):
        raise HFConfigError(f"{where}: tie_word_embeddings must be true/false, got {tie!r}")
    return dict(
        vocab_size=need_int("vocab_size"), dim=dim, n_layers=need_int("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=n_kv, ffn_hidden=need_int("intermediate_size"), max_seq_len=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=tie, rope_theta=_rope_theta(raw, where), norm_eps=float(eps),
        qkv_bias=arch == "Qwen2ForCausalLM",
    )
