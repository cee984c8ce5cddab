"""The store builder: tokenizes and packs each shard once per run, ahead of the readers.

One builder per run, an actor created by the driver on the driver's node (it lives as long as
the run's driver; worker-group restarts and resizes do not touch it). Train workers ask it for
a shard's commit record (`meta`), which it answers from memory, from the cache in storage, or
by building the shard, and tell it where they are (`ahead`), so it keeps the next
`data.build_ahead` shards of the stream in flight and no more: tokenization runs ahead of
training by a bounded window (the first step waits for one shard, not for the epoch).

Each build is one Ray task on the cluster's CPUs (`data.tokenize_cpus` each, never the train
workers' processes) that reads, tokenizes and packs a shard and commits it to the cache
(elastic/data/store.py). Why plain tasks and not a Ray Data pipeline: a shard's output goes to
storage, not into a stream, so there is nothing for Ray Data's streaming executor to move
between stages, and exactly-once needs one scheduler that knows what is built and what is in
flight, which is this actor. Several readers asking for the same shard share one build.

Failures: a build whose worker or node dies is retried (`max_attempts`); a data error (e.g.
an unreadable file) is not, and reaches the readers as the task's error. If the actor itself
dies, Ray restarts it and it finds the finished shards in storage. It finds its data plans
there too: the driver writes them next to the cache (`save_plans`) and hands the actor their
path, not the plans. A plan is large (every file of the corpus and the tokenizer: 234 KB for
the stdlib corpus), too large for Ray to inline, and an actor restarted from constructor
arguments in the object store fails if those are lost (Ray says so on the console when such an
actor is created, ray-project/ray#53727).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple

import pyarrow.fs as pafs
import ray

from elastic.data.cursor import shard_order
from elastic.data.sources import filesystem_for
from elastic.data.store import PLANS_DIR, ShardCache, ShardMeta, shard_key, write_atomic

log = logging.getLogger(__name__)


def _build(plan, cache_root: str, index: int, attempt: int) -> ShardMeta:
    """Ray task body: read → tokenize → pack → commit the plan's shard `index`; records its
    own CPU time (process time: the tokenizer's threads included)."""
    from elastic.data.tokenize import pack_shard
    from elastic.records import append_record

    cpu0, t0 = time.process_time(), time.time()
    shard = plan.shards[index]
    packed = pack_shard(plan, shard)
    cache = ShardCache(cache_root, plan)
    build = {"tokenize_cpu_s": time.process_time() - cpu0, "documents": packed.documents}
    meta = cache.commit(shard, packed.arrays, packed.bad_rows.to_dict(), build, attempt)
    cpu_s, wall_s = time.process_time() - cpu0, time.time() - t0
    append_record(cache.builds_log, {"shard_id": shard.shard_id, "key": meta.key, "samples": meta.samples,
                                     "tokens": meta.tokens, "bytes": meta.bytes, "cpu_s": cpu_s, "wall_s": wall_s,
                                     "tokenize_cpu_s": build["tokenize_cpu_s"],
                                     "attempt": attempt, "pid": os.getpid(), "host": meta.build["host"],
                                     "time": time.time()})
    return meta


class StoreBuilder:
    """Ray actor (see the module docstring). `plans` maps a name ("train", "eval") to its
    DataPlan; every method takes that name and a shard *index* into the plan's `shards` (the
    stream's unit; `shard_id`, which names the shard in sample ids, may differ for a held-out
    plan cut from the training plan)."""

    def __init__(self, plans_path: str, cache_root: str, build_ahead: int = 2, max_attempts: int = 3,
                 task_env: Optional[Dict[str, str]] = None):
        plans = self.plans = load_plans(plans_path)
        self.plan_refs = {k: ray.put(p) for k, p in plans.items()}
        self.caches = {k: ShardCache(cache_root, p) for k, p in plans.items()}
        self.cache_root = cache_root
        self.build_ahead = build_ahead
        self.max_attempts = max_attempts
        self.task_env = dict(task_env or {})
        self.metas: Dict[Tuple[str, int], ShardMeta] = {}
        self.pending: Dict[Tuple[str, int], asyncio.Task] = {}
        self.tasks = {k: ray.remote(_build).options(**self._task_options(p)) for k, p in plans.items()}
        self.stats = {"built": 0, "reused": 0, "rebuilt": 0, "attempts": 0, "failed_attempts": 0}
        self.events: List[Dict[str, Any]] = []

    def _task_options(self, plan) -> Dict[str, Any]:
        # The tokenizer's Rust thread pool would otherwise use every core of the node, over
        # the CPUs this task reserved (and the train workers' share).
        env = {"RAYON_NUM_THREADS": str(max(1, int(plan.tokenize_cpus))), **self.task_env}
        return {"num_cpus": plan.tokenize_cpus, "max_retries": 0, "runtime_env": {"env_vars": env}}

    async def _produce(self, name: str, index: int) -> ShardMeta:
        plan, cache = self.plans[name], self.caches[name]
        shard = plan.shards[index]
        meta, why = await asyncio.to_thread(cache.load, shard)
        if meta is not None:
            self.stats["reused"] += 1
            return meta
        if why != "not built":
            self.stats["rebuilt"] += 1
            self.events.append({"event": "rebuild", "name": name, "shard_id": shard.shard_id, "reason": why,
                                "time": time.time()})
            log.warning("cache shard %d (%s) is incomplete: %s; rebuilding", shard.shard_id, shard_key(shard), why)
            await asyncio.to_thread(cache.discard, shard_key(shard))
        task = self.tasks[name]
        last: Optional[BaseException] = None
        for attempt in range(self.max_attempts):
            self.stats["attempts"] += 1
            try:
                meta = await task.remote(self.plan_refs[name], self.cache_root, index, attempt)
                self.stats["built"] += 1
                return meta
            except ray.exceptions.RayTaskError as e:  # the build itself raised (e.g. unreadable data)
                raise e.as_instanceof_cause() from None
            except ray.exceptions.RayError as e:  # its worker or node died: build it again
                self.stats["failed_attempts"] += 1
                self.events.append({"event": "build_failed", "name": name, "shard_id": shard.shard_id, "attempt": attempt,
                                    "error": type(e).__name__, "time": time.time()})
                last = e
        raise RuntimeError(f"shard {shard.shard_id}: build failed {self.max_attempts} times ({type(last).__name__})")

    def _ensure(self, name: str, index: int) -> Optional[asyncio.Task]:
        k = (name, index)
        if k in self.metas:
            return None
        t = self.pending.get(k)
        if t is None or (t.done() and (t.cancelled() or t.exception() is not None)):
            t = asyncio.get_running_loop().create_task(self._produce(name, index))
            t.add_done_callback(lambda t, k=k: self._done(k, t))
            self.pending[k] = t
        return t

    def _done(self, k: Tuple[str, int], t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is None:
            self.metas[k] = t.result()
            self.pending.pop(k, None)

    async def meta(self, name: str, index: int) -> ShardMeta:
        """The shard's commit record, once the shard is in the cache."""
        t = self._ensure(name, index)
        if t is None:
            return self.metas[(name, index)]
        return await asyncio.shield(t)

    async def ahead(self, name: str, epoch: int, shard_pos: int) -> None:
        """A reader entered stream position (epoch, shard_pos): keep that shard and the next
        `build_ahead` in flight (stream order, into the next epoch)."""
        plan = self.plans[name]
        n = plan.num_shards
        for i in range(self.build_ahead + 1):
            e, p = divmod(epoch * n + shard_pos + i, n)
            self._ensure(name, int(shard_order(n, e, plan.seed, plan.shuffle)[p]))

    async def rebuild(self, name: str, index: int, reason: str) -> ShardMeta:
        """A reader could not read the shard's file: forget its record and check the cache
        again (an incomplete file is discarded and rebuilt)."""
        self.events.append({"event": "read_failed", "name": name, "shard_id": self.plans[name].shards[index].shard_id,
                            "reason": reason, "time": time.time()})
        if (name, index) not in self.pending:
            self.metas.pop((name, index), None)
        return await self.meta(name, index)

    async def report(self) -> Dict[str, Any]:
        """Counts (built, reused, rebuilt, attempts), the cache directory and notable events."""
        return {"stats": dict(self.stats), "in_flight": sum(1 for t in self.pending.values() if not t.done()),
                "cache": {k: c.uri for k, c in self.caches.items()}, "events": list(self.events)}


def save_plans(plans: Dict[str, Any], cache_root: str) -> str:
    """Write the run's data plans to `cache_root`/PLANS_DIR (storage that every build task reaches
    already), named by their content, and return that path. Written once: a relaunch with the
    same plans finds the file."""
    data = pickle.dumps(plans)
    path = f"{cache_root.rstrip('/')}/{PLANS_DIR}/{hashlib.sha256(data).hexdigest()[:20]}.pkl"
    fs, where = filesystem_for(path)
    if fs.get_file_info(where).type == pafs.FileType.NotFound:
        fs.create_dir(os.path.dirname(where), recursive=True)
        write_atomic(fs, where, data)
    return path


def load_plans(path: str) -> Dict[str, Any]:
    """The plans `save_plans` wrote at `path`."""
    fs, where = filesystem_for(path)
    with fs.open_input_stream(where) as s:
        return pickle.loads(s.read())


def start_builder(plans: Dict[str, Any], cache_root: str, build_ahead: int, task_env: Optional[Dict[str, str]] = None):
    """Create the run's builder actor on this (the driver's) node: it must outlive worker
    groups and node losses, and dies with the driver. Its plans travel through storage
    (`save_plans`), so a restarted actor reads them again. Returns its handle."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(StoreBuilder).options(
        num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=True))
    return actor.remote(save_plans(plans, cache_root), cache_root, build_ahead, task_env=task_env)
