"""The store builder: tokenizes and packs each shard once per run, ahead of the readers, on a
Ray Data pipeline.

One builder per run, an actor created by the driver on the driver's node (it lives as long as
the run's driver; worker-group restarts and resizes do not touch it). Train workers ask it for
a shard's commit record (`meta`), which it answers from memory, from the cache in storage, or
by having the shard built, and tell it where they are (`ahead`), so the next
`data.build_ahead` shards of the stream are built and no more: tokenization runs ahead of
training by a bounded window (the first step waits for one shard, not for the epoch).

The engine is Ray Data. Per plan ("train", "eval") the builder runs one streaming Dataset:

    from_items(the plan's shards in stream order from the readers' position)
      -> map_batches(ShardPacker, ActorPoolStrategy(size=data.tokenize_actors), num_cpus=data.tokenize_cpus)
      -> iterated by the builder (each output row: a shard's commit record, or its error)

`ShardPacker` is a stateful UDF: each actor loads the plan and its tokenizer once and then
reads, tokenizes, packs and commits shard after shard into the cache (elastic/data/store.py),
on the cluster's CPUs (never the train workers' processes). The pool has a fixed size: a
packer holds its `tokenize_cpus` while its pipeline runs (also while it waits for the readers),
and an autoscaling pool would take the CPUs the train workers are about to ask for. A pipeline
ends, and gives its CPUs back, once every shard it was given is built (the stream's after
epoch 0, the held-out plan's after the first evaluation). The window is kept by a permit:
before building a shard the packer asks the builder, which answers "build" once the shard is
within `build_ahead` of the furthest reader (or a reader is waiting for it), "skip" if it is
built, in the cache already, or being built by another pipeline. A shard is therefore built
exactly once however many readers, restarts and pipelines ask for it.

Failures: a packer actor that dies mid-build (its worker or node lost) is restarted by Ray Data
and its task retried; the retry asks for a permit again and is counted as the shard's next
attempt (`max_attempts`). A data error (e.g. an unreadable file) is not retried: it reaches the
readers waiting for that shard as the exception the build raised. If the builder itself dies,
Ray restarts it and it finds the finished shards in storage. It finds its data plans there too:
the driver writes them next to the cache (`save_plans`) and hands the actor their path, not the
plans. A plan is large (every file of the corpus and the tokenizer: 234 KB for the stdlib
corpus), too large for Ray to inline, and an actor restarted from constructor arguments in the
object store fails if those are lost (ray-project/ray#53727).

A shard wanted outside a running pipeline's queue (a rebuild after a damaged cache file, a
retry after a data error, or a reader waiting while every packer waits for a later shard)
gets a one-shard pipeline of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import pyarrow.fs as pafs
import ray

from elastic.data.cursor import shard_order
from elastic.data.sources import DataError, filesystem_for
from elastic.data.store import PLANS_DIR, ShardCache, ShardMeta, shard_key, write_atomic

log = logging.getLogger(__name__)

BUILD, SKIP = "build", "skip"


class ShardPacker:
    """Ray Data `map_batches` UDF (a stateful actor): read → tokenize → pack → commit shards.

    Input rows: {"name": plan name, "index": index into plan.shards}. Output rows: the same
    plus "status" (ok | skip | error) and "payload" (the pickled ShardMeta, or the pickled
    exception). The plans and tokenizers are loaded once per actor."""

    def __init__(self, plans_path: str, cache_root: str, builder, pipeline: int):
        from elastic.data.tokenizer import from_json

        self.plans = load_plans(plans_path)
        self.cache_root = cache_root
        self.caches = {k: ShardCache(cache_root, p) for k, p in self.plans.items()}
        from elastic.data.tokenize import shard_curator

        self.toks = {k: from_json(p.tokenizer.json) for k, p in self.plans.items()}
        self.curators = {k: shard_curator(p) for k, p in self.plans.items()}  # models/word lists loaded once
        self.builder, self.pipeline = builder, pipeline

    def _build(self, name: str, index: int, attempt: int) -> ShardMeta:
        from elastic.data.tokenize import pack_shard
        from elastic.records import append_record

        plan, cache = self.plans[name], self.caches[name]
        cpu0, t0 = time.process_time(), time.time()
        shard = plan.shards[index]
        packed = pack_shard(plan, shard, self.toks[name], self.curators[name])
        build = {"tokenize_cpu_s": time.process_time() - cpu0, "documents": packed.documents}
        if packed.curated:
            build["curated"] = packed.curated
        meta = cache.commit(shard, packed.arrays, packed.bad_rows.to_dict(), build, attempt)
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - t0
        append_record(cache.builds_log, {"shard_id": shard.shard_id, "key": meta.key, "samples": meta.samples,
                                         "tokens": meta.tokens, "bytes": meta.bytes, "cpu_s": cpu_s, "wall_s": wall_s,
                                         "tokenize_cpu_s": build["tokenize_cpu_s"], "curated": packed.curated or {},
                                         "attempt": attempt, "pid": os.getpid(), "host": meta.build["host"],
                                         "time": time.time()})
        return meta

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        import numpy as np

        out: Dict[str, list] = {"name": [], "index": [], "status": [], "payload": []}
        for name, index in zip(batch["name"], batch["index"]):
            name, index = str(name), int(index)
            after = None  # a shard handed to this packer and built: delivered with the next permit call
            while True:  # the builder may hand this packer a shard a reader waits for first
                decision, got, attempt = ray.get(self.builder.permit.remote(name, index, self.pipeline, after))
                if decision != BUILD:
                    break
                gname, gidx = got
                try:
                    status, payload = "ok", pickle.dumps(self._build(gname, gidx, attempt))
                except Exception as e:  # a data error: reaches the readers of this shard, is not retried
                    try:
                        payload = pickle.dumps(e)
                    except Exception:
                        payload = pickle.dumps(DataError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                    status = "error"
                if (gname, gidx) != (name, index):
                    # Not this row's shard: hand its record over now (the row's output only
                    # leaves when the row is done, and the row may wait for the readers, who may
                    # wait for this shard).
                    after = (gname, gidx, status, payload)
                    continue
                for k, v in (("name", gname), ("index", gidx), ("status", status), ("payload", payload)):
                    out[k].append(v)
                break
        return {"name": np.array(out["name"], dtype=object), "index": np.array(out["index"], dtype=np.int64),
                "status": np.array(out["status"], dtype=object), "payload": np.array(out["payload"], dtype=object)}


@dataclass
class _Pipeline:
    """One running Dataset of the builder: which plan, the shards it was given (in order)."""

    id: int
    name: str
    indices: List[int]
    dispatched: Set[int] = field(default_factory=set)  # asked for a permit at least once
    waiting: Set[int] = field(default_factory=set)     # blocked in permit right now
    done: bool = False


class StoreBuilder:
    """Ray actor (see the module docstring). `plans` maps a name ("train", "eval") to its
    DataPlan; every method takes that name and a shard *index* into the plan's `shards` (the
    stream's unit; `shard_id`, which names the shard in sample ids, may differ for a held-out
    plan cut from the training plan)."""

    def __init__(self, plans_path: str, cache_root: str, build_ahead: int = 2, max_attempts: int = 3,
                 task_env: Optional[Dict[str, str]] = None, actors: int = 1):
        self.plans_path = plans_path
        self.actors = max(1, int(actors))
        plans = self.plans = load_plans(plans_path)
        self.caches = {k: ShardCache(cache_root, p) for k, p in plans.items()}
        self.cache_root = cache_root
        self.build_ahead = build_ahead
        self.max_attempts = max_attempts
        self.task_env = dict(task_env or {})
        self.metas: Dict[Tuple[str, int], ShardMeta] = {}
        self.futures: Dict[Tuple[str, int], asyncio.Future] = {}
        self.claims: Dict[Tuple[str, int], Tuple[int, int]] = {}  # shard -> (pipeline, the input row it serves)
        self.orphans: List[Tuple[str, int]] = []          # wanted, and no pipeline will reach them unhelped
        self.attempts: Dict[Tuple[str, int], int] = {}
        self.reach: Dict[str, int] = {}                   # furthest stream position + build_ahead
        self.window: Dict[str, Set[int]] = {}             # shard indices that may be built now
        self.demand: Dict[Tuple[str, int], int] = {}      # readers waiting in meta()
        self.pipelines: Dict[int, _Pipeline] = {}
        self._ids = itertools.count()
        self._cond: Optional[asyncio.Condition] = None
        self.closing = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.stats = {"built": 0, "reused": 0, "rebuilt": 0, "attempts": 0, "failed_attempts": 0, "pipelines": 0}
        self.events: List[Dict[str, Any]] = []

    # ------------------------------------------------------------ bookkeeping

    def _c(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond, self._loop = asyncio.Condition(), asyncio.get_running_loop()
        return self._cond

    async def _notify(self) -> None:
        c = self._c()
        async with c:
            c.notify_all()

    def _future(self, k: Tuple[str, int]) -> asyncio.Future:
        f = self.futures.get(k)
        if f is None or (f.done() and k not in self.metas):  # none yet, or a failed build: ask again
            self._c()
            f = self.futures[k] = self._loop.create_future()
        return f

    def _resolve(self, k: Tuple[str, int], meta: Optional[ShardMeta] = None, error: Optional[BaseException] = None) -> None:
        """Shard k is built (meta) or failed (error): release its claim and answer its readers."""
        self.claims.pop(k, None)
        f = self.futures.get(k)
        if f is None or f.done():
            self._c()
            f = self.futures[k] = self._loop.create_future()
        if error is not None:
            f.set_exception(error)
            f.exception()  # retrieved: a failure nobody waits for yet is not "never retrieved"
            return
        self.metas[k] = meta
        f.set_result(meta)

    def _position_index(self, name: str, pos: int) -> int:
        plan = self.plans[name]
        n = plan.num_shards
        e, p = divmod(pos, n)
        return int(shard_order(n, e, plan.seed, plan.shuffle)[p])

    def _wanted(self, k: Tuple[str, int]) -> bool:
        """A reader waits for shard k, or it lies within `build_ahead` of the furthest reader."""
        return self.demand.get(k, 0) > 0 or k[1] in self.window.get(k[0], ())

    def _set_window(self, name: str) -> None:
        """The shards at stream positions (reach - num_shards, reach]: in epoch 0 every position
        up to `build_ahead` past the furthest reader (later epochs find their shards built)."""
        n, reach = self.plans[name].num_shards, self.reach[name]
        self.window[name] = {self._position_index(name, q) for q in range(max(0, reach - n + 1), reach + 1)}

    def _covered(self, k: Tuple[str, int]) -> Optional[_Pipeline]:
        """The live pipeline that will still reach shard k without help, if any."""
        for p in self.pipelines.values():
            if p.done or p.name != k[0] or k[1] not in p.indices:
                continue
            if k[1] in p.dispatched or not (p.waiting and not any(self._wanted((p.name, i)) for i in p.waiting)):
                return p
        return None

    # ------------------------------------------------------------ pipelines

    def _start(self, name: str, indices: List[int]) -> _Pipeline:
        """Run the shards `indices` (in this order) through a new Ray Data pipeline."""
        import ray.data

        plan = self.plans[name]
        pid = next(self._ids)
        p = self.pipelines[pid] = _Pipeline(pid, name, list(indices))
        self.stats["pipelines"] += 1
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False           # the driver shows its own progress line
        ctx.print_on_execution_start = False
        ctx.execution_no_progress_timeout_s = -1   # a pipeline waits on readers as long as training takes
        env = {"RAYON_NUM_THREADS": str(max(1, int(plan.tokenize_cpus))), **self.task_env}
        me = ray.get_runtime_context().current_actor
        ds = ray.data.from_items([{"name": name, "index": int(i)} for i in indices],
                                 override_num_blocks=max(1, len(indices)))
        ds = ds.map_batches(ShardPacker, batch_size=1, batch_format="numpy",
                            fn_constructor_kwargs={"plans_path": self.plans_path, "cache_root": self.cache_root,
                                                   "builder": me, "pipeline": pid},
                            compute=ray.data.ActorPoolStrategy(size=max(1, min(len(indices), self.actors)),
                                                               max_tasks_in_flight_per_actor=1),
                            num_cpus=plan.tokenize_cpus, runtime_env={"env_vars": env})
        loop = self._loop
        threading.Thread(target=self._drain, args=(p, ds, loop), name=f"store-pipeline-{pid}", daemon=True).start()
        return p

    def _drain(self, p: _Pipeline, ds, loop: asyncio.AbstractEventLoop) -> None:
        """Iterate the pipeline's output (in a thread: Ray Data's iterator blocks)."""
        try:
            # Block by block, nothing prefetched: with prefetching, Ray Data's iterator holds a
            # finished shard back until the next one is done too, and the next one may be
            # waiting for a reader that waits for this one.
            for b in ds.iter_batches(batch_size=None, prefetch_batches=0, batch_format="numpy"):
                for j in range(len(b["index"])):
                    row = {k: b[k][j] for k in ("name", "index", "status", "payload")}
                    asyncio.run_coroutine_threadsafe(self._finished(p, row), loop).result()
        except BaseException as e:  # the pipeline itself failed (e.g. its actors cannot start)
            err = e
            asyncio.run_coroutine_threadsafe(self._pipeline_failed(p, err), loop).result()
        finally:
            asyncio.run_coroutine_threadsafe(self._pipeline_done(p), loop).result()

    async def _finished(self, p: _Pipeline, row: Dict[str, Any]) -> None:
        k = (str(row["name"]), int(row["index"]))
        status = row["status"]
        if status == "ok":
            self.stats["built"] += 1
            self._resolve(k, meta=pickle.loads(row["payload"]))
        elif status == "error":
            self._resolve(k, error=pickle.loads(row["payload"]))
        await self._notify()

    async def _pipeline_failed(self, p: _Pipeline, e: BaseException) -> None:
        log.warning("store pipeline %d (%s) failed: %s", p.id, p.name, e)
        self.events.append({"event": "pipeline_failed", "name": p.name, "error": f"{type(e).__name__}: {str(e)[:300]}",
                            "time": time.time()})
        for i in p.indices:
            k = (p.name, i)
            if k not in self.metas and self.claims.get(k, (p.id,))[0] == p.id:
                self._resolve(k, error=RuntimeError(f"shard {self.plans[p.name].shards[i].shard_id}: store pipeline failed "
                                                    f"({type(e).__name__})"))

    async def _pipeline_done(self, p: _Pipeline) -> None:
        p.done = True
        self.pipelines.pop(p.id, None)
        await self._notify()

    def _tail(self, name: str, index: int) -> List[int]:
        """Shard `index`, then every other shard of the plan nothing has built or will build, in
        epoch-0 stream order after it."""
        n = self.plans[name].num_shards
        order = [self._position_index(name, q) for q in range(n)]
        at = order.index(index)
        rest = [i for i in order[at + 1:] + order[:at]
                if (name, i) not in self.metas and (name, i) not in self.claims and self._covered((name, i)) is None]
        return [index] + rest

    def _ensure(self, name: str, index: int) -> Optional[asyncio.Future]:
        """The future of shard `index`'s commit record (None if known). If nothing running will
        build it, a waiting packer is handed it, or (no packer waits) a pipeline starts with it."""
        k = (name, index)
        if k in self.metas:
            return None
        f = self._future(k)
        if k not in self.claims and k not in self.orphans and self._covered(k) is None:
            if any(p.waiting for p in self.pipelines.values() if not p.done):
                self.orphans.append(k)
            else:
                self._start(name, self._tail(name, index))
        return f

    async def _cached(self, name: str, index: int) -> bool:
        """Whether shard `index`'s record is known, or the shard is complete in the cache already
        (then its record is taken from there): a shard found there needs no pipeline, so a run
        whose cache is complete starts none (no Ray Data actors: four processes on this machine)."""
        k = (name, index)
        if k in self.metas:
            return True
        if k in self.claims or self._covered(k) is not None:
            return False
        meta, _ = await asyncio.to_thread(self.caches[name].load, self.plans[name].shards[index])
        if meta is None:  # not built, or incomplete: a pipeline builds it (and says why, see permit)
            return False
        if k not in self.metas:  # (a pipeline may have answered meanwhile)
            self.stats["reused"] += 1
            self._resolve(k, meta=meta)
        return True

    def _take_orphan(self) -> Optional[Tuple[str, int]]:
        while self.orphans:
            k = self.orphans.pop(0)
            if k not in self.metas and k not in self.claims:
                return k
        return None

    async def permit(self, name: str, index: int, pipeline: int,
                     after: Optional[Tuple[str, int]] = None) -> Tuple[str, Tuple[str, int], int]:
        """A packer of `pipeline` is about to build shard `index` (its input row). Answers
        ("build", shard, attempt): build `shard` (the row's own once it is wanted, or a shard a
        reader waits for that nothing else will reach), or ("skip", ...) when the row's shard is
        built, in the cache, or someone else's. `after`: (name, index, status, payload) of a
        shard this packer was handed and has built, delivered here rather than in the row's
        output (which leaves only when the row is done)."""
        k = (name, index)
        if self.closing:
            return SKIP, k, 0
        p = self.pipelines.get(pipeline)
        if p is not None:
            p.dispatched.add(index)
        if after is not None:  # a shard this packer was handed, built: its record
            a, status, payload = (str(after[0]), int(after[1])), after[2], after[3]
            if status == "ok":
                self.stats["built"] += 1
                self._resolve(a, meta=pickle.loads(payload))
            else:
                self._resolve(a, error=pickle.loads(payload))
            await self._notify()
        mine = [s for s, c in self.claims.items() if c == (pipeline, index)]
        if mine:  # our own earlier attempt died with its actor: this is the retry
            got = mine[0]
            self.stats["failed_attempts"] += 1
            self.events.append({"event": "build_failed", "name": got[0], "shard_id": self.plans[got[0]].shards[got[1]].shard_id,
                                "attempt": self.attempts.get(got, 1) - 1, "error": "packer died", "time": time.time()})
            if self.attempts.get(got, 0) >= self.max_attempts:
                self._resolve(got, error=RuntimeError(f"shard {self.plans[got[0]].shards[got[1]].shard_id}: "
                                                      f"build failed {self.max_attempts} times (packer died)"))
                await self._notify()
                return SKIP, k, 0
            return self._grant(got, pipeline, index)
        if k in self.metas or k in self.claims:
            return SKIP, k, 0
        shard = self.plans[name].shards[index]
        meta, why = await asyncio.to_thread(self.caches[name].load, shard)
        if meta is not None:
            self.stats["reused"] += 1
            self._resolve(k, meta=meta)
            await self._notify()
            return SKIP, k, 0
        if why != "not built" and k not in self.claims:
            self.stats["rebuilt"] += 1
            self.events.append({"event": "rebuild", "name": name, "shard_id": shard.shard_id, "reason": why,
                                "time": time.time()})
            log.warning("cache shard %d (%s) is incomplete: %s; rebuilding", shard.shard_id, shard_key(shard), why)
            await asyncio.to_thread(self.caches[name].discard, shard_key(shard))
        c = self._c()
        if p is not None:
            p.waiting.add(index)
        try:
            async with c:
                await c.wait_for(lambda: self._wanted(k) or k in self.metas or k in self.claims or bool(self.orphans)
                                 or self.closing)
                if self.closing:
                    return SKIP, k, 0
                if not (self._wanted(k) or k in self.metas or k in self.claims):
                    orphan = self._take_orphan()
                    if orphan is not None:
                        return self._grant(orphan, pipeline, index)
                    await c.wait_for(lambda: self._wanted(k) or k in self.metas or k in self.claims or bool(self.orphans)
                                     or self.closing)
        finally:
            if p is not None:
                p.waiting.discard(index)
        if k in self.metas or k in self.claims or not self._wanted(k):
            if k in self.metas or k in self.claims:
                return SKIP, k, 0
            return await self.permit(name, index, pipeline)  # woken for an orphan someone else took
        out = self._grant(k, pipeline, index)
        await self._notify()  # other pipelines waiting on k now skip it
        return out

    def _grant(self, got: Tuple[str, int], pipeline: int, row: int) -> Tuple[str, Tuple[str, int], int]:
        self.claims[got] = (pipeline, row)
        attempt = self.attempts.get(got, 0)
        self.attempts[got] = attempt + 1
        self.stats["attempts"] += 1
        return BUILD, got, attempt

    # ------------------------------------------------------------ the readers' side

    async def meta(self, name: str, index: int) -> ShardMeta:
        """The shard's commit record, once the shard is in the cache."""
        k = (name, index)
        if k in self.metas:
            return self.metas[k]
        self.demand[k] = self.demand.get(k, 0) + 1
        try:
            if await self._cached(name, index):
                return self.metas[k]
            f = self._ensure(name, index)
            await self._notify()
            if f is None:
                return self.metas[k]
            return await asyncio.shield(f)
        finally:
            self.demand[k] -= 1
            if not self.demand[k]:
                self.demand.pop(k)

    async def ahead(self, name: str, epoch: int, shard_pos: int) -> None:
        """A reader entered stream position (epoch, shard_pos): that shard and the next
        `build_ahead` may be built. The first call per plan starts its stream pipeline, unless
        those shards are all in the cache already."""
        plan = self.plans[name]
        n = plan.num_shards
        pos = epoch * n + shard_pos
        self._c()
        reach = max(self.reach.get(name, -1), pos + self.build_ahead)
        if reach != self.reach.get(name):
            self.reach[name] = reach
            self._set_window(name)
        todo = [self._position_index(name, pos + i) for i in range(min(n, self.build_ahead + 1))]
        for i in todo:
            if not await self._cached(name, i):
                self._ensure(name, i)
        await self._notify()

    async def rebuild(self, name: str, index: int, reason: str) -> ShardMeta:
        """A reader could not read the shard's file: forget its record and check the cache
        again (an incomplete file is discarded and rebuilt)."""
        self.events.append({"event": "read_failed", "name": name, "shard_id": self.plans[name].shards[index].shard_id,
                            "reason": reason, "time": time.time()})
        k = (name, index)
        if k not in self.claims:
            self.metas.pop(k, None)
            f = self.futures.get(k)
            if f is not None and f.done():
                self.futures.pop(k)
        return await self.meta(name, index)

    async def close(self, timeout_s: float = 10.0) -> int:
        """The run is over: every waiting packer skips the rest of its pipeline, so the
        pipelines end and give their CPUs back before the driver goes (a packer killed in the
        middle of a call to this actor makes Ray print a notice on the console). Returns how many
        pipelines were still running after `timeout_s`."""
        self.closing = True
        await self._notify()
        deadline = time.time() + timeout_s
        while any(not p.done for p in self.pipelines.values()) and time.time() < deadline:
            await asyncio.sleep(0.1)
        return sum(1 for p in self.pipelines.values() if not p.done)

    async def report(self) -> Dict[str, Any]:
        """Counts (built, reused, rebuilt, attempts, pipelines), the cache directory and notable events."""
        return {"stats": dict(self.stats), "in_flight": len(self.claims),
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


def start_builder(plans: Dict[str, Any], cache_root: str, build_ahead: int, task_env: Optional[Dict[str, str]] = None,
                  actors: int = 1):
    """Create the run's builder actor on this (the driver's) node: it must outlive worker
    groups and node losses, and dies with the driver. Its plans travel through storage
    (`save_plans`), so a restarted actor reads them again. Returns its handle."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(StoreBuilder).options(
        num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=True))
    return actor.remote(save_plans(plans, cache_root), cache_root, build_ahead, task_env=task_env, actors=actors)
