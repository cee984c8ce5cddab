"""Sharded, reshardable checkpoints with torch.distributed.checkpoint (DCP), registered with Ray
Train, written off the training step's critical path.

Where the files go. Every rank writes its shards straight into the run directory (Ray Train's
experiment directory), under `step_NNNNNNNN.partial/`; rank 0 adds `train_state.json` (step, LR
scheduler, data cursor, counters) and DCP's `.metadata`, and renames the directory to
`step_NNNNNNNN/` once every rank's write is complete. On remote storage (a pyarrow URI such as
s3://), DCP writes into a local stage directory and each rank uploads its own files into
`step_NNNNNNNN/` (shards, then `.metadata`, `train_state.json` last), then deletes the stage.
Every rank then reports the directory with `ray.train.report(..., checkpoint_upload_mode=
NO_UPLOAD)`: Ray copies nothing (no second full copy of the files) and registers the checkpoint
once every rank has reported, so `ray.train.get_checkpoint()` only ever hands out a complete
checkpoint: a crash at any moment before leaves the previous one registered.

Asynchronous saves (`checkpoint.async_save`, the default). At a save the training thread
  1. waits for the previous save if it is still writing, and registers it;
  2. copies model and optimizer state to host memory (DCP's DefaultStager: pinned buffers on
     CUDA, allocated once and reused), so the next optimizer step cannot change what is written;
  3. hands the write to a background thread. DCP's own collectives (plans, write results) run
     there, on a gloo process group of their own: never beside the training collectives on the
     default (NCCL) group.
At every later step boundary while a save is in flight, the ranks agree with one tiny collective
(on the training device, through elastic/train/comm.py) whether every rank's write is complete;
at the first step where it is, every rank reports it. `ray.train.report` is a barrier that must
interleave with the training collectives in the same order on every rank, so this point is
decided collectively, never by a rank's own clock. The last save of an invocation (train.steps,
train.until_step) is waited for and registered before its step ends.

What a step records: `checkpoint_s`, the seconds the step was blocked by checkpointing (all of
it: the save's stall, the agreement and the registration, the final save's write);
`checkpoint_stall_s` on the saving step: waiting for the previous save plus the copy to host
(the whole write when saves are synchronous); `checkpoint_wait_s`: the waiting part. The
background write's seconds are in the `checkpoint_done` event (rank 0, events.jsonl), written
when the checkpoint is registered.

DCP stores logical (unsharded) tensor layouts, so a checkpoint written at world size W loads at
any W'. The optimizer state is stored flattened by parameter name (`optim.state.<name>.exp_avg`,
`optim.param_groups.<name>.lr`: torchtitan's choice), so it also loads at another pipeline
layout, where each rank holds other parameters (a nested state dict keeps one rank's list of
parameter names). Checkpoints of the nested form (before issue 59) still load. A pipeline
stage's copy of a tied weight (elastic/model/stages.py `StageModel.checkpoint_aliases`) reads
the optimizer state of the weight it copies where a checkpoint has none of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

# Names and readers of the files on storage live in a torch-free module (the driver reads them):
from elastic.train.checkpoint_files import (DIR_RE, STATE_FILE, TABLE_KEY, TableState, checkpoint_dir_name,  # noqa: F401
                                            latest_complete, read_train_state, resolve_tables)

PARTIAL = ".partial"  # `step_NNNNNNNN.partial`: a local checkpoint still being written
STAGE_PREFIX = "elastic-ckpt-"  # local stage dirs: elastic-ckpt-<pid>-XXXX in the temp dir
STAGE_RE = re.compile(rf"^{STAGE_PREFIX}(\d+)-")


def is_remote(path: str) -> bool:
    """A pyarrow URI other than file:// (object stores: DCP cannot write there directly)."""
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _stage_dir() -> str:
    """A fresh local directory named after this process, so a later process can tell that its
    owner is gone (`sweep_stale_stages`)."""
    return tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_stages(base: Optional[str] = None) -> List[str]:
    """Delete local stage directories whose process is gone (a killed worker cannot clean up
    after itself); returns what was deleted. Run by every worker at start, on its own node."""
    base = base or tempfile.gettempdir()
    gone = []
    try:
        names = os.listdir(base)
    except OSError:
        return gone
    for name in names:
        m = STAGE_RE.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            gone.append(name)
    return gone


