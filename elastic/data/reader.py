"""Worker side of the shard cache: global step s's samples for this rank, and nothing else.

The stream is the one of elastic/data/cursor.py: epochs of shards in a seeded order, each
shard's samples in a seeded order. Global step s trains on stream positions [s·B, (s+1)·B);
rank r of W takes positions [s·B + r·B/W, s·B + (r+1)·B/W). Mapping positions to cached rows
needs only each shard's sample count (its commit record, from the builder), so a worker walks
the whole global batch on metadata, reads only its own rows from the cache files, and every
rank advances the same cursor. A shard's malformed-row record is counted by the batch whose
walk enters the shard (offset 0): once per epoch on every rank, and not again when a resume
lands inside the shard.

Seeking costs the same however far the run got: the walk starts at the checkpoint's cursor
and never looks at an earlier shard. A bounded prefetch thread reads the next
`prefetch_steps` batches while the current one trains, and tells the builder where the
stream is so tokenization stays `build_ahead` shards ahead.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from elastic.data.cursor import Cursor, sample_id, sample_order, shard_order
from elastic.data.documents import BadRows
from elastic.data.sources import DataError
from elastic.data.store import ShardCache, ShardMeta, ShardReader

log = logging.getLogger(__name__)

ROW_KEYS = ("tokens", "positions", "doc_ids", "labels", "n_real")


@dataclass
class Segment:
    """A run of consecutive stream positions inside one shard: offsets [start, stop)."""

    epoch: int
    shard_pos: int
    index: int        # into plan.shards
    start: int
    stop: int
    samples: int      # the shard's sample count


@dataclass
class Walk:
    """The stream positions of one global batch, the cursor after them, and the shards the
    walk entered at their first position (whose bad rows this batch counts)."""

    segments: List[Segment]
    cursor: Cursor
    entered: List[int] = field(default_factory=list)  # plan.shards indices


class SampleStream:
    """One plan's stream over the cache: shard commit records (memoised), the seeded orders,
    walking positions and reading rows. `builder` is the run's StoreBuilder actor handle."""

    def __init__(self, plan, name: str, builder, cache_root: str, open_files: int = 8):
        self.plan = plan
        self.name = name
        self.builder = builder
        self.cache = ShardCache(cache_root, plan)
        self.metas: Dict[int, ShardMeta] = {}
        self._orders: Dict[int, np.ndarray] = {}
        self._perms: "OrderedDict[Tuple[int, int], np.ndarray]" = OrderedDict()
        self._readers: "OrderedDict[int, ShardReader]" = OrderedDict()
        self._open_files = open_files
        self._lock = threading.Lock()
        self.rows_read = 0
        self.files_opened: List[int] = []  # plan.shards indices, in the order their files were opened

    # ------------------------------------------------------------ metadata

    def shard_index(self, epoch: int, shard_pos: int) -> int:
        o = self._orders.get(epoch)
        if o is None:
            o = self._orders[epoch] = shard_order(self.plan.num_shards, epoch, self.plan.seed, self.plan.shuffle)
            if len(self._orders) > 4:
                self._orders.pop(min(self._orders))
        return int(o[shard_pos])

    def meta(self, index: int) -> ShardMeta:
        m = self.metas.get(index)
        if m is None:
            import ray

            m = self.metas[index] = ray.get(self.builder.meta.remote(self.name, index))
        return m

    def announce(self, epoch: int, shard_pos: int) -> None:
        """Tell the builder where the stream is (it keeps the next shards in flight)."""
        self.builder.ahead.remote(self.name, epoch, shard_pos)

    def order(self, epoch: int, index: int, n: int) -> np.ndarray:
        k = (epoch, index)
        p = self._perms.get(k)
        if p is None:
            p = self._perms[k] = sample_order(n, self.plan.seed, epoch, self.plan.shards[index].shard_id, self.plan.shuffle)
            if len(self._perms) > 16:
                self._perms.popitem(last=False)
        return p

    def walk(self, cursor: Cursor, count: int, epoch_end: bool = False) -> Walk:
        """The next `count` positions from `cursor` (fewer if `epoch_end` and the epoch ends)."""
        e, p, o = cursor.epoch, cursor.shard_pos, cursor.offset
        n_shards = self.plan.num_shards
        segs: List[Segment] = []
        entered: List[int] = []
        need, empty = count, 0
        first = True
        while need > 0:
            idx = self.shard_index(e, p)
            if o == 0:
                entered.append(idx)
            if o == 0 or first:
                self.announce(e, p)
            first = False
            n = self.meta(idx).samples
            take = min(need, n - o)
            if take > 0:
                segs.append(Segment(e, p, idx, o, o + take, n))
                need -= take
                o += take
                empty = 0
            else:
                empty += 1
                if empty > n_shards:
                    raise DataError(f"data.source: no shard of the plan yields a sample (epoch {e})")
            if o >= n:
                p, o = p + 1, 0
                if p == n_shards:
                    e, p = e + 1, 0
                    if epoch_end:
                        break
        return Walk(segs, Cursor(e, p, o, cursor.consumed + (count - need)), entered)

    def bad_rows(self, walk: Walk) -> BadRows:
        out = BadRows(keep=self.plan.report_bad_rows)
        for idx in walk.entered:
            d = self.meta(idx).bad_rows
            if d and d.get("counts"):
                out.merge(BadRows.from_dict(d))
        return out

    # ------------------------------------------------------------ rows

    def _reader(self, index: int) -> ShardReader:
        r = self._readers.get(index)
        if r is None:
            r = self._readers[index] = self.cache.reader(self.meta(index))
            self.files_opened.append(index)
            if len(self._readers) > self._open_files:
                self._readers.popitem(last=False)[1].close()
        else:
            self._readers.move_to_end(index)
        return r

    def _read(self, index: int, rows: np.ndarray) -> Dict[str, np.ndarray]:
        """Rows of one shard; a file found unreadable is rebuilt by the builder and read again."""
        import pyarrow as pa
        import ray

        try:
            return self._reader(index).rows(rows)
        except (OSError, pa.ArrowInvalid) as e:
            log.warning("cache shard %d unreadable (%s): asking the builder to rebuild it", index, e)
            old = self._readers.pop(index, None)
            if old is not None:
                old.close()
            self.metas[index] = ray.get(self.builder.rebuild.remote(self.name, index, str(e).splitlines()[0]))
            return self._reader(index).rows(rows)

    def read(self, segments: List[Segment], start: int, stop: int) -> Dict[str, np.ndarray]:
        """The rows at positions [start, stop) of the concatenated segments, in order, with
        their global sample ids."""
        parts: List[Dict[str, np.ndarray]] = []
        ids: List[np.ndarray] = []
        base = 0
        for s in segments:
            a, b = max(start, base), min(stop, base + s.stop - s.start)
            if a < b:
                offs = np.arange(s.start + a - base, s.start + b - base)
                rows = self.order(s.epoch, s.index, s.samples)[offs]
                parts.append(self._read(s.index, rows))
                ids.append(np.array([sample_id(self.plan.shards[s.index].shard_id, int(i)) for i in rows], np.int64))
            base += s.stop - s.start
        self.rows_read += stop - start
        if not parts:
            L = self.plan.seq_len
            empty = {k: np.zeros((0, L), np.int32) for k in ROW_KEYS if k != "n_real"}
            return {**empty, "n_real": np.zeros(0, np.int32), "sample_id": np.zeros(0, np.int64)}
        out = {k: np.concatenate([p[k] for p in parts]) for k in ROW_KEYS}
        out["sample_id"] = np.concatenate(ids)
        return out

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()


