"""Apply FSDP2 (and optional activation checkpointing) to a plain model, torchtitan style.

Each transformer block is its own FSDP unit (parameters all-gathered just before the block
runs and freed after), then the root module picks up the embeddings, final norm and output.
Parameters compute in `param_dtype`; gradients are reduced in fp32 and *summed* over ranks
(gradient divide factor 1): the loss is already normalised by the whole global batch's units
(see step.py), so FSDP's default averaging would divide by the world size a second time.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from elastic.model.llama import Transformer


def apply_activation_checkpointing(model: Transformer) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def parallelize(model: Transformer, device: torch.device, param_dtype: torch.dtype, activation_checkpointing: str = "none") -> Transformer:
    if activation_checkpointing == "full":
        apply_activation_checkpointing(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
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
