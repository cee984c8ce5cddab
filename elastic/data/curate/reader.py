"""Read a curation block: input files (or pieces of large ones) in a fixed order, every document
with a stable id and its input position, bad rows counted with file:line and skipped
(elastic/data/documents.py's rules: bad JSON, invalid UTF-8, a missing or non-text field, blank
text).

A document's `order` is file_index * 2**32 + row (the line of a JSONL file, the row of a
Parquet file): its place in the whole input, the same however the files are split and grouped
into blocks (dedup keeps the smallest order)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import List, Tuple

from elastic.data.documents import NOT_A_ROW, BadRows, _row_text, decode_text, json_row
from elastic.data.shards import group_by_size
from elastic.data.sources import filesystem_for

ROW_BITS = 32


@dataclass(frozen=True)
class InputFile:
    index: int    # position in the sorted input file list
    uri: str
    format: str   # text | jsonl | parquet | html | warc | pydoc
    name: str     # path relative to the source root (ids and report locations)
    size: int     # bytes of this piece
    # A piece of a large file: bytes [start, end) of a JSONL file (cut after a newline), or row
    # groups [start, end) of a Parquet file; end -1 = to the end. first_row: lines (JSONL) or
    # rows (Parquet) before the piece, so line numbers and orders are those of the whole file.
    start: int = 0
    end: int = -1
    first_row: int = 0


@dataclass(frozen=True)
class Block:
    index: int
    files: Tuple[InputFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _jsonl_pieces(f: InputFile, block_bytes: int) -> List[InputFile]:
    """Cut a JSONL file after the first newline past every `block_bytes`, counting the lines
    before each cut (one sequential read on the driver)."""
    fs, path = filesystem_for(f.uri)
    cuts: List[Tuple[int, int]] = []  # (byte, lines before it)
    pos, lines, target = 0, 0, block_bytes
    with fs.open_input_stream(path) as s:
        while True:
            chunk = s.read(1 << 23)
            if not chunk:
                break
            off = 0
            while pos + len(chunk) > target:
                k = chunk.find(b"\n", max(off, target - pos))
                if k < 0:
                    break
                lines += chunk.count(b"\n", off, k + 1)
                off = k + 1
                cuts.append((pos + off, lines))
                target = pos + off + block_bytes
            lines += chunk.count(b"\n", off)
            pos += len(chunk)
    bounds = [(0, 0)] + [c for c in cuts if c[0] < pos]
    out = []
    for i, (start, before) in enumerate(bounds):
        end = bounds[i + 1][0] if i + 1 < len(bounds) else pos
        out.append(dataclasses.replace(f, size=end - start, start=start, end=end, first_row=before))
    return out


def _parquet_pieces(f: InputFile, block_bytes: int) -> List[InputFile]:
    import pyarrow.parquet as pq

    fs, path = filesystem_for(f.uri)
    md = pq.ParquetFile(fs.open_input_file(path)).metadata
    out, start, acc, rows, first = [], 0, 0, 0, 0
    for rg in range(md.num_row_groups):
        acc += md.row_group(rg).total_byte_size
        rows += md.row_group(rg).num_rows
        if acc >= block_bytes:
            out.append(dataclasses.replace(f, size=acc, start=start, end=rg + 1, first_row=first))
            start, acc, first = rg + 1, 0, rows
    if start < md.num_row_groups:
        out.append(dataclasses.replace(f, size=acc, start=start, end=md.num_row_groups, first_row=first))
    return out or [f]


def split_file(f: InputFile, block_bytes: int) -> List[InputFile]:
    """A file larger than a block, as pieces of about `block_bytes` (JSONL by lines, Parquet by
    row groups); a text file is one document and never split."""
    if f.size <= block_bytes or f.format not in ("jsonl", "parquet"):
        return [f]
    return _jsonl_pieces(f, block_bytes) if f.format == "jsonl" else _parquet_pieces(f, block_bytes)


def plan_blocks(files: List[InputFile], block_bytes: int) -> List[Block]:
    """Files (large ones split, see split_file) grouped in order into blocks of about
    `block_bytes`. Depends only on the file list and sizes (and, for split files, where their
    newlines or row groups are)."""
    parts = [p for g in files for p in split_file(g, block_bytes)]
    return [Block(i, group) for i, group in enumerate(group_by_size(parts, block_bytes))]


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
            text = decode_text(s.read(), f.name, bad)
        return [_doc(f, 0, text, None, f.name)] if text is not None else docs
    if f.format == "jsonl":
        with fs.open_input_file(path) as s:
            s.seek(f.start)
            data = s.read() if f.end < 0 else s.read(f.end - f.start)
        for line_no, raw in enumerate(data.split(b"\n"), start=f.first_row + 1):
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
        row = f.first_row
        for rg in range(f.start, pf.num_row_groups if f.end < 0 else f.end):
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
    if f.format == "html":  # one document per file: trafilatura's main text
        with fs.open_input_stream(path) as s:
            raw = s.read()
        return [_html_doc(f, 0, raw, None, f.name)]
    if f.format == "warc":
        return _read_warc(f, fs, path, bad)
    raise ValueError(f"{f.uri}: unknown format {f.format!r}")


HTML_EXT = (".html", ".htm")
WARC_EXT = (".warc", ".warc.gz")


def infer_markup_format(name: str, declared: str, current: str) -> str:
    """html / warc for `curate.format` html|warc, or for auto by extension; else `current`."""
    if declared in ("html", "warc"):
        return declared
    low = name.lower()
    if declared == "auto" and low.endswith(HTML_EXT):
        return "html"
    if declared == "auto" and low.endswith(WARC_EXT):
        return "warc"
    return current


def extract_main_text(html) -> str:
    """trafilatura's main text of a page (navigation, footers, comments left out); "" if none."""
    import trafilatura

    return (trafilatura.extract(html, include_comments=False, include_tables=True, favor_precision=False,
                                deduplicate=False) or "").strip()


