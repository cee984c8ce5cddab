"""The device mesh: one place turns the world size and `parallel.*` into named axes, built once
per worker-group attempt; every group a worker uses comes from it.

Axes, outermost first: `pp` (pipeline stages: each pp rank holds a contiguous run of layers,
elastic/train/pipeline.py), `dp_replicate` (HSDP replicas: each holds a whole copy of the sharded
state, gradients all-reduced between them), `dp_shard` (FSDP2 shards), `tp` (tensor + sequence
parallelism: each block's matmuls split over `tp` consecutive ranks, which on a GPU cluster sit
on one node). world = pp x dp_replicate x dp_shard x tp (torchtitan's order). FSDP2 given the 2-D
(dp_replicate, dp_shard) mesh is HSDP: parameters are sharded over the inner axis and replicated
over the outer one, so every step's all-gathers and reduce-scatters stay inside a replica and
only one all-reduce of the gradient shards crosses it.

The data-parallel world is dp_replicate x dp_shard: the `tp` ranks of one data-parallel rank
read the same batch, and so do the `pp` stages of one pipeline (jobs see the data-parallel rank
and world, elastic/train/job.py).

Elastic runs change the world size between attempts, in units of pp x tp workers (one whole
pipeline of tensor-parallel groups: the data-parallel axis is the elastic one). A data-parallel
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
    """A world size the layout cannot use (not a multiple of pp x tp)."""


@dataclass(frozen=True)
class Layout:
    """How `world` workers split the model: pp x dp_replicate x dp_shard x tp = world."""

    dp_replicate: int
    dp_shard: int
    tp: int = 1
    requested_replicate: int = 1
    pp: int = 1

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """The data-parallel world: how many different batches a step reads."""
        return self.dp_replicate * self.dp_shard

    @property
    def unit(self) -> int:
        """Workers per data-parallel rank (one pipeline of tp groups): elastic sizes are multiples."""
        return self.pp * self.tp

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, size in self._dims() if n == "dp_shard" or size > 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for n, size in self._dims() if n == "dp_shard" or size > 1)

    @property
    def dp_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in ("tp", "pp"))

    def _dims(self):
        return (("pp", self.pp), ("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("tp", self.tp))

    @property
    def reduced(self) -> bool:
        """The world did not divide by the replicas asked for: fewer replicas are used."""
        return self.dp_replicate != self.requested_replicate

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global `rank` (tp peers are consecutive ranks, pp outermost)."""
        return (rank // self.tp) % self.dp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank(self, rank: int) -> int:
        return rank // (self.dp * self.tp)

    def describe(self) -> str:
        """e.g. "HSDP 2 replicas x 2 shards", "FSDP 2 shards x TP 2", "PP 2 x FSDP 2 shards"."""
        plural = "s" if self.dp_shard != 1 else ""
        if self.dp_replicate == 1:
            s = f"FSDP {self.dp_shard} shard{plural}"
        else:
            s = f"HSDP {self.dp_replicate} replicas x {self.dp_shard} shard{plural}"
        if self.pp > 1:
            s = f"PP {self.pp} x {s}"
        if self.tp > 1:
            s += f" x TP {self.tp}"
        if self.reduced:
            s += f" (parallel.dp_replicate {self.requested_replicate} does not divide {self.dp} data-parallel ranks)"
        return s


def layout_for(world: int, dp_replicate: int = 1, tp: int = 1, pp: int = 1) -> Layout:
    """The layout of `world` workers: pp stages of tp-wide groups; over the data-parallel ranks,
    the most replicas, up to `dp_replicate`, that divide them (gcd), each sharded over the rest.

    >>> layout_for(4, 2).shape, layout_for(3, 2).shape, layout_for(6, 4).shape, layout_for(8, 2, 2).shape
    ((2, 2), (3,), (2, 3), (2, 2, 2))
    >>> layout_for(8, 1, 2, 2).shape, layout_for(8, 1, 2, 2).names
    ((2, 2, 2), ('pp', 'dp_shard', 'tp'))
    """
    if world < 1 or dp_replicate < 1 or tp < 1 or pp < 1:
        raise ValueError(f"world {world}, dp_replicate {dp_replicate}, tp {tp} and pp {pp} must be >= 1")
    if world % (tp * pp):
        what = f"parallel.pp {pp} x parallel.tp {tp}" if pp > 1 else f"parallel.tp {tp}"
        raise LayoutError(f"{world} workers cannot form groups of {what}")
    dp = world // (tp * pp)
    r = math.gcd(dp, dp_replicate)
    return Layout(r, dp // r, tp, dp_replicate, pp)


class WorkerMesh:
    """The worker's one DeviceMesh over `layout` and the groups of its axes.

    Built once per worker-group attempt (every rank, in the same order: creating a mesh's groups
    is collective) and handed to the model builder, the optimizer's clipping, the checkpointer,
    the loss and the metrics. `mesh` is None in a single process (no torch.distributed)."""

    def __init__(self, layout: Layout, mesh: Optional[DeviceMesh]):
        self.layout, self.mesh = layout, mesh
        self._dp: Optional[DeviceMesh] = None
        self._tied: Optional[dist.ProcessGroup] = None

    @classmethod
    def build(cls, device_type: str, layout: Layout) -> "WorkerMesh":
        if not dist.is_initialized():
            return cls(layout, None)
        mesh = init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.names)
        wm = cls(layout, mesh)
        if len(layout.dp_names) > 1 and (layout.tp > 1 or layout.pp > 1):
            # The flattened data-parallel axis (torchtitan's "dp"): created now, with the mesh,
            # so that every rank creates the same groups in the same order.
            wm._dp = mesh[layout.dp_names]._flatten("dp")
        if layout.pp > 2:
            # A tied embedding lives on the first and the last stage of each pipeline: the pairs
            # (pp rank 0, pp rank pp - 1) of every (dp, tp) coordinate, created by every rank.
            ranks = mesh.mesh.reshape(layout.pp, -1)
            pairs = [[int(ranks[0, i]), int(ranks[-1, i])] for i in range(ranks.shape[1])]
            wm._tied, _ = dist.new_subgroups_by_enumeration(pairs)
        return wm

    def _axis(self, name: str) -> Optional[DeviceMesh]:
        return self.mesh[name] if self.mesh is not None and name in self.layout.names else None

    @property
    def fsdp(self) -> DeviceMesh:
        """The data-parallel sub-mesh FSDP shards over (2-D for HSDP)."""
        names = self.layout.dp_names
        return self.mesh[names] if len(names) > 1 else self.mesh[names[0]]

    @property
    def tp(self) -> Optional[DeviceMesh]:
        return self._axis("tp")

    @property
    def pp(self) -> Optional[DeviceMesh]:
        return self._axis("pp")

    def dp_group(self) -> Optional[dist.ProcessGroup]:
        """This rank's data-parallel peers (same pp stage, same tp index), for the sums of loss
        units and tokens; None (the default group: every rank) without tp or pp."""
        if self.mesh is None or (self.layout.tp == 1 and self.layout.pp == 1):
            return None
        if self._dp is not None:
            return self._dp.get_group()
        return self.mesh[self.layout.dp_names[0]].get_group()

    def tp_group(self) -> Optional[dist.ProcessGroup]:
        """This rank's tensor-parallel peers (consecutive ranks); None without tp."""
        m = self.tp
        return m.get_group() if m is not None else None

    def pp_group(self) -> Optional[dist.ProcessGroup]:
        """This rank's pipeline peers, in stage order; None without pp."""
        m = self.pp
        return m.get_group() if m is not None else None

    def tied_group(self) -> Optional[dist.ProcessGroup]:
        """The first and the last stage of this rank's pipeline (a tied embedding's two copies);
        the pp group itself at pp 2, None on a middle stage or without pp."""
        if self.layout.pp == 2:
            return self.pp_group()
        return self._tied
