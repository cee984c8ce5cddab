"""Apply FSDP2 or HSDP (and optional activation checkpointing) to a plain model, torchtitan style.

Each transformer block is its own FSDP unit (parameters all-gathered just before the block
runs and freed after), then the root module picks up the embeddings, final norm and output.
Parameters compute in `param_dtype`; gradients are reduced in fp32 and *summed* over ranks
(gradient divide factor 1): the loss is already normalised by the whole global batch's units
(see step.py), so FSDP's default averaging would divide by the world size a second time.
The mesh comes from mesh.py: a 1-D mesh is FSDP, a 2-D (dp_replicate, dp_shard) mesh is HSDP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from elastic.model.llama import Transformer
from elastic.train.mesh import build_mesh, layout_for


def apply_activation_checkpointing(model: Transformer) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def parallelize(model: Transformer, device: torch.device, param_dtype: torch.dtype, activation_checkpointing: str = "none",
                mesh: DeviceMesh | None = None) -> Transformer:
    """`mesh`: the data-parallel mesh (mesh.py); default a 1-D mesh over every rank (FSDP)."""
    if activation_checkpointing == "full":
        apply_activation_checkpointing(model)
    if mesh is None:
        mesh = build_mesh(device.type, layout_for(dist.get_world_size()))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    n = len(model.layers)
    # One worker holds every parameter whole: resharding after forward would only free the
    # compute-dtype copies and cast them again for backward. Keep them (memory: one bf16 copy).
    alone = dist.get_world_size() == 1
    for i, block in enumerate(model.layers):
        # The last block's parameters are needed first in backward: keep them gathered.
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < n - 1 and not alone)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                # A plain SUM (gloo has no PREMUL_SUM; with factor 1 it is the same on NCCL).
                m.set_force_sum_reduction_for_comms(True)
    return model
