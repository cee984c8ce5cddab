"""A user's `ray.data.Dataset` as a training source: executed once, in order, into the run.

Why a snapshot: exact resume and resize need sample `s` of the stream to be the same row every
time the run asks for it, and open-source Ray Data has no iterator checkpoint
(ray-project/ray#37633, #48224). A user's pipeline may also differ between executions (a
`map_batches` that samples, a source that grows, scheduling-dependent block order without
`preserve_order`). So the first launch of a run executes the Dataset once, with
`DataContext.execution_options.preserve_order = True`, and writes its rows as numbered Parquet
files (`part-<write task index>-<write uuid>.parquet`, the write tasks taking the Dataset's blocks in
order) into the run directory, then commits a marker. From then on the run's source is that
snapshot: planned into shards and tokenized once like any Parquet source, read in the same
order by every restart, resize and resume. A relaunch of the run finds the marker and does not
execute the Dataset again (a different Dataset under the same run name is not picked up: start
a new run, or delete `<run>/source`).

How the order is made deterministic, in one line: row order = the Dataset's own order under
preserve_order, frozen on first execution; afterwards nothing about Ray's scheduling matters.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict

import pyarrow.fs as pafs

from elastic.data.sources import DataError, filesystem_for

MARKER = "_SNAPSHOT.json"


class _OrderedNames:
    """Parquet file names from the write task index (zero-padded, so sorted order = Dataset order)."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return f"part-{task_index:08d}-{write_uuid}.parquet"

    # Ray versions before get_filename_for_task asked for a block's name instead.
    def get_filename_for_block(self, block, write_uuid: str, task_index: int, block_index: int) -> str:
        return f"part-{task_index:08d}-{block_index:04d}-{write_uuid}.parquet"

    def get_filename_for_row(self, row, write_uuid: str, task_index: int, block_index: int, row_index: int) -> str:
        return f"part-{task_index:08d}-{block_index:04d}-{row_index:06d}-{write_uuid}.parquet"


def snapshot_info(dest: str) -> Dict[str, Any] | None:
    """The marker of a finished snapshot at `dest`, or None."""
    fs, where = filesystem_for(dest)
    path = f"{where.rstrip('/')}/{MARKER}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as s:
        return json.loads(s.read())


def snapshot_dataset(ds, dest: str, text_field: str, min_rows_per_file: int = 4096) -> Dict[str, Any]:
    """Execute `ds` once (in order) into Parquet files under `dest`; returns the marker's record.
    Idempotent: a finished snapshot is returned as is; an unfinished one is cleared and redone.
    Raises DataError (one line) if the Dataset has no string column `text_field`."""
    import pyarrow as pa
    import ray.data

    done = snapshot_info(dest)
    if done is not None:
        return done
    try:
        schema = ds.schema()
    except Exception as e:  # the user's pipeline failed while Ray Data planned it
        raise DataError(f"ray.data.Dataset source: cannot read its schema ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    names = list(schema.names) if schema is not None else []
    if text_field not in names:
        raise DataError(f"ray.data.Dataset source: no column {text_field!r} (data.text_field); its columns are {names}")
    typ = schema.base_schema.field(text_field).type if hasattr(schema, "base_schema") and isinstance(schema.base_schema, pa.Schema) else None
    if typ is not None and not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise DataError(f"ray.data.Dataset source: column {text_field!r} is {typ}, not a string")
    fs, where = filesystem_for(dest)
    if fs.get_file_info(where).type != pafs.FileType.NotFound:
        fs.delete_dir_contents(where)  # an interrupted snapshot: start it again from nothing
    fs.create_dir(where, recursive=True)
    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    t0 = time.time()
    try:
        ds.select_columns([text_field]).write_parquet(dest, filename_provider=_OrderedNames(),
                                                       min_rows_per_file=min_rows_per_file)
    finally:
        ctx.execution_options.preserve_order = before
    files = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(where)) if i.path.endswith(".parquet"))
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(fs.open_input_file(p)).metadata.num_rows for p in files)
    rec = {"rows": rows, "files": len(files), "text_field": text_field, "seconds": round(time.time() - t0, 3),
           "time": time.time(), "order": "Dataset order under preserve_order, frozen at first execution"}
    with fs.open_output_stream(f"{where.rstrip('/')}/{MARKER}") as s:
        s.write(json.dumps(rec).encode())
    return rec
