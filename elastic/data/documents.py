"""Read the documents of one shard, counting and skipping malformed rows.

Runs inside Ray Data read tasks. A bad row (bad JSON, invalid UTF-8, missing or non-text
field, empty text) never stops the stream: it is recorded with its location (file and line,
or byte offset) and skipped, and the counts travel with the shard's packed samples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

from elastic.data.chat import ChatFormat, RowError, row_messages
from elastic.data.shards import Piece, Shard
from elastic.data.sources import filesystem_for

BAD_KINDS = ("bad_json", "invalid_utf8", "missing_field", "empty_text", "bad_conversation", "too_long", "truncated")


@dataclass
class BadRows:
    """Counts per kind plus the first few locations, mergeable across shards."""

    counts: Dict[str, int] = field(default_factory=dict)
    examples: List[str] = field(default_factory=list)
    keep: int = 5

    def add(self, kind: str, where: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.examples) < self.keep:
            self.examples.append(f"{kind} at {where}")

    def merge(self, other: "BadRows") -> None:
        for k, v in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        for e in other.examples:
            if len(self.examples) < self.keep:
                self.examples.append(e)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        return {"counts": dict(self.counts), "examples": list(self.examples)}

    @classmethod
    def from_dict(cls, d: dict, keep: int = 5) -> "BadRows":
        return cls(counts=dict(d.get("counts", {})), examples=list(d.get("examples", [])), keep=keep)


def decode_text(raw: bytes, where: str, bad: BadRows):
    """UTF-8 text of a document, or None after counting it as invalid_utf8 / empty_text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad.add("invalid_utf8", f"{where} (byte {e.start})")
        return None
    if not text.strip():
        bad.add("empty_text", where)
        return None
    return text


def _row_text(value, where: str, field_name: str, bad: BadRows):
    """The one rule for a row's text field (JSONL and Parquet alike): text or UTF-8 bytes that
    are not blank; anything else is recorded as a bad row and yields None."""
    if isinstance(value, bytes):
        return decode_text(value, where, bad)
    if not isinstance(value, str):
        bad.add("missing_field", f"{where} (no text in field {field_name!r})")
        return None
    if not value.strip():
        bad.add("empty_text", where)
        return None
    return value


def _read_text(p: Piece, bad: BadRows) -> Iterator[str]:
    fs, path = filesystem_for(p.uri)
    with fs.open_input_stream(path) as s:
        text = decode_text(s.read(), p.uri, bad)
    if text is not None:
        yield text


def _conversation(obj, where: str, chat: ChatFormat, bad: BadRows):
    """SFT rows: the row's messages as one JSON string (what the tokenize stage renders)."""
    try:
        return json.dumps(row_messages(obj, chat))
    except RowError as e:
        bad.add("bad_conversation", f"{where} ({e})")
        return None


NOT_A_ROW = object()
"""What json_row returns for a blank line or a bad row (None is a valid JSON row)."""


def json_row(raw: bytes, where: str, bad: BadRows) -> Any:
    """One JSON-lines row, or NOT_A_ROW: blank lines are not rows; a line that is not UTF-8 or
    not JSON is counted in `bad` with `where` (file:line) and skipped."""
    if not raw.strip():
        return NOT_A_ROW
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad.add("invalid_utf8", f"{where} (byte {e.start})")
        return NOT_A_ROW
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        bad.add("bad_json", f"{where} ({e.msg})")
        return NOT_A_ROW


def _read_jsonl(p: Piece, field_name: str, bad: BadRows, chat: Optional[ChatFormat] = None) -> Iterator[str]:
    """Lines whose first byte lies in [start, end): every line belongs to exactly one piece."""
    fs, path = filesystem_for(p.uri)
    with fs.open_input_file(path) as f:
        pos = p.start
        if p.start > 0:
            f.seek(p.start - 1)
            skipped = _readline(f)  # finishes the line that began before `start`
            pos = p.start - 1 + len(skipped)
        else:
            f.seek(0)
        line_no = 1 if p.start == 0 else None
        end = p.end if p.end >= 0 else float("inf")
        while pos < end:
            raw = _readline(f)
            if not raw:
                break
            where = f"{p.uri}:{line_no}" if line_no is not None else f"{p.uri}@byte{pos}"
            pos += len(raw)
            if line_no is not None:
                line_no += 1
            obj = json_row(raw, where, bad)
            if obj is NOT_A_ROW:
                continue
            if chat is not None:
                text = _conversation(obj, where, chat, bad)
            else:
                text = _row_text(obj.get(field_name) if isinstance(obj, dict) else None, where, field_name, bad)
            if text is not None:
                yield text


def _readline(f) -> bytes:
    """pyarrow's NativeFile has no readline on every version: read in chunks."""
    if hasattr(f, "readline"):
        try:
            return f.readline()
        except Exception:
            pass
    out = bytearray()
    while True:
        c = f.read(4096)
        if not c:
            return bytes(out)
        i = c.find(b"\n")
        if i >= 0:
            out += c[: i + 1]
            f.seek(f.tell() - (len(c) - i - 1))
            return bytes(out)
        out += c


def _read_parquet(p: Piece, field_name: str, bad: BadRows, chat: Optional[ChatFormat] = None) -> Iterator[str]:
    import pyarrow.parquet as pq

    fs, path = filesystem_for(p.uri)
    pf = pq.ParquetFile(fs.open_input_file(path))
    if chat is not None:
        cols = [c for c in (chat.messages_field, chat.prompt_field, chat.completion_field) if c in pf.schema_arrow.names]
        row = sum(pf.metadata.row_group(i).num_rows for i in range(p.start))
        for rg in range(p.start, p.end):
            for obj in pf.read_row_group(rg, columns=cols).to_pylist():
                text = _conversation(obj, f"{p.uri}:row{row}", chat, bad)
                row += 1
                if text is not None:
                    yield text
        return
    if field_name not in pf.schema_arrow.names:
        bad.add("missing_field", f"{p.uri} (no column {field_name!r})")
        return
    row = sum(pf.metadata.row_group(i).num_rows for i in range(p.start))
    for rg in range(p.start, p.end):
        col = pf.read_row_group(rg, columns=[field_name]).column(0).to_pylist()
        for v in col:
            where = f"{p.uri}:row{row}"
            row += 1
            text = _row_text(v, where, field_name, bad)
            if text is not None:
                yield text


def read_shard(shard: Shard, text_field: str, keep_examples: int = 5,
               chat: Optional[ChatFormat] = None) -> Tuple[List[str], BadRows]:
    """All good documents of a shard in order, and the bad rows met on the way. With `chat`
    (SFT), a document is a conversation (JSON list of messages) from a JSONL/Parquet row."""
    bad = BadRows(keep=keep_examples)
    docs: List[str] = []
    for p in shard.pieces:
        if p.format == "text":
            docs.extend(_read_text(p, bad))
        elif p.format == "jsonl":
            docs.extend(_read_jsonl(p, text_field, bad, chat))
        elif p.format == "parquet":
            docs.extend(_read_parquet(p, text_field, bad, chat))
        else:
            raise ValueError(f"{p.uri}: unknown format {p.format!r}")
    return docs, bad
