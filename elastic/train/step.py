"""One optimizer update over this rank's micro-batches, with a pluggable loss.

The contract every job (pretraining, SFT, GRPO, DPO) follows:

* a **loss function** `loss_fn(model, micro) -> LossOutput` returns the *sum* of its per-unit
  losses over the micro-batch (units: label tokens for language modelling, or already
  globally-weighted tokens for GRPO), plus detached statistics to sum;
* the step divides that sum by a **global normaliser**: the count of the same units over the
  whole global batch (all ranks, all micro-batches), known before the first backward;
* FSDP2's gradient divide factor is 1 (see parallelize.py): gradients are *summed* over ranks.

So the gradient equals that of one process training on the whole global batch, however the
batch is split over workers and micro-batches (tests/test_fsdp_equivalence.py).

The step also owns what must be decided consistently on every rank: the statistics are
all-reduced before the optimizer runs, and a non-finite loss or gradient norm (both global
values, hence identical on all ranks) skips the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from elastic.data.packing import IGNORE
from elastic.model.attention import build_attention_metadata, host_doc_spans
from elastic.train.comm import Comm
from elastic.train.parallelize import loss_parallel_scope, sharded_logits
from elastic.train.timing import StepTimer

Micro = Dict[str, Any]  # tensors on the device, plus "_max_seqlen" (int; see to_device)


@dataclass
class LossOutput:
    loss_sum: torch.Tensor  # scalar, differentiable: Σ of per-unit losses in this micro-batch
    stats: Dict[str, torch.Tensor] = field(default_factory=dict)  # detached sums (aggregated exactly)


LossFn = Callable[[torch.nn.Module, Micro], LossOutput]


def batch_attention(model: torch.nn.Module, mb: Micro):
    """The attention metadata of a micro-batch made by `to_device`: document spans computed on
    the host there, so building it issues no host sync on the device."""
    spans = (mb["_cu_seqlens"], mb["_max_seqlen"]) if "_cu_seqlens" in mb else None
    return build_attention_metadata(mb["doc_ids"], model.attention_backend, spans)


def causal_lm_loss(model: torch.nn.Module, mb: Micro) -> LossOutput:
    """Token cross-entropy summed over the targets packing marked (`labels` != IGNORE).

    Under tensor parallelism with parallel.loss_parallel (inside train_step's
    `loss_parallel_scope`) the logits stay vocabulary-sharded, [b, T, V/tp] per rank, and the
    cross-entropy runs on the shards (elastic/train/parallelize.py): the same sum, no rank
    holding the full-vocabulary logits."""
    meta = batch_attention(model, mb)
    with sharded_logits():
        logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], meta)
    loss = F.cross_entropy(logits.float().flatten(0, 1), mb["labels"].flatten().long(), ignore_index=IGNORE, reduction="sum")
    if isinstance(loss, DTensor):  # loss parallel: the sum is already complete on every tp rank (Replicate)
        loss = loss.to_local()
    return LossOutput(loss, {"loss_sum": loss.detach()})


def label_count(rows: Dict[str, np.ndarray]) -> int:
    """Units of `causal_lm_loss`: targets that carry loss."""
    return int((rows["labels"] != IGNORE).sum())


def to_device(rows: Dict[str, np.ndarray], device: torch.device) -> Micro:
    """Numeric columns of a micro-batch as tensors on `device` (pinned, non-blocking on CUDA),
    plus `_cu_seqlens` / `_max_seqlen`: the document spans of `doc_ids`, computed here on the
    host (for the varlen attention kernels; see `batch_attention`). `_max_seqlen` is an int."""
    pin = device.type == "cuda"
    out: Micro = {}
    for k, v in rows.items():
        if not isinstance(v, np.ndarray) or v.dtype == object:
            continue
        t = torch.from_numpy(np.ascontiguousarray(v))
        if t.dtype == torch.int32 and k in ("tokens", "positions", "doc_ids", "labels"):
            t = t.long()
        out[k] = (t.pin_memory() if pin else t).to(device, non_blocking=pin)
    doc = rows.get("doc_ids")
    if isinstance(doc, np.ndarray) and doc.ndim == 2 and doc.size:
        cu, longest = host_doc_spans(doc)
        t = torch.from_numpy(cu)
        out["_cu_seqlens"] = (t.pin_memory() if pin else t).to(device, non_blocking=pin)
        out["_max_seqlen"] = longest  # a Python int: reading it never waits for the device
    return out


def split_micro(rows: Dict[str, np.ndarray], micro_batch_size: int) -> List[Dict[str, np.ndarray]]:
    n = len(next(iter(rows.values())))
    return [{k: v[i:i + micro_batch_size] for k, v in rows.items()} for i in range(0, n, micro_batch_size)]


# Backends that compute each document apart (no [T, T] score matrix per row): a micro-batch's
# documents may be laid out in one row with its padding dropped.
PER_DOCUMENT_BACKENDS = ("sdpa_docs",)


def padding_free(mb: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A packed micro-batch ([b, T] tokens, positions, doc_ids, labels) as one row [1, N] of its
    N real tokens: padding (doc id < 0) dropped, documents renumbered so that two rows'
    documents stay apart. Under a per-document attention backend every document attends to
    itself only either way, and positions and labels travel with their tokens, so the loss and
    the gradients are those of the padded rows (to float summation order) while no compute is
    spent on padding (what TRL calls padding-free). Rows without padding, or with nothing but
    padding, are returned as they are."""
    doc = mb["doc_ids"]
    keep = doc >= 0
    if keep.all() or not keep.any():
        return mb
    row = np.broadcast_to(np.arange(doc.shape[0])[:, None], doc.shape)[keep]
    d = doc[keep]
    start = np.ones(len(d), dtype=bool)
    start[1:] = (d[1:] != d[:-1]) | (row[1:] != row[:-1])
    out = {k: v[keep][None] for k, v in mb.items() if k != "doc_ids"}
    out["doc_ids"] = (np.cumsum(start) - 1).astype(doc.dtype)[None]
    return out


