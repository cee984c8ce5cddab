"""Deterministic shards: the canonical partition of a corpus.

A shard is a fixed list of file pieces of roughly `shard_bytes` raw bytes (several small
files, or a byte range of a large JSONL file, or a run of Parquet row groups). Shards are
planned on the driver from file sizes alone, before anything is read, so the plan is the
same on every restart and at every world size. Documents are packed within a shard; the
data cursor points into the shard sequence, so resuming never re-reads earlier shards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from elastic.data.sources import DataError, SourceFile, filesystem_for


@dataclass(frozen=True)
class Piece:
    """Part of one file: a byte range (text/JSONL) or a row-group range (Parquet)."""

    uri: str
    format: str
    start: int  # byte offset, or first row group
    end: int    # byte offset (exclusive), or last row group (exclusive); -1 = to the end
    size: int   # bytes, for balancing


@dataclass(frozen=True)
class Shard:
    shard_id: int
    pieces: Tuple[Piece, ...] = field(default_factory=tuple)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)


def _pieces_of(f: SourceFile, shard_bytes: int) -> List[Piece]:
    if f.format == "parquet":
        import pyarrow.parquet as pq

        fs, path = filesystem_for(f.uri)
        try:
            md = pq.ParquetFile(fs.open_input_file(path)).metadata
        except Exception as e:
            raise DataError(f"{f.uri}: unreadable Parquet ({e})") from None
        out, start, acc = [], 0, 0
        for rg in range(md.num_row_groups):
            acc += md.row_group(rg).total_byte_size
            if acc >= shard_bytes:
                out.append(Piece(f.uri, f.format, start, rg + 1, acc))
                start, acc = rg + 1, 0
        if start < md.num_row_groups:
            out.append(Piece(f.uri, f.format, start, md.num_row_groups, acc))
        return out
    if f.format == "jsonl" and f.size > shard_bytes:
        return [Piece(f.uri, f.format, s, min(s + shard_bytes, f.size), min(shard_bytes, f.size - s))
                for s in range(0, f.size, shard_bytes)]
    # A text file is one document: never split it.
    return [Piece(f.uri, f.format, 0, -1, f.size)]


def plan_shards(files: List[SourceFile], shard_bytes: int, seed: Optional[int] = None) -> List[Shard]:
    """Group pieces into shards of about `shard_bytes` (a piece is never split).

    With a seed, pieces are grouped in a seeded random order, so every shard mixes files from
    the whole corpus (sorted neighbours tend to be one topic or format); the plan is still a
    pure function of the file list and the seed."""
    pieces = [p for f in files for p in _pieces_of(f, shard_bytes)]
    if seed is not None:
        pieces = [pieces[i] for i in np.random.default_rng([seed, 2]).permutation(len(pieces))]
    return [Shard(i, group) for i, group in enumerate(group_by_size(pieces, shard_bytes))]


def group_by_size(items: Sequence, limit: int) -> List[tuple]:
    """Consecutive runs of `items` (each with a `.size`) of at most `limit` bytes, an item never
    split (one larger than `limit` is a run of its own); order kept."""
    groups: List[tuple] = []
    cur: list = []
    acc = 0
    for it in items:
        if cur and acc + it.size > limit:
            groups.append(tuple(cur))
            cur, acc = [], 0
        cur.append(it)
        acc += it.size
    if cur:
        groups.append(tuple(cur))
    return groups
