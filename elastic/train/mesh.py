"""The device mesh: one place turns the world size and `parallel.*` into named axes.

Axes, outermost first: `dp_replicate` (HSDP replicas: each holds a whole copy of the sharded
state, gradients all-reduced between them), `dp_shard` (FSDP2 shards), `tp` (tensor + sequence
parallelism: each block's matmuls split over `tp` consecutive ranks, which on a GPU cluster sit
on one node). world = dp_replicate x dp_shard x tp. FSDP2 given the 2-D (dp_replicate,
dp_shard) mesh is HSDP: parameters are sharded over the inner axis and replicated over the
outer one, so every step's all-gathers and reduce-scatters stay inside a replica and only one
all-reduce of the gradient shards crosses it.

The data-parallel world is dp_replicate x dp_shard: the `tp` ranks of one data-parallel rank
read the same batch (jobs see the data-parallel rank and world, elastic/train/job.py).

Elastic runs change the world size between attempts, in units of `tp` workers. A data-parallel
world that `parallel.dp_replicate` does not divide keeps the largest replica count that divides
it (gcd), and says so: the run goes on at the new size rather than waiting for workers that may
not come.

The model knows nothing of meshes; `parallelize.py` takes the mesh built here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


class LayoutError(ValueError):
    """A world size the layout cannot use (not a multiple of tp)."""


@dataclass(frozen=True)
class Layout:
    """How `world` workers split the model: dp_replicate x dp_shard x tp = world."""

    dp_replicate: int
    dp_shard: int
    tp: int = 1
    requested_replicate: int = 1

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """The data-parallel world: how many different batches a step reads."""
        return self.dp_replicate * self.dp_shard

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, size in self._dims() if n == "dp_shard" or size > 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for n, size in self._dims() if n == "dp_shard" or size > 1)

    @property
    def dp_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n != "tp")

    def _dims(self):
        return (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("tp", self.tp))

    @property
    def reduced(self) -> bool:
        """The world did not divide by the replicas asked for: fewer replicas are used."""
        return self.dp_replicate != self.requested_replicate

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global `rank` (tp peers are consecutive ranks)."""
        return rank // self.tp

    def describe(self) -> str:
        """e.g. "HSDP 2 replicas x 2 shards", "FSDP 2 shards x TP 2" (console and events)."""
        plural = "s" if self.dp_shard != 1 else ""
        if self.dp_replicate == 1:
            s = f"FSDP {self.dp_shard} shard{plural}"
        else:
            s = f"HSDP {self.dp_replicate} replicas x {self.dp_shard} shard{plural}"
        if self.tp > 1:
            s += f" x TP {self.tp}"
        if self.reduced:
            s += f" (parallel.dp_replicate {self.requested_replicate} does not divide {self.dp} data-parallel ranks)"
        return s


def layout_for(world: int, dp_replicate: int = 1, tp: int = 1) -> Layout:
    """The layout of `world` workers: tp-wide groups; over the data-parallel ranks, the most
    replicas, up to `dp_replicate`, that divide them (gcd), each sharded over the rest.

    >>> layout_for(4, 2).shape, layout_for(3, 2).shape, layout_for(6, 4).shape, layout_for(8, 2, 2).shape
    ((2, 2), (3,), (2, 3), (2, 2, 2))
    """
    if world < 1 or dp_replicate < 1 or tp < 1:
        raise ValueError(f"world {world}, dp_replicate {dp_replicate} and tp {tp} must be >= 1")
    if world % tp:
        raise LayoutError(f"{world} workers cannot form groups of parallel.tp {tp}")
    dp = world // tp
    r = math.gcd(dp, dp_replicate)
    return Layout(r, dp // r, tp, dp_replicate)


def build_mesh(device_type: str, layout: Layout) -> DeviceMesh:
    """The collective DeviceMesh for `layout` (every rank calls this, in the same order)."""
    return init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.names)


def dp_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """The data-parallel sub-mesh FSDP shards over (2-D for HSDP)."""
    return mesh[layout.dp_names] if len(layout.dp_names) > 1 else mesh[layout.dp_names[0]]


def dp_group(layout: Layout) -> Optional[dist.ProcessGroup]:
    """The process group of this rank's data-parallel peers (same tp index), for the sums of
    loss units and tokens; None (the default group) without tensor parallelism. Every rank
    creates every group, in the same order (group creation is collective)."""
    if layout.tp == 1 or not dist.is_initialized():
        return None
    groups = [[d * layout.tp + t for d in range(layout.dp)] for t in range(layout.tp)]
    mine, _ = dist.new_subgroups_by_enumeration(groups)
    return mine


def tp_group(layout: Layout) -> Optional[dist.ProcessGroup]:
    """The process group of this rank's tensor-parallel peers (consecutive ranks); None without
    tensor parallelism. Collective to create, like `dp_group`."""
    if layout.tp == 1 or not dist.is_initialized():
        return None
    groups = [[d * layout.tp + t for t in range(layout.tp)] for d in range(layout.dp)]
    mine, _ = dist.new_subgroups_by_enumeration(groups)
    return mine
