"""Model dimensions from a Hugging Face `config.json` (Llama / Qwen2 / Qwen3), as plain JSON.

Lives in the config layer because config validation resolves `model.init_from` before any
work starts, and must not import torch or the model. elastic/model/hf.py builds on it (the
weight-name map, the safetensors checks, loading and export).

Supported: `LlamaForCausalLM` (Llama 2/3/3.1/3.2), `Qwen2ForCausalLM` and `Qwen3ForCausalLM`,
and their `*ForSequenceClassification` with one label (reward models, critics: a bias-free
`score` head [1, hidden] instead of `lm_head`), with SiLU MLPs, no sliding window, RoPE plain
or scaled "linear" or "llama3" (Llama 3.1/3.2's `rope_scaling`), any even head_dim. Anything else (yarn, dynamic, longrope RoPE; o_proj or MLP
biases; ...) is one line naming config.json and the key, before any weight is read.

The dims carry only the ModelArgs fields a model needs: `qk_norm` (Qwen3), `head_dim` (when it
is not hidden_size / num_attention_heads) and `rope_scaling` (when not plain RoPE) appear only
when they apply, so a Llama or Qwen2 directory gives the same dims as before they existed;
`num_labels` (1) likewise, for a *ForSequenceClassification directory only. Its head is never
tied, whatever `tie_word_embeddings` says (that flag is about `lm_head`, which such a model
does not have: Qwen3 reward models often keep their base's `true`), so tie_embeddings is false.
The number of labels is read as transformers reads it: the length of `id2label` when present,
else `num_labels`, else 2 (transformers' default).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

CAUSAL_LM = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SEQ_CLS = "ForSequenceClassification"
ARCHITECTURES = CAUSAL_LM + tuple(a.replace("ForCausalLM", SEQ_CLS) for a in CAUSAL_LM)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")
# transformers' Qwen3Config default when config.json has no head_dim (Llama/Qwen2: hidden / heads).
QWEN3_DEFAULT_HEAD_DIM = 128


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


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rope(raw: Dict[str, Any], where: str) -> Tuple[float, Optional[Dict[str, Any]]]:
    """(rope_theta, ModelArgs.rope_scaling) as transformers reads them.

    transformers >= 5 writes `rope_parameters`; 4.x writes `rope_theta` and `rope_scaling`
    (`type` in older files, `rope_type` in newer). As in transformers 5, a non-empty
    `rope_scaling` wins over `rope_parameters`, and a theta inside the dict over the top-level
    one. The scaling dict holds every value the frequencies need, resolved here (e.g. a missing
    original_max_position_embeddings falls back to max_position_embeddings, as transformers'),
    since our max_seq_len later becomes the run's data.seq_len."""
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise HFConfigError(f"{where}: {key} must be an object, got {params!r}")
    field = "rope_type" if "rope_type" in params else "type"
    rtype = params.get(field)
    if rtype is None:
        rtype = "default"
    if rtype not in ROPE_TYPES:
        raise HFConfigError(f"{where}: {key}.{field} {rtype!r} not supported (supported: {', '.join(ROPE_TYPES)})")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not _number(theta) or theta <= 0:
        raise HFConfigError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    prf = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if prf not in (None, 1, 1.0):
        raise HFConfigError(f"{where}: partial_rotary_factor {prf!r} not supported (only 1.0)")
    if rtype == "default":
        return float(theta), None

    def num(name: str, positive: bool = True) -> float:
        v = params.get(name)
        if not _number(v) or (positive and v <= 0):
            raise HFConfigError(f"{where}: {key}.{name} must be a positive number for rope_type {rtype!r}, got {v!r}")
        return float(v)

    scaling: Dict[str, Any] = {"rope_type": rtype, "factor": num("factor")}
    if rtype == "llama3":
        low, high = num("low_freq_factor"), num("high_freq_factor")
        if high <= low:
            raise HFConfigError(f"{where}: {key}.high_freq_factor {high} must be greater than low_freq_factor {low}")
        # transformers: a top-level original_max_position_embeddings (Phi-3 style) wins, then the
        # dict's, then max_position_embeddings.
        old = raw.get("original_max_position_embeddings", params.get("original_max_position_embeddings",
                                                                      raw.get("max_position_embeddings", 2048)))
        if not isinstance(old, int) or isinstance(old, bool) or old <= 0:
            raise HFConfigError(f"{where}: {key}.original_max_position_embeddings must be a positive integer, got {old!r}")
        scaling.update(low_freq_factor=low, high_freq_factor=high, original_max_position_embeddings=old)
    return float(theta), scaling


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

    num_labels = None
    if arch.endswith(SEQ_CLS):
        num_labels = _num_labels(raw, where, arch)
        arch = arch.replace(SEQ_CLS, "ForCausalLM")  # the same backbone and checks as the causal LM
    dim, n_heads = need_int("hidden_size"), need_int("num_attention_heads")
    n_kv = raw.get("num_key_value_heads") or n_heads
    head_dim = raw.get("head_dim")
    if head_dim is None and arch == "Qwen3ForCausalLM":
        head_dim = QWEN3_DEFAULT_HEAD_DIM
    if head_dim is None:
        if dim % n_heads:
            raise HFConfigError(f"{where}: hidden_size {dim} is not divisible by num_attention_heads {n_heads}")
        head_dim = dim // n_heads
    elif not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0 or head_dim % 2:
        raise HFConfigError(f"{where}: head_dim must be a positive even integer (RoPE), got {head_dim!r}")
    if not isinstance(n_kv, int) or n_heads % n_kv:
        raise HFConfigError(f"{where}: num_attention_heads {n_heads} is not divisible by num_key_value_heads {n_kv!r}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise HFConfigError(f"{where}: hidden_act {act!r} not supported (only silu)")
    if raw.get("mlp_bias"):
        raise HFConfigError(f"{where}: mlp_bias true not supported")
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and raw.get("attention_bias"):
        raise HFConfigError(f"{where}: attention_bias true not supported (it also biases o_proj)")
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and raw.get("use_sliding_window"):
        raise HFConfigError(f"{where}: use_sliding_window true not supported")
    eps = raw.get("rms_norm_eps", 1e-6)
    tie = raw.get("tie_word_embeddings", False)  # both classes default to untied
    if not isinstance(tie, bool):
        raise HFConfigError(f"{where}: tie_word_embeddings must be true/false, got {tie!r}")
    theta, scaling = _rope(raw, where)
    dims: Dict[str, Any] = dict(
        vocab_size=need_int("vocab_size"), dim=dim, n_layers=need_int("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=n_kv, ffn_hidden=need_int("intermediate_size"), max_seq_len=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=tie, rope_theta=theta, norm_eps=float(eps),
        qkv_bias=arch == "Qwen2ForCausalLM",
    )
    if arch == "Qwen3ForCausalLM":
        dims["qk_norm"] = True
    if dim % n_heads or head_dim != dim // n_heads:
        dims["head_dim"] = head_dim
    if scaling is not None:
        dims["rope_scaling"] = scaling
    if num_labels is not None:
        dims["tie_embeddings"] = False
        dims["num_labels"] = num_labels
    return dims


def _num_labels(raw: Dict[str, Any], where: str, arch: str) -> int:
    """A *ForSequenceClassification's label count as transformers reads it; only 1 is supported."""
    id2label, n = raw.get("id2label"), raw.get("num_labels")
    if id2label is not None and not isinstance(id2label, dict):
        raise HFConfigError(f"{where}: id2label must be an object, got {id2label!r}")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
        raise HFConfigError(f"{where}: num_labels must be an integer, got {n!r}")
    if id2label is not None and n is not None and len(id2label) != n:
        raise HFConfigError(f"{where}: num_labels {n} disagrees with id2label's {len(id2label)} labels")
    labels = len(id2label) if id2label is not None else n if n is not None else 2
    if labels != 1:
        key = "id2label" if id2label is not None else "num_labels"
        raise HFConfigError(f"{where}: {key} gives {labels} labels for {arch}; only 1 is supported (a scalar score head: "
                            "reward model, critic)")
    return labels
