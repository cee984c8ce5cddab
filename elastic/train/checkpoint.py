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
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STATE_FILE = "train_state.json"
DIR_RE = re.compile(r"^step_(\d{8})$")


def checkpoint_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def save_local(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_state: Dict[str, Any]) -> str:
    """Write this rank's part of the checkpoint into a fresh local temp dir; return it."""
    out = tempfile.mkdtemp(prefix="elastic-ckpt-")
    msd, osd = get_state_dict(model, optimizer)
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


def load(path: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> Dict[str, Any]:
    """Load model (+ optimizer) state from a checkpoint directory at any world size."""
    msd, osd = get_state_dict(model, optimizer) if optimizer is not None else (get_state_dict(model, [])[0], None)
    state = {"model": msd} if optimizer is None else {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    if optimizer is None:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={}, options=StateDictOptions(strict=True))
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
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
