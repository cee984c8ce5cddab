"""Read the model weights of one of our checkpoints (`<run>/step_N`) in a single process.

The trainer saves `{"model": ..., "optim": ...}` with torch.distributed.checkpoint (DCP),
which stores logical, unsharded tensor layouts; DCP can also load with `no_dist=True`, no
process group at all. Reading the `.metadata` first gives every model tensor's full shape
and dtype, so only the model entries are read (the optimizer state, twice the size, is not)
and the result is the same whatever world size wrote the checkpoint.

This is file-format reading for tools (export, tests, `hf.from_pretrained`); sharded loading
inside training workers is elastic/train's business.
"""

from __future__ import annotations

import warnings
from typing import Dict, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

PREFIX = "model."


def model_tensor_specs(step_dir: str) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Our FQN → (full shape, dtype) of every model tensor, from `.metadata` alone."""
    md = FileSystemReader(step_dir).read_metadata()
    return {k[len(PREFIX):]: (tuple(m.size), m.properties.dtype)
            for k, m in md.state_dict_metadata.items()
            if k.startswith(PREFIX) and isinstance(m, TensorStorageMetadata)}


def read_model_state(step_dir: str) -> Dict[str, torch.Tensor]:
    """Full model tensors (our FQNs, as `Transformer.state_dict()` names them) on CPU."""
    sd = {k: torch.empty(shape, dtype=dt) for k, (shape, dt) in model_tensor_specs(step_dir).items()}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": sd}, storage_reader=FileSystemReader(step_dir), no_dist=True)
    return sd
