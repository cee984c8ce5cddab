"""Read a curation block: whole input files in a fixed order, every document with a stable id
and its input position, bad rows counted with file:line and skipped (elastic/data/documents.py's
rules: bad JSON, invalid UTF-8, a missing or non-text field, blank text).

A document's `order` is file_index * 2**32 + row: its place in the whole input, the same
however the files are grouped into blocks (dedup keeps the smallest order)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Tuple

from elastic.data.documents import NOT_A_ROW, BadRows, _row_text, json_row
from elastic.data.sources import filesystem_for

ROW_BITS = 32


@dataclass(frozen=True)
class InputFile:
    index: int    # position in the sorted input file list
    uri: str
    format: str   # text | jsonl | parquet
    name: str     # path relative to the source root (ids and report locations)
    size: int


@dataclass(frozen=True)
class Block:
    index: int
    files: Tuple[InputFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def plan_blocks(files: List[InputFile], block_bytes: int) -> List[Block]:
    """Consecutive files grouped into blocks of about `block_bytes` (a file is never split)."""
    blocks: List[Block] = []
    cur: List[InputFile] = []
    acc = 0
    for f in files:
        if cur and acc + f.size > block_bytes:
            blocks.append(Block(len(blocks), tuple(cur)))
            cur, acc = [], 0
        cur.append(f)
        acc += f.size
    if cur:
        blocks.append(Block(len(blocks), tuple(cur)))
    return blocks


def _doc(f: InputFile, row: int, text: str, doc_id, default_id: str) -> dict:
    if isinstance(doc_id, (int, str)) and not isinstance(doc_id, bool) and str(doc_id) != "":
        did = str(doc_id)
    else:
        did = default_id
    return {"id": did, "text": text, "order": (f.index << ROW_BITS) | row}


def docstrings(source: str) -> str:
    """A Python module's docstrings (module, classes, functions) in source order, one paragraph
    each: real English prose from the standard library (source "stdlib-docstrings")."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node)
            if d:
                out.append(d.strip())
    return "\n\n".join(out)


def read_file(f: InputFile, text_field: str, id_field: str, bad: BadRows) -> List[dict]:
    fs, path = filesystem_for(f.uri)
    docs: List[dict] = []
    if f.format == "pydoc":  # a Python file whose document is its docstrings
        with fs.open_input_stream(path) as s:
            text = docstrings(s.read().decode("utf-8", errors="replace"))
        return [_doc(f, 0, text, None, f.name)] if text.strip() else docs  # no docstrings: no document
    if f.format == "text":
        with fs.open_input_stream(path) as s:
            raw = s.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad.add("invalid_utf8", f"{f.name} (byte {e.start})")
            return docs
        if not text.strip():
            bad.add("empty_text", f.name)
            return docs
        return [_doc(f, 0, text, None, f.name)]
    if f.format == "jsonl":
        with fs.open_input_stream(path) as s:
            data = s.read()
        for line_no, raw in enumerate(data.split(b"\n"), start=1):
            where = f"{f.name}:{line_no}"
            obj = json_row(raw, where, bad)
            if obj is NOT_A_ROW:
                continue
            if not isinstance(obj, dict):
                bad.add("missing_field", f"{where} (not an object)")
                continue
            text = _row_text(obj.get(text_field), where, text_field, bad)
            if text is not None:
                docs.append(_doc(f, line_no, text, obj.get(id_field) if id_field else None, where))
        return docs
    if f.format == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(fs.open_input_file(path))
        names = pf.schema_arrow.names
        if text_field not in names:
            bad.add("missing_field", f"{f.name} (no column {text_field!r})")
            return docs
        cols = [text_field] + ([id_field] if id_field and id_field in names else [])
        row = 0
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg, columns=cols)
            texts = t.column(0).to_pylist()
            ids = t.column(1).to_pylist() if len(cols) > 1 else [None] * len(texts)
            for v, i in zip(texts, ids):
                where = f"{f.name}:row{row}"
                text = _row_text(v, where, text_field, bad)
                if text is not None:
                    docs.append(_doc(f, row, text, i, where))
                row += 1
        return docs
    raise ValueError(f"{f.uri}: unknown format {f.format!r}")


def read_block(block: Block, text_field: str, id_field: str, bad: BadRows) -> List[dict]:
    out: List[dict] = []
    for f in block.files:
        out.extend(read_file(f, text_field, id_field, bad))
    return out


def relative_name(path: str, root: str) -> str:
    rel = os.path.relpath(path, root) if root else path
    return path if rel.startswith("..") else rel
