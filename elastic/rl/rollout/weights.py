"""Policy weights on their way from the trainers to the rollout fleet, as a few flat buffers.

The trainers gather their FSDP shards once per sync (elastic/train/fsdp_generate.py's
`gathered_parameters`), and rank 0 packs the trainable tensors into buckets of at most
`bucket_bytes`: one contiguous uint8 array each, plus a small table of (name, dtype, shape,
bucket, offset). The buckets go into the Ray object store (rank 0 owns them), and every rollout
actor maps them without a copy (numpy arrays in shared memory on its node) and copies each
tensor into its model.

Under LoRA only the adapters are trainable, so only they travel; the frozen base is loaded by
each actor from `model.init_from`, as the trainers load it. Dtypes are kept (bf16 stays bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import torch

CLEAN = "_checkpoint_wrapped_module."  # activation checkpointing's wrapper in parameter names


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str       # torch dtype name, e.g. "float32", "bfloat16"
    shape: Tuple[int, ...]
    bucket: int
    offset: int      # bytes into the bucket
    nbytes: int


def trainable_tensors(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """{clean parameter name: tensor} of the parameters that train (all of them in full
    fine-tuning; the adapters under LoRA). Call on unsharded parameters."""
    return {n.replace(CLEAN, ""): p.detach() for n, p in model.named_parameters() if p.requires_grad}


def pack(tensors: Dict[str, torch.Tensor], bucket_bytes: int) -> Tuple[List[Entry], List[np.ndarray]]:
    """Flat uint8 buckets holding every tensor (in name order), and the table to read them."""
    entries: List[Entry] = []
    sizes: List[int] = []
    for name in sorted(tensors):
        t = tensors[name]
        nb = t.numel() * t.element_size()
        if not sizes or (sizes[-1] + nb > bucket_bytes and sizes[-1] > 0):
            sizes.append(0)
        entries.append(Entry(name, str(t.dtype).replace("torch.", ""), tuple(t.shape), len(sizes) - 1, sizes[-1], nb))
        sizes[-1] += nb
    buckets = [np.empty(n, np.uint8) for n in sizes]
    for e in entries:
        # Copy into a view of the bucket: never let numpy share the parameter's storage (FSDP2
        # frees an unsharded parameter by resizing its storage, which a shared one refuses).
        dst = torch.from_numpy(buckets[e.bucket][e.offset:e.offset + e.nbytes])
        dst.copy_(tensors[e.name].detach().reshape(-1).view(torch.uint8).cpu())
    return entries, buckets


def unpack(entries: List[Entry], buckets: List[np.ndarray]) -> Dict[str, torch.Tensor]:
    """{name: tensor} viewing the buckets (no copy; read-only memory stays read-only)."""
    out = {}
    for e in entries:
        raw = torch.from_numpy(np.asarray(buckets[e.bucket][e.offset:e.offset + e.nbytes]))
        out[e.name] = raw.view(getattr(torch, e.dtype)).reshape(e.shape)
    return out


@torch.no_grad()
def load_into(model: torch.nn.Module, tensors: Dict[str, torch.Tensor]) -> int:
    """Copy published tensors into a plain (unsharded) model; returns the bytes copied. Every
    published name must exist in the model with the same shape (a wrong model is an error)."""
    params = {n.replace(CLEAN, ""): p for n, p in model.named_parameters()}
    n = 0
    for name, t in tensors.items():
        if name not in params:
            raise KeyError(f"published weight {name!r} is not a parameter of the rollout model")
        p = params[name]
        if tuple(p.shape) != tuple(t.shape):
            raise ValueError(f"published weight {name!r}: shape {tuple(t.shape)}, rollout model has {tuple(p.shape)}")
        p.copy_(t.to(device=p.device, dtype=p.dtype))
        n += t.numel() * t.element_size()
    return n
