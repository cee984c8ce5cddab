"""The device mesh: one place turns the world size and `parallel.*` into named axes.

Axes, outermost first: `dp_replicate` (HSDP replicas: each holds a whole copy of the sharded
state, gradients all-reduced between them), `dp_shard` (FSDP2 shards). world = dp_replicate x
dp_shard. FSDP2 given a 2-D mesh is HSDP: parameters are sharded over the inner axis and
replicated over the outer one, so the all-gathers and reduce-scatters of every step stay inside
a replica (a node, on a cluster) and only one all-reduce of the gradient shards crosses it.

Elastic runs change the world size between attempts. A world that `parallel.dp_replicate` does
not divide keeps the largest replica count that divides it (gcd), and says so: the run goes on
at the new size rather than waiting for workers that may not come.

The model knows nothing of meshes; `parallelize.py` takes the mesh built here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class Layout:
    """How `world` workers split the model: dp_replicate x dp_shard = world."""

    dp_replicate: int
    dp_shard: int
    requested_replicate: int = 1

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def names(self) -> tuple[str, ...]:
        return ("dp_replicate", "dp_shard") if self.dp_replicate > 1 else ("dp_shard",)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dp_replicate, self.dp_shard) if self.dp_replicate > 1 else (self.dp_shard,)

    @property
    def reduced(self) -> bool:
        """The world did not divide by the replicas asked for: fewer replicas are used."""
        return self.dp_replicate != self.requested_replicate

    def describe(self) -> str:
        """e.g. "HSDP 2 replicas x 2 shards" or "FSDP 4 shards" (console and events)."""
        if self.dp_replicate == 1:
            s = f"FSDP {self.dp_shard} shard{'s' if self.dp_shard != 1 else ''}"
        else:
            s = f"HSDP {self.dp_replicate} replicas x {self.dp_shard} shard{'s' if self.dp_shard != 1 else ''}"
        if self.reduced:
            s += f" (parallel.dp_replicate {self.requested_replicate} does not divide {self.world} workers)"
        return s


def layout_for(world: int, dp_replicate: int = 1) -> Layout:
    """The layout of `world` workers: the most replicas, up to `dp_replicate`, that divide the
    world (gcd), each sharded over the rest.

    >>> layout_for(4, 2).shape, layout_for(3, 2).shape, layout_for(6, 4).shape
    ((2, 2), (3,), (2, 3))
    """
    if world < 1 or dp_replicate < 1:
        raise ValueError(f"world {world} and dp_replicate {dp_replicate} must be >= 1")
    r = math.gcd(world, dp_replicate)
    return Layout(r, world // r, dp_replicate)


def build_mesh(device_type: str, layout: Layout) -> DeviceMesh:
    """The collective DeviceMesh for `layout` (every rank calls this, in the same order)."""
    return init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.names)
