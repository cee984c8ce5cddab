"""The trainers' side of a disaggregated run: publish the weights, take a step's completions.

Every rank calls `publish` on sync steps (it gathers the FSDP shards, a collective) and `take`
each step; only rank 0 talks to the coordinator when publishing. `reset` at every (re)start of the
worker group, `buffer` when a checkpoint is written (elastic/rl/rollout/coordinator.py).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import ray

from elastic.rl.rollout.plan import sync_due

CALL_TIMEOUT_S = 3600.0  # a step's completions may take long on a small fleet; a dead coordinator raises at once


# The coordinator lives in a fixed Ray namespace, so a command from another driver (resizing the
# fleet: scripts/scale_rollouts.sh) finds it by the run's name.
NAMESPACE = "elastic-rollouts"


def coordinator_name(run_name: str) -> str:
    return f"elastic-rollouts-{run_name}"


class FleetClient:
    def __init__(self, name: str, rank: int, world: int, sync_every: int, bucket_mb: int) -> None:
        self.actor = ray.get_actor(name, namespace=NAMESPACE)
        self.rank, self.world = rank, world
        self.sync_every = sync_every
        self.bucket_bytes = bucket_mb << 20
        self.start_step = 0

    def reset(self, step: int, buffer: Optional[Dict[str, List[Dict[str, Any]]]], comm) -> None:
        """Rank 0 tells the coordinator where the group starts; every rank waits for it."""
        self.start_step = step
        if self.rank == 0:
            ray.get(self.actor.reset.remote(step, self.world, buffer or {}))
        comm.broadcast_object(None, src=0)  # a barrier: nobody asks for rows before the reset

    def publish(self, model: Any, step: int) -> Dict[str, float]:
        """On sync steps: version `step` to the coordinator. Returns {sync_s, sync_bytes} (rank 0)."""
        from elastic.rl.rollout.weights import pack, trainable_tensors
        from elastic.train.fsdp_generate import gathered_parameters

        if not sync_due(step, self.sync_every) and step != self.start_step:  # (a restart always publishes)
            return {}
        t0 = time.perf_counter()
        with gathered_parameters(model):
            if self.rank != 0:
                return {}
            entries, buckets = pack(trainable_tensors(model), self.bucket_bytes)
        refs = [ray.put(b) for b in buckets]  # owned by this rank: they go with it, and a restart republishes
        ray.get(self.actor.publish.remote(step, (entries, refs)))
        return {"sync_s": time.perf_counter() - t0, "sync_bytes": float(sum(b.nbytes for b in buckets))}

    def take(self, step: int) -> List[Dict[str, Any]]:
        """This rank's rows of `step`: {k, tokens, logprobs, truncated, version}."""
        return ray.get(self.actor.get.remote(step, self.rank), timeout=CALL_TIMEOUT_S)["rows"]

    def buffer(self, from_step: int) -> Dict[str, List[Dict[str, Any]]]:
        return ray.get(self.actor.buffer.remote(from_step), timeout=CALL_TIMEOUT_S)

    def stats(self) -> Dict[str, Any]:
        return ray.get(self.actor.stats.remote(), timeout=60.0)
