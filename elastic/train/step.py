"""One optimizer step over this rank's slice of a global batch.

The loss is the sum of token losses divided by the label tokens of the *whole global batch*
(which every rank knows, since every rank sees the global batch), times the world size to
undo FSDP's gradient averaging. So the gradient equals that of a single process training on
the whole global batch, however the batch is split over workers and micro-batches.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch
import torch.nn.functional as F

from elastic.data.packing import labels_for
from elastic.model.attention import build_attention_metadata

IGNORE = -100


def to_tensors(rows: Dict[str, np.ndarray], device: torch.device) -> Dict[str, torch.Tensor]:
    labels = labels_for(rows["tokens"], rows["doc_ids"], IGNORE)
    out = {
        "tokens": torch.from_numpy(np.ascontiguousarray(rows["tokens"], dtype=np.int64)),
        "positions": torch.from_numpy(np.ascontiguousarray(rows["positions"], dtype=np.int64)),
        "doc_ids": torch.from_numpy(np.ascontiguousarray(rows["doc_ids"], dtype=np.int64)),
        "labels": torch.from_numpy(labels),
    }
    pin = device.type == "cuda"
    return {k: (v.pin_memory() if pin else v).to(device, non_blocking=pin) for k, v in out.items()}


def label_tokens(global_batch: Dict[str, np.ndarray]) -> int:
    return int((labels_for(global_batch["tokens"], global_batch["doc_ids"], IGNORE) != IGNORE).sum())


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, local_rows: Dict[str, np.ndarray],
               global_label_tokens: int, micro_batch_size: int, world_size: int, grad_clip: float,
               device: torch.device, attention_backend: str) -> Dict[str, float]:
    """Forward/backward over micro-batches with gradient accumulation, clip, optimizer step.
    Returns this rank's summed token loss and the (global) gradient norm."""
    n = len(local_rows["tokens"])
    n_micro = n // micro_batch_size
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    scale = world_size / max(1, global_label_tokens)
    for m in range(n_micro):
        sl = slice(m * micro_batch_size, (m + 1) * micro_batch_size)
        t = to_tensors({k: local_rows[k][sl] for k in ("tokens", "positions", "doc_ids")}, device)
        if hasattr(model, "set_requires_gradient_sync"):
            # FSDP2: reduce-scatter gradients only after the last micro-batch.
            model.set_requires_gradient_sync(m == n_micro - 1)
        meta = build_attention_metadata(t["doc_ids"], attention_backend)
        logits = model(t["tokens"], t["positions"], t["doc_ids"], meta)
        tok_loss = F.cross_entropy(logits.float().flatten(0, 1), t["labels"].flatten(), ignore_index=IGNORE, reduction="sum")
        (tok_loss * scale).backward()
        loss_sum += tok_loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss_sum": loss_sum, "grad_norm": float(grad_norm)}