def _html_doc(f: InputFile, row: int, raw: bytes, doc_id, default_id: str, charset: str = "") -> dict:
    """A page's document; with no extractable text it comes pre-removed ("html:no_text")."""
    html = raw.decode(charset or "utf-8", errors="replace") if charset else raw
    try:
        text = extract_main_text(html)
    except Exception:  # lxml on a page it cannot parse at all
        text = ""
    d = _doc(f, row, text, doc_id, default_id)
    if not text:
        d["reason"] = "html:no_text"
    return d


def _read_warc(f: InputFile, fs, path: str, bad: BadRows) -> List[dict]:
    """One document per response record with an HTML payload; id = its WARC-Target-URI, order
    = the record's number in the file. A record that cannot be read is a bad row
    ("<file>:record<n>"); a file whose framing breaks is read up to there."""
    from warcio.archiveiterator import ArchiveIterator

    docs: List[dict] = []
    n = 0
    with fs.open_input_stream(path) as s:
        it = iter(ArchiveIterator(s))
        while True:
            where = f"{f.name}:record{n}"
            try:
                rec = next(it)
            except StopIteration:
                break
            except Exception as e:  # ArchiveLoadFailed, bad gzip member, bad header
                bad.add("bad_warc_record", f"{where} ({type(e).__name__})")
                break
            try:
                if rec.rec_type == "response" and rec.http_headers is not None:
                    ctype = rec.http_headers.get_header("Content-Type") or ""
                    if "html" in ctype.lower():
                        raw = rec.content_stream().read()
                        cs = ""
                        for part in ctype.split(";")[1:]:
                            k, _, v = part.strip().partition("=")
                            if k.lower() == "charset":
                                cs = v.strip().strip('"')
                        try:
                            "".encode(cs or "utf-8")
                        except LookupError:
                            cs = "utf-8"
                        uri = rec.rec_headers.get_header("WARC-Target-URI")
                        docs.append(_html_doc(f, n, raw, uri, where, cs or "utf-8"))
            except Exception as e:  # a payload that does not decode (bad chunking, bad gzip)
                bad.add("bad_warc_record", f"{where} ({type(e).__name__})")
            n += 1
    return docs


def read_block(block: Block, text_field: str, id_field: str, bad: BadRows) -> List[dict]:
    out: List[dict] = []
    for f in block.files:
        out.extend(read_file(f, text_field, id_field, bad))
    return out


def relative_name(path: str, root: str) -> str:
    rel = os.path.relpath(path, root) if root else path
    return path if rel.startswith("..") else rel
