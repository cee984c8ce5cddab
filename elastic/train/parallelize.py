"""Apply tensor parallelism, FSDP2 or HSDP (and optional activation checkpointing) to a plain
model, torchtitan style.

Order: tensor + sequence parallelism inside each block over the mesh's `tp` axis, activation
checkpointing, then FSDP2 over the data-parallel axes. Each transformer block is its own FSDP
unit (parameters all-gathered just before the block runs and freed after), then the root module
picks up the embeddings, final norm and output. Parameters compute in `param_dtype`; gradients
are reduced in fp32 and *summed* over ranks (gradient divide factor 1): the loss is already
normalised by the whole global batch's units (see step.py), so FSDP's default averaging would
divide by the world size a second time. The mesh comes from mesh.py: a 1-D data-parallel mesh
is FSDP, a 2-D (dp_replicate, dp_shard) one is HSDP.

Tensor parallelism (the Megatron split, as torchtitan writes it for Llama): q/k/v and gate/up
column-wise, o and down row-wise, so each block needs one all-gather before attention and the
MLP and one reduce-scatter after. Between them the residual stream is sharded over the sequence
(sequence parallelism: the norms run on T/tp positions each). Attention itself sees the whole
sequence with n_heads/tp heads, so document masking is exactly as without TP. After the last
block the stream is gathered, so the final norm, `select`/`last_only` and every job's loss see
ordinary tensors. The output projection is column-wise over the vocabulary.

Loss parallelism (`parallel.loss_parallel`, on by default; torchtitan's default too). The LM
loss of pretraining and SFT (step.py `causal_lm_loss`) takes the logits as they come out of the
column-wise projection, a DTensor sharded over the vocabulary (each rank [.., V/tp]), and
torch's `loss_parallel` computes the cross-entropy from the shards: a max, a sum of exponentials
and the target's logit, each all-reduced over tp, so no rank ever holds the [tokens, V] logits
(at 128k vocabulary and 8k tokens per micro-batch that is 4 GB of fp32 per rank, and the gather
that makes it). Everything else that calls the model (generation, evaluation, the RL and DPO
log-probs, a pipeline's last stage) gets the logits gathered whole, as before: the output's
hook gathers them unless both scopes below are open. The scopes: `loss_parallel_scope(model)`
around a micro-batch's forward and backward (train_step; torch's `loss_parallel` must cover
the backward too) and `sharded_logits()` around the model call of a loss written for shards.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from elastic.model.llama import Transformer
from elastic.train.mesh import WorkerMesh, layout_for


_IN_LOSS_PARALLEL = contextvars.ContextVar("elastic_in_loss_parallel", default=False)
_WANT_SHARDED = contextvars.ContextVar("elastic_want_sharded_logits", default=False)


@contextlib.contextmanager
def loss_parallel_scope(model: torch.nn.Module) -> Iterator[bool]:
    """Around one micro-batch's forward and backward: torch's `loss_parallel` when `model`'s
    logits are vocabulary-sharded (tp > 1 with parallel.loss_parallel), else nothing. Yields
    whether it is on. Harmless for plain tensors: it only changes how DTensor cross-entropy
    and log-softmax run."""
    if not getattr(model, "_elastic_loss_parallel", False):
        yield False
        return
    from torch.distributed.tensor.parallel import loss_parallel

    token = _IN_LOSS_PARALLEL.set(True)
    try:
        with loss_parallel():
            yield True
    finally:
        _IN_LOSS_PARALLEL.reset(token)


@contextlib.contextmanager
def sharded_logits() -> Iterator[None]:
    """Around the model call of a loss that takes vocabulary-sharded logits (a DTensor
    [.., V] Shard(-1)) through `F.cross_entropy`: inside `loss_parallel_scope` the output keeps
    them sharded; anywhere else (or without tp) they come out whole as before."""
    token = _WANT_SHARDED.set(True)
    try:
        yield
    finally:
        _WANT_SHARDED.reset(token)


def _gather_logits(module: torch.nn.Module, inputs, out):
    """The output's forward hook under loss parallelism: whole logits (a plain tensor, the
    all-gather ColwiseParallel(output_layouts=Replicate()) makes) unless a sharded-logits loss
    asked for the shards inside a loss-parallel scope."""
    if _IN_LOSS_PARALLEL.get() and _WANT_SHARDED.get():
        return out
    return out.full_tensor()


def _blocks(model: torch.nn.Module):
    """(key, block) of the model's layers: a ModuleList (index) or a pipeline stage's ModuleDict
    (global layer index as the key)."""
    layers = model.layers
    return list(layers.items()) if isinstance(layers, torch.nn.ModuleDict) else list(enumerate(layers))


def apply_activation_checkpointing(model: Transformer) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for key, block in _blocks(model):
        model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool = False) -> None:
    """The Megatron split of every block plus vocabulary-parallel embedding and output.

    `model` is a Transformer, or one pipeline stage of it (elastic/model/stages.py
    TransformerStage: a ModuleDict of some layers, the embedding on the first stage only, norm
    and output on the last only). A stage's residual stream leaves its last block whole (plain
    tensors cross between stages) and enters a later stage's first block as this rank's
    sequence shard; a tied last stage's own copy of the embedding is vocabulary-sharded like
    the embedding itself, so the two copies' local shards pair up rank by rank.

    `loss_parallel`: the vocabulary-split output leaves its logits sharded for a loss-parallel
    cross-entropy (module doc); `model._elastic_loss_parallel` says whether that happened (not
    for an output too narrow to split)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    tp = tp_mesh.size()
    layers = model.layers
    names = list(layers.keys()) if isinstance(layers, torch.nn.ModuleDict) else [str(i) for i in range(len(layers))]
    blocks = list(layers.values()) if isinstance(layers, torch.nn.ModuleDict) else list(layers)
    embeds = getattr(model, "tok_embeddings", None) is not None
    output = getattr(model, "output", None)
    tied_here = model.args.tie_embeddings and embeds and output is not None  # one weight on this module
    # The stream leaves the last block whole: the final norm, the jobs and the next pipeline
    # stage see plain tensors.
    leave = dict(output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True)
    # A later pipeline stage: the whole stream arrives; each rank keeps its sequence shard.
    enter = dict(input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None))
    plan = {f"layers.{names[-1]}": PrepareModuleOutput(**leave)}
    if embeds:
        # Vocabulary-sharded rows; the partial sums are reduce-scattered over the sequence.
        # The residual stream stays a DTensor (use_local_output=False): it then knows its global
        # length, so a sequence that tp does not divide (scoring passes, evaluation) shards
        # unevenly and gathers back exactly.
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
    elif len(names) == 1:  # one block enters and leaves the stage
        plan[f"layers.{names[0]}"] = PrepareModuleInputOutput(**enter, use_local_input=False, **leave)
    else:
        plan[f"layers.{names[0]}"] = PrepareModuleInput(**enter, use_local_output=False)
    split_output = output is not None and output.weight.shape[0] % tp == 0 and not tied_here
    # Logits out of the vocabulary split: gathered whole, or (loss parallelism) left as
    # vocabulary shards for `_gather_logits` to gather unless a loss-parallel loss takes them.
    sharded = loss_parallel and (split_output or tied_here)
    logits = (dict(output_layouts=Shard(-1), use_local_output=False) if sharded
              else dict(output_layouts=Replicate(), use_local_output=True))
    if split_output:
        plan["output"] = ColwiseParallel(input_layouts=Replicate(), **logits)
    parallelize_module(model, tp_mesh, plan)
    # The final norm (and an output too narrow to split, e.g. a reward model's scalar head) run
    # whole on every tp rank: their weights become Replicate DTensors on the tp axis, so every
    # parameter lives on one (dp, tp) mesh (gradient clipping takes one norm over all of them).
    if getattr(model, "norm", None) is not None:
        _replicated(model.norm, tp_mesh)
    if output is not None and not split_output and not tied_here:
        _replicated(output, tp_mesh)
    if model.args.qk_norm:
        # Qwen3's q/k norms: one [head_dim] weight shared by every head; each rank normalises its
        # own heads ([B, T, heads/tp, head_dim]: Shard(2)), and the weight's gradient is summed.
        for block in blocks:
            _replicated(block.attention.q_norm, tp_mesh, Shard(2))
            _replicated(block.attention.k_norm, tp_mesh, Shard(2))
    for block in blocks:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            # x, freqs, meta, cache (None in training): only x is a sequence-sharded activation.
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                            desired_input_layouts=(Replicate(), None, None, None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })
    if tied_here:
        # The output shares the embedding's vocabulary-sharded weight: project the gathered
        # stream onto this rank's vocabulary rows and gather the logits.
        model.tie_weights()
        parallelize_module(model, tp_mesh, {"output": _TiedColwise(**logits)})
    if sharded:
        output.register_forward_hook(_gather_logits)
    model._elastic_loss_parallel = sharded


