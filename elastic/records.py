"""The run's JSON-lines records (`metrics.jsonl`, `events.jsonl`, `ledger.jsonl`): one writer,
one reader, shared by the trainer, the driver, the report and the tools.

Why one module: these files are appended to by several processes (every rank writes events
and ledger lines) and read while a run is live or after it crashed. A record is written as
one `write()` of one line on a file opened with O_APPEND, so lines from different ranks never
interleave; a crash can still leave the *last* line cut short, which every reader here skips
instead of failing. A leaf module: imports nothing from the project.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List

METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
LEDGER = "ledger.jsonl"


def append_record(path: str, record: Dict[str, Any]) -> None:
    """Append one record as one line (a single O_APPEND write)."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    line = (json.dumps(record, allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def iter_records(path: str) -> Iterator[Dict[str, Any]]:
    """Records of a JSON-lines file in order; a missing file has none; a line that does not
    parse (cut short by a crash, or still being written) is skipped."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for raw in f:
            raw = raw.strip()
            if not raw:
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(rec, dict):
                yield rec


def read_records(path: str) -> List[Dict[str, Any]]:
    return list(iter_records(path))
