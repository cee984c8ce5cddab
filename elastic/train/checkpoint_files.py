"""Checkpoint directories on storage, without torch: their names, the newest complete one, its
`train_state.json`. The driver reads these (to seek the data stream, to say where a run resumes)
and so does not import torch.distributed.checkpoint for them; elastic/train/checkpoint.py writes
and loads the checkpoints and re-exports these names."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Optional, Tuple

STATE_FILE = "train_state.json"
DIR_RE = re.compile(r"^step_(\d{8})$")


def checkpoint_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def read_train_state(path: str) -> Dict[str, Any]:
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)


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
