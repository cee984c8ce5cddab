"""The shard cache: each planned shard's packed samples, written once, read by sample index.

Layout, under the run's storage (a local path or any pyarrow filesystem URI):

    <run dir>/cache/<packing key>/shard-<shard key>.arrow   packed samples, row i = packing index i
    <run dir>/cache/<packing key>/shard-<shard key>.json    the commit record (samples, size, bad rows)
    <run dir>/cache/<packing key>/builds.jsonl              one line per committed build

The *packing key* hashes everything that changes the packed output (the tokenizer's JSON,
`seq_len`, the text field, the chat format and overlong mode, the format version); the
*shard key* hashes the shard's file pieces. A rerun, restart or resize finds the same keys and
reuses the files; a changed tokenizer or `seq_len` gets a new directory.

Format: Arrow IPC (random-access file format) with record batches of about 64 KiB, so a reader
fetches the few batches holding its rows (one range read each on object stores; a memory map
locally) instead of the whole shard. Columns: `tokens`, `doc_ids`, `labels` (fixed-size lists of
int32, `seq_len` long) and `n_real`; positions are re-derived from `doc_ids` on read.

Commit protocol: the data file is written under a temporary name and moved into place (a
rename locally; an atomic copy on object stores, where an object only exists once fully
written); the JSON commit record is written the same way *after* it. A shard is complete only
when the record exists and the data file has the recorded size and a readable footer with the
recorded number of batches; anything else (a crash mid-write, a truncated file) is rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from elastic.data.packing import positions_from_doc_ids
from elastic.data.shards import Shard
from elastic.data.sources import filesystem_for

FORMAT_VERSION = 2  # 2: content encoded as text, special tokens only from templates (issue 58)
BATCH_BYTES = 64 * 2**10  # target size of one record batch: the unit a reader fetches
COMPRESSION = "zstd"      # ~0.1 CPU-s per 4 MiB shard (<5% of tokenizing it); files ~1/6 of raw int32
BUILDS = "builds.jsonl"
PLANS_DIR = "plans"  # beside the packing-key directories: the run's data plans (elastic/data/builder.py)
ARRAY_COLUMNS = ("tokens", "doc_ids", "labels")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def packing_key(plan) -> str:
    """Hash of every setting that changes a shard's packed samples."""
    return _digest({
        "version": FORMAT_VERSION,
        "tokenizer": hashlib.sha256(plan.tokenizer.json.encode()).hexdigest(),
        "eos": plan.tokenizer.eos_id, "pad": plan.tokenizer.pad_id,
        "seq_len": plan.seq_len, "text_field": plan.text_field,
        "chat": dataclasses.asdict(plan.chat) if plan.chat is not None else None,
        "overlong": plan.overlong if plan.chat is not None else None,
        "parse_special_tokens": getattr(plan, "parse_special_tokens", False),
        **({"curate": [list(plan.curate_stages), dataclasses.asdict(plan.curate)]} if getattr(plan, "curate_stages", ()) else {}),
    })


def shard_key(shard: Shard) -> str:
    """Hash of the shard's file pieces (where its bytes come from), not of its position."""
    return _digest([[p.uri, p.format, p.start, p.end, p.size] for p in shard.pieces])


def rows_per_batch(seq_len: int) -> int:
    return max(1, BATCH_BYTES // (4 * len(ARRAY_COLUMNS) * seq_len))


@dataclass(frozen=True)
class ShardMeta:
    """The commit record of one cached shard (what readers need besides the rows)."""

    key: str
    shard_id: int
    samples: int
    tokens: int
    bytes: int
    rows_per_batch: int
    bad_rows: Dict[str, Any] = field(default_factory=dict)
    build: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ShardMeta":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    @property
    def batches(self) -> int:
        return -(-self.samples // self.rows_per_batch)


def _schema(seq_len: int) -> pa.Schema:
    lst = pa.list_(pa.int32(), seq_len)
    return pa.schema([("tokens", lst), ("doc_ids", lst), ("labels", lst), ("n_real", pa.int32())])


def _int32(values: np.ndarray) -> pa.Array:
    # From the buffer: pa.array() on a numpy array imports pandas on first use (~0.25 CPU-s,
    # paid by every fresh build process).
    v = np.ascontiguousarray(values, np.int32).reshape(-1)
    return pa.Array.from_buffers(pa.int32(), len(v), [None, pa.py_buffer(v)])


def encode_shard(arrays: Dict[str, np.ndarray], seq_len: int) -> tuple[bytes, int]:
    """Packed arrays → Arrow IPC file bytes, and the rows per record batch used."""
    rpb = rows_per_batch(seq_len)
    schema = _schema(seq_len)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression=COMPRESSION)) as w:
        n = len(arrays["n_real"])
        for a in range(0, n, rpb):
            b = min(n, a + rpb)
            cols = [pa.FixedSizeListArray.from_arrays(_int32(arrays[c][a:b]), seq_len) for c in ARRAY_COLUMNS]
            cols.append(_int32(arrays["n_real"][a:b]))
            w.write_batch(pa.record_batch(cols, schema=schema))
    return sink.getvalue().to_pybytes(), rpb


