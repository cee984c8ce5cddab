"""The job's collectives, in one place, on one device: the device of the model's parameters.

Why one place: NCCL accepts only CUDA tensors. The first GPU run died at step 1 because the
loop handed `all_gather_into_tensor` two tensors made on the host ("No backend type associated
with device type cpu"); on the development machines, where gloo runs everything on the CPU,
the same line was right. So every collective of the per-worker loop, the jobs (LM, SFT, DPO,
GRPO), held-out evaluation and checkpoint bookkeeping goes through a `Comm`:

* numbers go in as Python values (`sum`, `max`, `gather`): the tensor is made here, on
  `comm.device`, so a caller cannot get the device wrong;
* tensors handed in (`all_reduce_`) must already be on `comm.device`, else `CommDeviceError`
  names the call before any collective starts (a clear message instead of NCCL's);
* Python objects (`all_gather_object`, `broadcast_object`) go through torch's object
  collectives, which place their byte tensors on the current CUDA device themselves.

tests/test_comm_device.py fails when code under `elastic/` calls a `torch.distributed`
collective anywhere but here, or hands this module a tensor built without a device.

Without a process group (one process, tests, tools) every call is the identity.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist


class CommDeviceError(RuntimeError):
    """A tensor reached a collective on a device other than the communication device."""


def _group_active(group: Optional[dist.ProcessGroup] = None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


class Comm:
    """Collectives of one worker, on `device` (the model parameters' device)."""

    def __init__(self, device: torch.device, group: Optional[dist.ProcessGroup] = None):
        self.device = torch.device(device)
        self.group = group

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Comm":
        """The communication device is where the model's parameters live (DTensor shards
        included): FSDP's own all-gathers and reduce-scatters run there too."""
        p = next(model.parameters())
        local = p.to_local() if hasattr(p, "to_local") else p
        return cls(local.device)

    @property
    def active(self) -> bool:
        return _group_active(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def check(self, t: torch.Tensor, what: str) -> None:
        """Raise unless `t` is on the communication device (index included on CUDA)."""
        dev = t.device
        ok = dev.type == self.device.type and (dev.index is None or self.device.index is None or dev.index == self.device.index)
        if not ok:
            raise CommDeviceError(f"{what}: tensor on {dev}, but this job's collectives run on {self.device} "
                                  "(make it with comm.tensor(...) or on the model's device)")

    def tensor(self, values: Sequence[float], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """A 1-D tensor of `values` on the communication device."""
        return torch.tensor(list(values), dtype=dtype, device=self.device)

    # -- tensors ---------------------------------------------------------------------------
    def all_reduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (`sum` | `max` | `min`) of a tensor already on the device."""
        self.check(t, f"all_reduce({op})")
        if self.active:
            dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op],
                            group=self.group)
        return t

    def all_gather_(self, t: torch.Tensor) -> torch.Tensor:
        """[world, *t.shape]: every rank's `t` (a tensor on the device)."""
        self.check(t, "all_gather")
        flat = torch.empty(self.world_size * t.numel(), dtype=t.dtype, device=t.device)
        if self.active:  # a flat output: gloo checks it as world chunks shaped like the input
            dist.all_gather_into_tensor(flat, t.contiguous().reshape(-1), group=self.group)
        else:
            flat.copy_(t.reshape(-1))
        return flat.view(self.world_size, *t.shape)

    # -- numbers (one host sync each: results come back as Python values) -------------------
    def sum(self, values: Sequence[float]) -> List[float]:
        """Element-wise sum over ranks of a few numbers."""
        return self.all_reduce_(self.tensor(values), "sum").tolist()

    def max(self, values: Sequence[float]) -> List[float]:
        return self.all_reduce_(self.tensor(values), "max").tolist()

    def min(self, values: Sequence[float]) -> List[float]:
        return self.all_reduce_(self.tensor(values), "min").tolist()

    def gather(self, values: Sequence[float]) -> np.ndarray:
        """[world, len(values)] float64: every rank's numbers, by rank."""
        return self.all_gather_(self.tensor(values)).cpu().numpy()

    # -- Python objects --------------------------------------------------------------------
    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's `obj`, by rank (pickled; for small things: verdicts, ids, keys)."""
        if not self.active:
            return [obj]
        parts: List[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj, group=self.group)
        return parts

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank; `src` is a rank of this Comm's group, like `rank`
        (a data- or tensor-parallel group's first member is 0, whatever its global rank)."""
        if not self.active:
            return obj
        box = [obj]
        if self.group is None:
            dist.broadcast_object_list(box, src=src)
        else:
            dist.broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]

    def barrier(self) -> None:
        """All ranks reach this point (a one-element all-reduce on the device, so it orders
        with the other collectives on NCCL, where `dist.barrier` guesses a device)."""
        if self.active:
            self.all_reduce_(torch.zeros(1, device=self.device), "sum")
