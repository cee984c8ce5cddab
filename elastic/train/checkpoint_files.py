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


TABLE_KEY = "$table"  # a job-state entry written as a Parquet file beside the shards


class TableState:
    """A job-state value too big for `train_state.json` (the asynchronous rollout buffer: token
    ids and log-probs of every in-flight completion). The checkpoint writes it as
    `<key>.parquet` beside the DCP shards, in the save's background write (so the saving step
    does not stall on it), and `train_state.json` keeps only `{"$table": "<key>.parquet",
    "rows": n}`. `to_table(payload)` makes the pyarrow Table; it runs on the writer thread."""

    def __init__(self, payload: Any, to_table: Any, rows: int) -> None:
        self.payload, self.to_table, self.rows = payload, to_table, int(rows)


class TableRef:
    """A TableState read back lazily: `read()` loads the Parquet file (from local disk or a
    pyarrow filesystem) only when the job asks for it."""

    def __init__(self, path: str, filesystem: Any = None, rows: int = 0) -> None:
        self.path, self.filesystem, self.rows = path, filesystem, rows

    def read(self):
        import pyarrow.parquet as pq

        return pq.read_table(self.path, filesystem=self.filesystem)

    def __repr__(self) -> str:
        return f"TableRef({self.path!r}, rows={self.rows})"


def resolve_tables(state: Dict[str, Any], ckpt_path: str, filesystem: Any = None) -> Dict[str, Any]:
    """`train_state.json`'s table entries as TableRefs to their files in `ckpt_path`."""
    out = dict(state)
    for k, v in state.items():
        if isinstance(v, dict) and TABLE_KEY in v:
            out[k] = TableRef(f"{ckpt_path.rstrip('/')}/{v[TABLE_KEY]}", filesystem, int(v.get("rows", 0)))
    return out


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