def write_atomic(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write `data` under a temporary name, then move it to `path`: a reader never sees half a
    file (on object stores the move is a copy of a complete object)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    with fs.open_output_stream(tmp) as s:
        s.write(data)
    fs.move(tmp, path)


def _maybe_cut(fs: pafs.FileSystem, path: str, data: bytes, shard_id: int, attempt: int) -> None:
    """Fault injection for tests: ELASTIC_FAULT_CACHE_CUT="shard=K" makes the first build
    attempt of shard K write half its file *at the final name* (as a store without atomic
    writes would) and die, like a node lost mid-write."""
    spec = os.environ.get("ELASTIC_FAULT_CACHE_CUT", "")
    kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    if kv and int(kv.get("shard", -1)) == shard_id and attempt == 0:
        with fs.open_output_stream(path) as s:
            s.write(data[: len(data) // 2])
        os._exit(17)


class ShardCache:
    """One packing key's directory of cached shards (local path or pyarrow URI)."""

    def __init__(self, root: str, plan):
        self.root = root.rstrip("/")
        self.seq_len = plan.seq_len
        self.key = packing_key(plan)
        self.uri = f"{self.root}/{self.key}"
        self.fs, self.dir = filesystem_for(self.uri)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def data_path(self, key: str) -> str:
        return f"{self.dir}/shard-{key}.arrow"

    def meta_path(self, key: str) -> str:
        return f"{self.dir}/shard-{key}.json"

    @property
    def builds_log(self) -> str:
        return f"{self.uri}/{BUILDS}"

    # ------------------------------------------------------------ writing (build tasks)

    def commit(self, shard: Shard, arrays: Dict[str, np.ndarray], bad_rows: Dict[str, Any],
               build: Dict[str, Any], attempt: int = 0) -> ShardMeta:
        """Write the shard's samples, then its commit record (see the module docstring)."""
        key = shard_key(shard)
        data, rpb = encode_shard(arrays, self.seq_len)
        self.fs.create_dir(self.dir, recursive=True)
        _maybe_cut(self.fs, self.data_path(key), data, shard.shard_id, attempt)
        write_atomic(self.fs, self.data_path(key), data)
        meta = ShardMeta(key=key, shard_id=shard.shard_id, samples=int(len(arrays["n_real"])),
                         tokens=int(np.asarray(arrays["n_real"]).sum()), bytes=len(data), rows_per_batch=rpb,
                         bad_rows=bad_rows, build={**build, "host": socket.gethostname(), "pid": os.getpid(),
                                                   "time": time.time(), "attempt": attempt})
        write_atomic(self.fs, self.meta_path(key), json.dumps(meta.to_dict()).encode())
        return meta

    # ------------------------------------------------------------ finding complete shards

    def load(self, shard: Shard) -> tuple[Optional[ShardMeta], str]:
        """The shard's commit record if the shard is complete, else (None, why not)."""
        key = shard_key(shard)
        try:
            with self.fs.open_input_stream(self.meta_path(key)) as s:
                d = json.loads(s.read().decode())
        except FileNotFoundError:
            return None, "not built"
        except (OSError, ValueError) as e:
            return None, f"unreadable commit record ({e})"
        if d.get("version") != FORMAT_VERSION:
            return None, f"format version {d.get('version')} != {FORMAT_VERSION}"
        meta = ShardMeta.from_dict(d)
        why = self.check(meta)
        return (meta, "") if not why else (None, why)

    def check(self, meta: ShardMeta) -> str:
        """Why the data file does not match its commit record ("" when it does)."""
        info = self.fs.get_file_info(self.data_path(meta.key))
        if info.type != pafs.FileType.File:
            return "data file missing"
        if info.size != meta.bytes:
            return f"data file has {info.size} bytes, commit record says {meta.bytes}"
        try:
            with self._open(meta.key) as src:
                r = pa.ipc.open_file(src)
                if r.num_record_batches != meta.batches:
                    return f"data file has {r.num_record_batches} batches, commit record says {meta.batches}"
        except (OSError, pa.ArrowInvalid) as e:
            return f"data file unreadable ({str(e).splitlines()[0]})"
        return ""

    def discard(self, meta_key: str) -> None:
        """Remove a shard's commit record (first) and data file, so it is rebuilt."""
        for p in (self.meta_path(meta_key), self.data_path(meta_key)):
            try:
                self.fs.delete_file(p)
            except (FileNotFoundError, OSError):
                pass

    # ------------------------------------------------------------ reading (train workers)

    def _open(self, key: str):
        if self.local:
            return pa.memory_map(self.data_path(key))
        return self.fs.open_input_file(self.data_path(key))

    def reader(self, meta: ShardMeta) -> "ShardReader":
        return ShardReader(self._open(meta.key), meta, self.seq_len)


class ShardReader:
    """Random access to one cached shard's rows (fetches only the batches that hold them)."""

    def __init__(self, source, meta: ShardMeta, seq_len: int):
        self.source = source
        self.meta = meta
        self.seq_len = seq_len
        self.file = pa.ipc.open_file(source)
        self.batches_read = 0

    def rows(self, index: np.ndarray) -> Dict[str, np.ndarray]:
        """Rows `index` (packing indices), in that order: tokens, positions, doc_ids, labels [k, L]
        int32 and n_real [k] int32."""
        index = np.asarray(index, dtype=np.int64)
        L, rpb = self.seq_len, self.meta.rows_per_batch
        out = {c: np.empty((len(index), L), np.int32) for c in ARRAY_COLUMNS}
        out["n_real"] = np.empty(len(index), np.int32)
        which = index // rpb
        for b in np.unique(which):
            rb = self.file.get_batch(int(b))
            self.batches_read += 1
            sel = np.nonzero(which == b)[0]
            local = index[sel] - int(b) * rpb
            for c in ARRAY_COLUMNS:
                flat = rb.column(c).flatten().to_numpy(zero_copy_only=False)
                out[c][sel] = flat.reshape(-1, L)[local]
            out["n_real"][sel] = rb.column("n_real").to_numpy(zero_copy_only=False)[local]
        out["positions"] = positions_from_doc_ids(out["doc_ids"])
        return out

    def close(self) -> None:
        try:
            self.source.close()
        except Exception:
            pass


def build_summary(cache_root: str) -> Dict[str, Any]:
    """What the cache's own records say about a run: per packing key, how many shards were
    committed, how many builds each took (1 = tokenized once), their CPU-seconds (whole build
    task) and `tokenize_cpu_s` (read + tokenize + pack, without writing the cache file)."""
    from collections import Counter

    from elastic.records import read_records

    fs, base = filesystem_for(cache_root)
    try:
        dirs = [i.base_name for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
                if i.type == pafs.FileType.Directory and i.base_name != PLANS_DIR]
    except OSError:
        dirs = []
    out: Dict[str, Any] = {}
    for d in sorted(dirs):
        recs = read_records(f"{cache_root.rstrip('/')}/{d}/{BUILDS}")
        per = Counter(r["key"] for r in recs)
        out[d] = {"shards": len(per), "builds": len(recs), "max_builds_per_shard": max(per.values(), default=0),
                  "rebuilt_shards": sorted(k for k, c in per.items() if c > 1),
                  "cpu_s": sum(r["cpu_s"] for r in recs), "tokens": sum(r["tokens"] for r in recs),
                  "tokenize_cpu_s": sum(r.get("tokenize_cpu_s", 0.0) for r in recs)}
    return out