@dataclass
class RankBatch:
    """This rank's rows of one global batch, plus what every rank must agree on."""

    rows: Dict[str, np.ndarray]   # tokens, positions, doc_ids, labels, n_real, sample_id
    cursor: Cursor                # after this global batch
    bad_rows: BadRows             # of the shards this global batch entered


class RankBatches:
    """This rank's slice of consecutive global batches from `cursor`, read `prefetch_steps`
    batches ahead by a background thread (bounded: at most that many batches in memory)."""

    def __init__(self, stream: SampleStream, cursor: Cursor, global_batch: int, rank: int, world: int,
                 prefetch_steps: int = 2):
        if global_batch % world:
            raise ValueError(f"global batch {global_batch} cannot be split over {world} ranks")
        self.stream = stream
        self.cursor = cursor  # after the last batch handed out by next()
        self.B, self.rank, self.world = global_batch, rank, world
        self.per_rank = global_batch // world
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, prefetch_steps))
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._prefetch = prefetch_steps > 0

    def _produce(self, cursor: Cursor) -> Tuple[RankBatch, Cursor]:
        # Fault injection (tests, the report's input-bound case): ELASTIC_FAULT_DATA_DELAY_S
        # seconds more per batch, as a slow filesystem or an overloaded CPU node would add.
        delay = float(os.environ.get("ELASTIC_FAULT_DATA_DELAY_S", "0") or 0)
        if delay > 0:
            time.sleep(delay)
        # ELASTIC_FAULT_DATA_HOLD=<path>: no batch while that file exists. The elastic drill
        # (elastic/launch/drill.py) holds a run this way while Ray adds a node and resizes it,
        # which takes longer than a tiny model's whole run on a quiet machine.
        hold = os.environ.get("ELASTIC_FAULT_DATA_HOLD")
        while hold and os.path.exists(hold) and not self._stop.is_set():
            time.sleep(0.1)
        w = self.stream.walk(cursor, self.B)
        a = self.rank * self.per_rank
        rows = self.stream.read(w.segments, a, a + self.per_rank)
        return RankBatch(rows, w.cursor, self.stream.bad_rows(w)), w.cursor

    def _run(self) -> None:
        cur = self.cursor
        try:
            while not self._stop.is_set():
                item, cur = self._produce(cur)
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, raised in next()
            self._q.put(e)

    def next(self) -> RankBatch:
        """The next global batch's rows for this rank; advances `cursor` past the global batch."""
        if not self._prefetch:
            item, _ = self._produce(self.cursor)
        else:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rank-batches", daemon=True)
                self._thread.start()
            item = self._q.get()
            if isinstance(item, BaseException):
                raise item
        self.cursor = item.cursor
        return item

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.stream.close()


def first_samples(stream: SampleStream, n: int) -> Dict[str, np.ndarray]:
    """The first `n` samples of epoch 0 (fewer if the epoch has fewer): a held-out set."""
    w = stream.walk(Cursor(), n, epoch_end=True)
    total = sum(s.stop - s.start for s in w.segments)
    return stream.read(w.segments, 0, total)