def _replicated(module: torch.nn.Module, tp_mesh: DeviceMesh, input_layout=None) -> None:
    """`module`'s weights become Replicate DTensors on the tp axis; plain tensors in and out.

    `input_layout` says what the plain input is: whole on every rank (Replicate, the default),
    or this rank's part of it, e.g. Shard(2) for its heads. In the latter case the weight's
    gradient is a partial sum per rank, and DTensor sums it over the tp ranks."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    layout = input_layout if input_layout is not None else Replicate()

    def to_dtensor(_, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [layout], run_check=False) if isinstance(x, torch.Tensor)
                     and not isinstance(x, DTensor) else x for x in inputs)

    def to_local(_, out, mesh):
        return out.to_local() if isinstance(out, DTensor) else out

    distribute_module(module, tp_mesh, input_fn=to_dtensor, output_fn=to_local)


class _TiedColwise:
    """ColwiseParallel for an output layer whose weight is already the embedding's Shard(0)
    DTensor (tied embeddings): distribute only its input and output."""

    def __new__(cls, **logits):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel

        class Tied(ColwiseParallel):
            def _partition_linear_fn(self, name, module, device_mesh):
                pass  # the weight is the embedding's, sharded already

        return Tied(input_layouts=Replicate(), **logits)


def parallelize(model: torch.nn.Module, device: torch.device, param_dtype: torch.dtype, activation_checkpointing: str = "none",
                mesh: Optional[WorkerMesh] = None, ignored_params: Optional[set] = None,
                loss_parallel: bool = True) -> torch.nn.Module:
    """`mesh`: the worker's mesh (mesh.py); default a 1-D mesh over every rank (FSDP).
    `loss_parallel`: under tp, the LM loss takes vocabulary-sharded logits (module doc).
    `ignored_params`: parameters FSDP leaves whole on every rank (QLoRA's frozen NF4 base,
    elastic/model/quantize.py). `model` is a Transformer, or a pipeline rank's stages
    (elastic/train/pipeline.py `StageModel`: the same attribute names, a subset of the layers)."""
    if mesh is None:
        mesh = WorkerMesh.build(device.type, layout_for(dist.get_world_size()))
    layout = mesh.layout
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh.tp, loss_parallel)
    if activation_checkpointing == "full":
        apply_activation_checkpointing(model)
    fsdp_mesh = mesh.fsdp
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = [b for _, b in _blocks(model)]
    n = len(blocks)
    # One data-parallel rank holds every parameter whole: resharding after forward would only
    # free the compute-dtype copies and cast them again for backward. Keep them (one bf16 copy).
    alone = layout.dp == 1
    for i, block in enumerate(blocks):
        # The last block's parameters are needed first in backward: keep them gathered.
        fully_shard(block, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=i < n - 1 and not alone,
                    ignored_params=ignored_params)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp, ignored_params=ignored_params)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                # A plain SUM (gloo has no PREMUL_SUM; with factor 1 it is the same on NCCL).
                m.set_force_sum_reduction_for_comms(True)
    return model
