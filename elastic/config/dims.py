"""Model sizes from a preset (no `model.init_from`): shared by load.py and init_from.py."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from elastic.config.presets import PRESETS


def with_num_labels(dims: Dict[str, Any], num_labels: int) -> Dict[str, Any]:
    """`dims` for a model whose head is `num_labels` (model.num_labels: 0 = causal LM): the key
    is present (and tie_embeddings false: a score head is never tied) only for a scalar head."""
    dims = dict(dims)
    if num_labels:
        dims["num_labels"] = num_labels
        dims["tie_embeddings"] = False
    else:
        dims.pop("num_labels", None)
    return dims


def preset_model_dims(cfg) -> Dict[str, Any]:
    """ModelArgs fields of a config without `model.init_from`: the preset's sizes with every
    explicitly set model field applied on top, vocabulary data.vocab_size, max_seq_len
    data.seq_len."""
    dims = dict(PRESETS[cfg.model.preset])
    dims.setdefault("qkv_bias", False)
    for f in dataclasses.fields(cfg.model):
        v = getattr(cfg.model, f.name)
        if f.name in dims and v is not None:
            dims[f.name] = v
    dims["vocab_size"] = cfg.data.vocab_size
    dims["max_seq_len"] = cfg.data.seq_len
    return with_num_labels(dims, cfg.model.num_labels)
