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
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
LEDGER = "ledger.jsonl"


def append_record(path: str, record: Dict[str, Any]) -> None:
    """Append one record as one line (a single O_APPEND write). If the file ends in a line cut
    short by a crash, the record starts on a new line instead of being glued to it."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    line = (json.dumps(record, allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # (an extra empty line, at worst, is skipped by every reader)
        os.write(fd, line)
    finally:
        os.close(fd)


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
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for raw in f:
            rec = _parse(raw)
            if rec is not None:
                yield rec


def read_records(path: str) -> List[Dict[str, Any]]:
    return list(iter_records(path))


def read_new_records(path: str, offset: int = 0) -> Tuple[List[Dict[str, Any]], int]:
    """Records in the *complete* lines after byte `offset`, and the offset just past the last
    complete line: for following a file another process is appending to. A line still being
    written is left for the next call; a complete line that does not parse is skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    recs = [r for r in (_parse(raw) for raw in data[:end].split(b"\n")) if r is not None]
    return recs, offset + end + 1