@dataclass
class StepOutput:
    stats: Dict[str, float]  # summed over micro-batches and ranks
    grad_norm: float         # global (before clipping); nan/inf when the update was skipped for it
    skipped: bool            # the optimizer did not step (non-finite loss or gradient norm)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Dict[str, np.ndarray]],
               loss_fn: LossFn, normaliser: float, grad_clip: float, comm: Comm,
               timer: Optional[StepTimer] = None, poison: bool = False) -> StepOutput:
    """Forward/backward over micro-batches with gradient accumulation, then (unless the loss or
    gradient norm is non-finite) clip and step. `normaliser` is the global unit count; `comm`
    sums the statistics over ranks on the model's device (elastic/train/comm.py).
    `poison` multiplies the loss by NaN (fault injection for the stability guard's tests)."""
    device = comm.device
    timer = timer or StepTimer(device)
    n_micro = len(micro_batches)
    sums: Dict[str, torch.Tensor] = {}
    scale = 1.0 / max(normaliser, 1e-12)
    for m, rows in enumerate(micro_batches):
        mb = to_device(rows, device)
        if hasattr(model, "set_requires_gradient_sync"):
            # FSDP2: reduce-scatter gradients only after the last micro-batch.
            model.set_requires_gradient_sync(m == n_micro - 1)
        with loss_parallel_scope(model):  # tp: a loss-parallel loss's backward must run inside it too
            with timer.phase("forward"):
                out = loss_fn(model, mb)
                loss = out.loss_sum * float("nan") if poison else out.loss_sum
            with timer.phase("backward"):
                (loss * scale).backward()
        for k, v in out.stats.items():
            v = v * float("nan") if (poison and k == "loss_sum") else v
            sums[k] = sums[k] + v.detach().double() if k in sums else v.detach().double()
    with timer.phase("optimizer"):
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        # One host sync for everything the skip decision needs: summed stats and the norm.
        keys = sorted(sums)
        vec = torch.stack([sums[k] for k in keys]) if keys else torch.zeros(0, dtype=torch.float64, device=device)
        if keys:
            comm.all_reduce_(vec)
        host = torch.cat([vec, grad_norm.detach().double().reshape(1).to(vec.device)]).tolist()
        totals, gn = dict(zip(keys, host[:-1])), host[-1]
        skipped = not math.isfinite(gn) or any(not math.isfinite(v) for v in totals.values())
        if not skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return StepOutput(totals, gn, skipped)