def _write_state_file(d: str, train_state: Dict[str, Any]) -> None:
    tmp = os.path.join(d, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(train_state, f)
    os.replace(tmp, os.path.join(d, STATE_FILE))


def split_tables(train_state: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, TableState]]:
    """(the JSON state, with each TableState replaced by its file's reference; the tables)."""
    tables = {k: v for k, v in train_state.items() if isinstance(v, TableState)}
    js = {k: ({TABLE_KEY: f"{k}.parquet", "rows": v.rows} if k in tables else v) for k, v in train_state.items()}
    return js, tables


def write_tables(d: str, tables: Dict[str, TableState]) -> None:
    """Each table as `<key>.parquet` in `d` (via a temporary name: never half a file)."""
    import pyarrow.parquet as pq

    for k, t in tables.items():
        tmp = os.path.join(d, f"{k}.parquet.tmp")
        pq.write_table(t.to_table(t.payload), tmp)
        os.replace(tmp, os.path.join(d, f"{k}.parquet"))


def fault_delay_s(step: int, rank: int) -> float:
    """Fault injection for drills and tests: ELASTIC_FAULT_CKPT_DELAY="rank=R,step=S,seconds=X"
    makes rank R stall X seconds inside its write of checkpoint S, before any of its data is
    written (slow storage; in the background thread when saves are asynchronous), so a crash can
    be placed inside a checkpoint write. With `once=PATH` only the first process to get there
    stalls (it creates PATH), so a restarted worker group writes normally. Unset in normal runs."""
    spec = os.environ.get("ELASTIC_FAULT_CKPT_DELAY")
    if not spec:
        return 0.0
    kv = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    if int(kv.get("rank", 0)) != rank or int(kv.get("step", -1)) != step:
        return 0.0
    if kv.get("once"):
        try:
            os.close(os.open(kv["once"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return 0.0
    return float(kv.get("seconds", 30))


class _Writer(FileSystemWriter):
    """DCP's file writer (one file per rank, fsynced) with the fault-injection stall in front
    of this rank's data."""

    def __init__(self, path: str, delay_s: float = 0.0):
        super().__init__(path)
        self.delay_s = delay_s

    def write_data(self, plan, planner):
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return super().write_data(plan, planner)


def save_local(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_state: Dict[str, Any],
               trainable_only: bool = False) -> str:
    """Write this rank's part of the checkpoint into a fresh local temp dir, synchronously;
    return it (the caller deletes it with `cleanup_local`; on failure it is deleted here).
    `trainable_only` (LoRA): the frozen base is left out, only adapters and their optimizer
    state are written (the base is referenced in train_state.json by path and hash)."""
    out = _stage_dir()
    try:
        msd, osd = get_state_dict(model, optimizer, options=_options(trainable_only))
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=out)
        if dist.get_rank() == 0:
            js, tables = split_tables(train_state)
            write_tables(out, tables)
            _write_state_file(out, js)
    except BaseException:
        cleanup_local(out)
        raise
    return out


def _aux_state(aux: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """DCP entries of a job's own modules (PPO's critic): `<name>` and `<name>_optim`."""
    out: Dict[str, Any] = {}
    for name, (m, o) in (aux or {}).items():
        msd, osd = get_state_dict(m, o)
        out[name], out[f"{name}_optim"] = msd, osd
    return out


def load(path: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
         trainable_only: bool = False, skip: tuple = (), aux: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Load model (+ optimizer) state from a checkpoint directory at any world size.

    `trainable_only` (resuming a LoRA run): only the adapters and the optimizer are read; the
    frozen base was loaded from its own source. Without an optimizer (`model.init_from`), the
    model's adapter tensors, if any, are not read: a new run's adapters start fresh. `skip`:
    model tensors not read (a scalar head on a causal LM's backbone keeps its own init).
    `aux`: a job's own (module, optimizer) pairs by name (PPO's critic), read with the model."""
    from elastic.model.lora import is_adapter_key

    stored = set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    # Optimizer state by parameter name (module docstring), or the nested form of older checkpoints.
    flat = "optim.param_groups.0.params" not in stored
    opts = _options(trainable_only, strict=not trainable_only, flat=flat)
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
    else:
        msd = get_state_dict(model, [])[0]
        adapters = any(is_adapter_key(k) for k in msd)
        state = {"model": {k: v for k, v in msd.items() if not is_adapter_key(k) and k not in skip}}
        opts = StateDictOptions(strict=not adapters and not skip)
    if optimizer is not None:
        state.update(_aux_state(aux))
    renamed = _read_aliases(state, stored, getattr(model, "checkpoint_aliases", dict)()) if flat else {}
    dcp.load(state, checkpoint_id=path)
    for (sec, own), alias in renamed.items():
        state[sec][own] = state[sec].pop(alias)
    for name, (m, o) in (aux or {}).items():
        if optimizer is not None:
            set_state_dict(m, o, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])
    if optimizer is None:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={}, options=opts)
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=opts)
    return read_train_state(path)


def _options(trainable_only: bool = False, strict: bool = True, flat: bool = True) -> StateDictOptions:
    """How model and optimizer state go to and from DCP: the optimizer's flattened by parameter
    name (module docstring); LoRA runs leave the frozen base out."""
    # LoRA runs keep the nested form: torch 2.13's flattening fails on the frozen base's empty
    # parameter group (IndexError in _unflatten_optim_state_dict); LoRA does not pipeline.
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=strict,
                            flatten_optimizer_state_dict=flat and not trainable_only)


def _read_aliases(state: Dict[str, Any], stored: set, aliases: Dict[str, str]) -> Dict[Tuple[str, str], str]:
    """Entries of `state` ("model"/"optim" sections, flattened names) for a parameter the
    checkpoint does not hold under its own name but under its alias's (`aliases`: name ->
    stored name, e.g. a tied copy's `output.weight` -> `tok_embeddings.weight`): renamed in place
    so that DCP reads the alias; returns {(section, own key): alias key} to rename them back."""
    out: Dict[Tuple[str, str], str] = {}
    for own, src in aliases.items():
        for sec in ("model", "optim"):
            for key in [k for k in state.get(sec, {}) if f".{own}." in f".{k}."]:
                if f"{sec}.{key}" in stored:
                    continue
                alias = f".{key}.".replace(f".{own}.", f".{src}.", 1)[1:-1]
                if f"{sec}.{alias}" in stored:
                    state[sec][alias] = state[sec].pop(key)
                    out[(sec, key)] = alias
    return out


def cleanup_local(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class TrainState:
    """Everything besides model and optimizer tensors that a resumed run needs, as it is
    written to `train_state.json`. `job` holds the job's own position (e.g. the data cursor,
    the prompt cursor) and is stored at the top level of the JSON, so driver-side readers
    (e.g. the data factory's seek) find `cursor` where they always did."""

    step: int = 0
    scheduler: Dict[str, Any] = field(default_factory=dict)
    counters: Dict[str, Any] = field(default_factory=dict)  # tokens, bad_rows, useful_s, run_start, ...
    job: Dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    time: float = 0.0
    info: Dict[str, Any] = field(default_factory=dict)  # formula inputs (flops_per_token, peak_flops, ...)

    _FIXED = ("step", "scheduler", "counters", "world_size", "time")

    def to_json(self) -> Dict[str, Any]:
        return {**self.info, **self.job, **{k: getattr(self, k) for k in self._FIXED}}

    @classmethod
    def from_json(cls, d: Dict[str, Any], job_keys: Tuple[str, ...]) -> "TrainState":
        st = cls(**{k: d[k] for k in cls._FIXED if k in d})
        st.job = {k: d[k] for k in job_keys if k in d}
        st.info = {k: v for k, v in d.items() if k not in cls._FIXED and k not in job_keys}
        return st


def _make_stager(cuda: bool):
    """DCP's stager, kept for the whole attempt: it allocates its host buffers on the first save
    and copies into them on the next ones. On CUDA they are pinned and the copies non-blocking
    (one device sync at the end), so the stall is the device-to-host copy at PCIe speed."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # torch >= 2.9

        return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                            use_async_staging=False, use_non_blocking_copy=cuda))
    except (ImportError, TypeError):
        from torch.distributed.checkpoint.staging import BlockingAsyncStager

        return BlockingAsyncStager(cache_staged_state_dict=cuda)


def stager_reusable(stager) -> bool:
    """Whether `stager` can stage another save. torch 2.11's DefaultStager closes its inner
    StateDictStager at the end of every stage (pytorch#183413), which empties the deepcopy
    dispatch table; the next stage then fails with `KeyError: <class 'type'>`, the first GPU run
    of 2.11 failed every job at its second save. Such a stager also frees its cached host
    buffers, so a fresh one per save costs nothing more than 2.11 already pays."""
    inner = getattr(stager, "_state_dict_stager", None)
    table = getattr(inner, "_deepcopy_dispatch", None)
    return table is None or bool(table)


@dataclass
class _Save:
    """A save whose files are being written (or are written but not yet registered)."""

    step: int
    name: str            # step_NNNNNNNN
    out: str             # where this rank's DCP files go: the run dir's .partial dir, or a local stage
    metrics: Dict[str, Any]
    future: Future       # this rank's write (+ upload); its result is the write's seconds
    stall_s: float = 0.0


class Checkpointer:
    """Save, register and restore checkpoints for the per-worker loop.

    Restore order: the checkpoint Ray Train hands this worker group (a restart or a resumed
    run), else nothing (the caller then initialises weights, e.g. from `model.init_from`).

    Per attempt, on every rank at the same points: `save` at the steps `due` says (it returns
    the step's checkpoint seconds), `poll` at every other step boundary, `finish` after the last
    step, `close` always (also on failure). `run_dir` is Ray Train's experiment directory (local
    path or URI); `comm` the worker's collectives (elastic/train/comm.py) on the model's device."""

    def __init__(self, every_steps: int, job_keys: Tuple[str, ...], trainable_only: bool = False, *,
                 run_dir: str, comm, async_save: bool = True, events: Optional[str] = None, every_s: float = 0.0):
        self.every_steps = every_steps
        self.every_s = every_s
        self._last_save_t = time.monotonic()
        self.job_keys = job_keys
        self.trainable_only = trainable_only  # LoRA: adapters (+ their optimizer state) only
        self.run_dir = run_dir.rstrip("/")
        self.remote = is_remote(self.run_dir)
        self.comm = comm
        self.async_save = async_save
        self.events = events
        self.rank = comm.rank
        self.resumed_from: Optional[str] = None
        self._pending: Optional[_Save] = None
        self._stager = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pg = None
        if async_save:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-ckpt")
            if dist.is_available() and dist.is_initialized():
                # Created by every rank in the same order (a group creation is collective).
                self._pg = dist.new_group(backend="gloo")
        sweep_stale_stages()
        if self.rank == 0 and not self.remote:
            self._sweep_partials()

    def _sweep_partials(self) -> None:
        """Writes a crashed attempt left unfinished (never registered). No rank of this attempt
        writes before the first step's collectives, so this precedes every write."""
        d = _local(self.run_dir)
        try:
            names = os.listdir(d)
        except OSError:
            return
        for n in names:
            if n.startswith("step_") and n.endswith(PARTIAL):
                shutil.rmtree(os.path.join(d, n), ignore_errors=True)

    def due(self, step: int, last: bool) -> bool:
        """Save after 1-based `step`? At every `every_steps`-th step, the last, and (with
        `every_s`) once `every_s` seconds have passed since the last save by rank 0's clock (a
        max over ranks, so every rank takes the same branch)."""
        if last or step % self.every_steps == 0:
            return True
        if self.every_s <= 0:
            return False
        late = float(self.rank == 0 and time.monotonic() - self._last_save_t >= self.every_s)
        return self.comm.max([late])[0] > 0

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                aux: Optional[Dict[str, Any]] = None) -> Optional[TrainState]:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as d:
            raw = load(d, model, optimizer, self.trainable_only, aux=aux)
        # Table entries (the rollout buffer) stay on storage until the job reads them.
        raw = resolve_tables(raw, ckpt.path, ckpt.filesystem)
        self.resumed_from = ckpt.path
        return TrainState.from_json(raw, self.job_keys)

    # -- saving --------------------------------------------------------------------------------
    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
             metrics: Dict[str, Any], final: bool = False, aux: Optional[Dict[str, Any]] = None) -> Dict[str, float]:
        """Checkpoint `state.step`: wait for (and register) the previous save if it is still in
        flight, copy the state to host memory and start the write in the background (or write
        it here when saves are synchronous). `final` (the invocation's last step): also wait for
        this write and register it. Returns this step's checkpoint seconds (module docstring)."""
        t0 = time.perf_counter()
        self._last_save_t = time.monotonic()
        wait_s = self._complete() if self._pending is not None else 0.0
        state.time = time.time()
        name = checkpoint_dir_name(state.step)
        out = _stage_dir() if self.remote else f"{_local(self.run_dir)}/{name}{PARTIAL}"
        tables: Dict[str, TableState] = {}
        try:
            os.makedirs(out, exist_ok=True)
            if self.rank == 0:
                js, tables = split_tables(state.to_json())
                _write_state_file(out, js)
            msd, osd = get_state_dict(model, optimizer, options=_options(self.trainable_only))
            sd = {"model": msd, "optim": osd, **_aux_state(aux)}
            writer = _Writer(out, fault_delay_s(state.step, self.rank))
            if self.async_save:
                if self._stager is None:
                    self._stager = _make_stager(self.comm.device.type == "cuda")
                staged = self._stager.stage(sd)  # after this, training may change the live tensors
                if not stager_reusable(self._stager):
                    self._stager = None  # the next save builds its own (torch 2.11, 2.12)
                future = self._pool.submit(self._write, staged, writer, out, name, self._pg, tables)
            else:
                future = Future()
                future.set_result(self._write(sd, writer, out, name, None, tables))
        except BaseException:
            if self.remote:
                cleanup_local(out)
            raise
        stall = time.perf_counter() - t0
        self._pending = _Save(state.step, name, out, dict(metrics), future, stall)
        if final or not self.async_save:
            self._complete()
        return {"checkpoint_s": time.perf_counter() - t0, "checkpoint_stall_s": stall, "checkpoint_wait_s": wait_s}

    def _write(self, sd: Dict[str, Any], writer: _Writer, out: str, name: str, pg,
               tables: Optional[Dict[str, TableState]] = None) -> float:
        """This rank's write (background thread when asynchronous): rank 0's tables (Parquet),
        DCP into `out`, then, on remote storage, the upload of this rank's files and the
        deletion of the stage."""
        t0 = time.perf_counter()
        try:
            if tables:
                write_tables(out, tables)
            if self.remote and self.rank == 0:
                # Leftovers of an attempt that crashed inside this step's upload. No other rank
                # uploads before DCP's collectives, which need rank 0 to have got past here.
                import pyarrow.fs as pafs

                fs, base = pafs.FileSystem.from_uri(self.run_dir)
                fs.delete_dir_contents(f"{base}/{name}", missing_dir_ok=True)
            dcp.save(sd, storage_writer=writer, process_group=pg)
            if self.remote:
                self._upload(out, name)
        finally:
            if self.remote:
                cleanup_local(out)
        return time.perf_counter() - t0

    def _upload(self, out: str, name: str) -> None:
        """This rank's files from the local stage into `<run dir>/<name>/`: shards first, then
        `.metadata`, `train_state.json` last (what `latest_complete` looks for)."""
        import pyarrow.fs as pafs

        fs, base = pafs.FileSystem.from_uri(self.run_dir)
        files = sorted(os.listdir(out), key=lambda n: (n == STATE_FILE, n == ".metadata", n))
        fs.create_dir(f"{base}/{name}", recursive=True)
        for n in files:
            pafs.copy_files(os.path.join(out, n), f"{base}/{name}/{n}",
                            source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)

    # -- registering ---------------------------------------------------------------------------
    def poll(self) -> Optional[Dict[str, float]]:
        """At a step boundary with a save in flight: one tiny collective asks whether every
        rank's write is complete; if it is, register the checkpoint. Returns this step's
        checkpoint seconds; None (and no collective) when no save is pending, which every rank
        knows alike."""
        if self._pending is None:
            return None
        t0 = time.perf_counter()
        done, write_s = self._agree()
        if done:
            self._register(write_s)
        return {"checkpoint_s": time.perf_counter() - t0}

    def finish(self) -> float:
        """After the last step: wait for the save in flight, if any, and register it."""
        return self._complete() if self._pending is not None else 0.0

    def _complete(self) -> float:
        t0 = time.perf_counter()
        try:
            self._pending.future.result()
        except BaseException:
            pass  # reported to every rank by the agreement below
        done, write_s = self._agree()
        assert done
        self._register(write_s)
        return time.perf_counter() - t0

    def _agree(self) -> Tuple[bool, float]:
        """Every rank's state of the pending write, in one all-gather of two numbers on the
        communication device (the model's; NCCL takes no host tensors): (all complete, the
        slowest rank's write seconds). A write that failed anywhere fails every rank here."""
        p = self._pending
        f = p.future
        if not f.done():
            mine = [0.0, 0.0]
        elif f.exception() is not None:
            mine = [-1.0, 0.0]
        else:
            mine = [1.0, float(f.result())]
        allv = self.comm.gather(mine)  # [world, 2]
        if (allv[:, 0] < 0).any():
            self._pending = None
            if f.done() and f.exception() is not None:
                raise f.exception()
            bad = [int(r) for r in (allv[:, 0] < 0).nonzero()[0]]
            raise RuntimeError(f"checkpoint {p.name}: the write failed on rank(s) {bad}")
        return bool((allv[:, 0] > 0).all()), float(allv[:, 1].max())

    def _register(self, write_s: float) -> None:
        """Every rank's files are complete: rank 0 moves the local directory into place, then
        every rank reports it to Ray Train, which registers it once all have (NO_UPLOAD: the
        files already are where Ray keeps checkpoints)."""
        import ray.train
        from ray.train import CheckpointUploadMode

        p, self._pending = self._pending, None
        final = f"{self.run_dir}/{p.name}"
        if not self.remote and self.rank == 0:
            dst = _local(final)
            if os.path.isdir(dst):  # complete but never registered: a crashed attempt's
                shutil.rmtree(dst)
            os.replace(p.out, dst)
        ray.train.report(p.metrics, checkpoint=ray.train.Checkpoint(final), checkpoint_dir_name=p.name,
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        if self.rank == 0 and self.events:
            from elastic.records import append_record

            append_record(self.events, {"event": "checkpoint_done", "time": time.time(), "step": p.step,
                                        "write_s": write_s, "stall_s": p.stall_s, "async": self.async_save})

    def close(self) -> None:
        """Always, after the loop (also when it failed): stop the writer thread and free the
        staging buffers. A save still in flight is abandoned, never registered; its local stage
        is deleted (a local .partial dir is swept by the next attempt)."""
        p, self._pending = self._pending, None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if p is not None and self.remote:
            cleanup_local(p.out)
        if self._stager is not None:
            self._stager.close()
            self._stager = None
