"""Sharded, reshardable checkpoints with torch.distributed.checkpoint (DCP), reported to Ray Train.

Each rank writes its shards of the model and optimizer into its own local directory; rank 0
adds `.metadata` and `train_state.json` (step, LR scheduler, data cursor, counters). Every rank
then calls `ray.train.report(..., checkpoint=...)`, Ray copies all of them into one directory
`<run dir>/step_NNNNNNNN` and registers it only once every rank has reported: a crash while
writing leaves the previous registered checkpoint as the one `ray.train.get_checkpoint()`
returns. DCP stores logical (unsharded) tensor layouts, so a checkpoint written at world
size W loads at any W'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STATE_FILE = "train_state.json"
DIR_RE = re.compile(r"^step_(\d{8})$")


def checkpoint_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def save_local(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_state: Dict[str, Any],
               trainable_only: bool = False) -> str:
    """Write this rank's part of the checkpoint into a fresh local temp dir; return it.
    `trainable_only` (LoRA): the frozen base is left out, only adapters and their optimizer
    state are written (the base is referenced in train_state.json by path and hash)."""
    out = tempfile.mkdtemp(prefix="elastic-ckpt-")
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=trainable_only))
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=out)
    _maybe_inject_delay(int(train_state.get("step", -1)))
    if dist.get_rank() == 0:
        tmp = os.path.join(out, STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(train_state, f)
        os.replace(tmp, os.path.join(out, STATE_FILE))
    return out


def _maybe_inject_delay(step: int) -> None:
    """Fault injection for drills and tests: ELASTIC_FAULT_CKPT_DELAY="rank=R,step=S,seconds=X"
    makes rank R stall X seconds while writing checkpoint S (slow storage), so a crash can be
    placed inside a checkpoint write. Unset in normal runs."""
    spec = os.environ.get("ELASTIC_FAULT_CKPT_DELAY")
    if not spec:
        return
    kv = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    if int(kv.get("rank", 0)) == dist.get_rank() and int(kv.get("step", -1)) == step:
        import time

        time.sleep(float(kv.get("seconds", 30)))


def load(path: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
         trainable_only: bool = False) -> Dict[str, Any]:
    """Load model (+ optimizer) state from a checkpoint directory at any world size.

    `trainable_only` (resuming a LoRA run): only the adapters and the optimizer are read; the
    frozen base was loaded from its own source. Without an optimizer (`model.init_from`), the
    model's adapter tensors, if any, are not read: a new run's adapters start fresh."""
    from elastic.model.lora import is_adapter_key

    opts = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
    else:
        msd = get_state_dict(model, [])[0]
        adapters = any(is_adapter_key(k) for k in msd)
        state = {"model": {k: v for k, v in msd.items() if not is_adapter_key(k)}}
        opts = StateDictOptions(strict=not adapters)
    dcp.load(state, checkpoint_id=path)
    if optimizer is None:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={}, options=opts)
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=opts)
    return read_train_state(path)


def read_train_state(path: str) -> Dict[str, Any]:
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)


def cleanup_local(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def latest_complete(run_dir: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Newest `step_*` directory under `run_dir` whose files look complete (state, metadata
    and one shard file per writing rank); works for local paths and pyarrow URIs.

    Used driver-side to seek the data stream; workers still load what Ray Train hands them
    and re-align if the two disagree (e.g. a checkpoint copied but never registered)."""
    import pyarrow.fs as pafs

    if "://" in run_dir:
        fs, base = pafs.FileSystem.from_uri(run_dir)
    else:
        fs, base = pafs.LocalFileSystem(), run_dir
    try:
        entries = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except Exception:
        return None
    dirs = sorted((e.base_name for e in entries if e.type == pafs.FileType.Directory and DIR_RE.match(e.base_name)), reverse=True)
    for name in dirs:
        d = f"{base.rstrip('/')}/{name}"
        try:
            names = {e.base_name for e in fs.get_file_info(pafs.FileSelector(d))}
            if STATE_FILE not in names or ".metadata" not in names:
                continue
            with fs.open_input_stream(f"{d}/{STATE_FILE}") as s:
                state = json.loads(s.read().decode())
        except Exception:
            continue
        shards = [n for n in names if n.endswith(".distcp")]
        if len(shards) >= int(state.get("world_size", 1)):
            return (f"{run_dir.rstrip('/')}/{name}", state)
    return None


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


class Checkpointer:
    """Save, report and restore checkpoints for the per-worker loop.

    Restore order: the checkpoint Ray Train hands this worker group (a restart or a resumed
    run), else nothing (the caller then initialises weights, e.g. from `model.init_from`)."""

    def __init__(self, every_steps: int, job_keys: Tuple[str, ...], trainable_only: bool = False):
        self.every_steps = every_steps
        self.job_keys = job_keys
        self.trainable_only = trainable_only  # LoRA: adapters (+ their optimizer state) only
        self.resumed_from: Optional[str] = None

    def due(self, step: int, last: bool) -> bool:
        """Save after 1-based `step`?"""
        return last or step % self.every_steps == 0

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Optional[TrainState]:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as d:
            raw = load(d, model, optimizer, self.trainable_only)
        self.resumed_from = ckpt.path
        return TrainState.from_json(raw, self.job_keys)

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
             metrics: Dict[str, Any]) -> float:
        """Write this rank's shards, report them to Ray Train (which registers the checkpoint
        once every rank has reported), clean up; returns the seconds it took."""
        import ray.train

        t0 = time.perf_counter()
        state.time = time.time()
        d = save_local(model, optimizer, state.to_json(), self.trainable_only)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d),
                         checkpoint_dir_name=checkpoint_dir_name(state.step))
        cleanup_local(d)
        return time.perf_counter() - t0
