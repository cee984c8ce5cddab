"""The run's JSON-lines records (`metrics.jsonl`, `events.jsonl`, `ledger.jsonl`): one writer,
one reader, shared by the trainer, the driver, the report and the tools.

Why one module: these files are appended to by several processes (every rank writes events
and ledger lines) and read while a run is live or after it crashed. A record is written as
one `write()` of one line on a file opened with O_APPEND, so lines from different ranks never
interleave; a crash can still leave the *last* line cut short, which every reader here skips
instead of failing, and the next append starts on a fresh line so the cut line never swallows
the record written after it (e.g. by the relaunched run). `read_new_records` is the same
reader for following a live file (the driver's progress line). A leaf module: imports nothing
from the project.

Paths may also be pyarrow filesystem URIs (`s3://bucket/run/metrics.jsonl`, `gs://...`). A
filesystem that can append (HDFS, a local `file://` URI) is appended to as above. Object stores
cannot append, so there every writing process keeps its own *part* objects under
`<path>.parts/`, named `<start time ns>-<host>-<pid>-<n>.jsonl` and rewritten whole on each of
its appends (a PUT is atomic: a part is never seen cut short), starting a new part every
`PART_LINES` records to bound the rewrite. Readers read the object at `<path>` (if any), then
the parts in name order: each writer's records in the order it wrote them, writers in the
order they started.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
LEDGER = "ledger.jsonl"
PART_LINES = 256

_parts: Dict[str, Tuple[str, List[bytes]]] = {}  # path -> (current part name, its lines)
_lock = threading.Lock()
_seq = itertools.count()


def _local(path) -> str:
    path = os.fspath(path)
    return path[len("file://"):] if path.startswith("file://") else path


def _is_uri(path) -> bool:
    path = os.fspath(path)
    return "://" in path and not path.startswith("file://")


def _fs(path: str):
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path)


def append_record(path: str, record: Dict[str, Any]) -> None:
    """Append one record as one line (a single O_APPEND write; a part object on object stores).
    If a local file ends in a line cut short by a crash, the record starts on a new line instead
    of being glued to it."""
    line = (json.dumps(record, allow_nan=True) + "\n").encode()
    path = os.fspath(path)
    if _is_uri(path):
        _append_uri(path, line)
        return
    path = _local(path)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # (an extra empty line, at worst, is skipped by every reader)
        os.write(fd, line)
    finally:
        os.close(fd)


def _append_uri(path: str, line: bytes) -> None:
    fs, p = _fs(path)
    try:
        with fs.open_append_stream(p) as s:
            s.write(line)
        return
    except NotImplementedError:  # object stores (pyarrow raises ArrowNotImplementedError)
        pass
    with _lock:
        name, lines = _parts.get(path, ("", []))
        if not name or len(lines) >= PART_LINES:
            name = f"{time.time_ns():020d}-{socket.gethostname()}-{os.getpid()}-{next(_seq)}.jsonl"
            lines = []
        lines.append(line)
        _parts[path] = (name, lines)
        with fs.open_output_stream(f"{p}.parts/{name}") as s:
            s.write(b"".join(lines))


def _lines(path) -> Iterator[bytes]:
    path = os.fspath(path)
    if not _is_uri(path):
        path = _local(path)
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            yield from f
        return
    import pyarrow.fs as pafs

    fs, p = _fs(path)
    objects = [p] + sorted((i.path for i in fs.get_file_info(pafs.FileSelector(f"{p}.parts", allow_not_found=True))
                            if i.type == pafs.FileType.File and i.path.endswith(".jsonl")), key=os.path.basename)
    for o in objects:
        try:
            with fs.open_input_stream(o) as s:
                data = s.read()
        except (FileNotFoundError, IsADirectoryError):
            continue
        yield from data.splitlines(keepends=True)


def _parse(raw: bytes) -> Optional[Dict[str, Any]]:
    raw = raw.strip()
    if not raw:
        return None
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def iter_records(path: str) -> Iterator[Dict[str, Any]]:
    """Records of a JSON-lines file in order; a missing file has none; a line that does not
    parse (cut short by a crash, or still being written) is skipped."""
    for raw in _lines(path):
        rec = _parse(raw)
        if rec is not None:
            yield rec


def read_records(path: str) -> List[Dict[str, Any]]:
    return list(iter_records(path))


def read_new_records(path: str, offset: int = 0) -> Tuple[List[Dict[str, Any]], int]:
    """Records in the *complete* lines after byte `offset`, and the offset just past the last
    complete line: for following a local file another process is appending to. A line still
    being written is left for the next call; a complete line that does not parse is skipped."""
    try:
        with open(_local(path), "rb") as f:
            f.seek(offset)
            data = f.read()
    except (FileNotFoundError, IsADirectoryError):
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    recs = [r for r in (_parse(raw) for raw in data[:end].split(b"\n")) if r is not None]
    return recs, offset + end + 1
