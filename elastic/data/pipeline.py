"""The Ray Data pipeline: shards → documents → tokenize + pack → samples with global ids.

Driver side, :func:`prepare_data_plan` resolves the source, plans shards and loads or
trains the tokenizer (all errors surface here, before any worker starts). :func:`build_dataset`
turns the plan plus a :class:`Cursor` into a lazy, order-preserving Ray Dataset that starts
exactly at the cursor. :class:`DatasetFactory` is what the trainer hands to Ray Train's
`datasets=`: Ray Train calls it on every worker-group (re)start, so an elastic restart streams
from the latest checkpoint's cursor. :class:`GlobalBatches` assembles exact global batches on
a worker, continuing into a fresh dataset if the stream runs out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa

from elastic.data.chat import ChatFormat, plain_text, render_segments, tokenize_segments
from elastic.data.cursor import Cursor, sample_id, sample_order, shard_order
from elastic.data.documents import BadRows, read_shard
from elastic.data.packing import pack_documents
from elastic.data.shards import Shard, plan_shards
from elastic.data.sources import DataError, SourceFile, resolve_files
from elastic.data.tokenizer import TokenizerInfo, from_json, load_or_train

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("tokens", "positions", "doc_ids", "labels", "n_real", "sample_id", "epoch", "shard_pos", "offset", "shard_samples", "bad_rows")


@dataclass
class DataPlan:
    """Everything a worker needs to rebuild the exact same stream, picklable and small."""

    shards: List[Shard]
    tokenizer: TokenizerInfo
    seq_len: int
    text_field: str
    seed: int
    shuffle: bool
    tokenize_cpus: float = 1.0
    report_bad_rows: int = 5
    corpus_bytes: int = 0
    files: int = 0
    # SFT: rows are conversations rendered with this format; loss on assistant tokens only;
    # examples are never split across samples; one longer than seq_len is truncated or skipped.
    chat: Optional[ChatFormat] = None
    overlong: str = "truncate"

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def estimated_samples_per_epoch(self) -> float:
        return self.corpus_bytes / max(self.tokenizer.bytes_per_token, 1e-3) / self.seq_len


def _tokenizer_sample(files: List[SourceFile], shards: List[Shard], text_field: str, sample_bytes: int,
                      chat: Optional[ChatFormat] = None) -> List[str]:
    """Documents from evenly spaced shards, up to `sample_bytes` (deterministic)."""
    out: List[str] = []
    acc = 0
    if not shards:
        return out
    step = max(1, len(shards) // max(1, int(sample_bytes / max(1, shards[0].size)) or 1))
    for s in shards[::step]:
        docs, _ = read_shard(s, text_field, chat=chat)
        for d in docs:
            if chat is not None:
                d = plain_text(json.loads(d))
            out.append(d)
            acc += len(d)
            if acc >= sample_bytes:
                return out
    return out


def prepare_data_plan(source: str, glob: str, fmt: str, text_field: str, tokenizer: str, vocab_size: int,
                      tokenizer_sample_mb: float, seq_len: int, shard_mb: float, seed: int, shuffle: bool,
                      tokenizer_save_path: str = "", tokenize_cpus: float = 1.0, report_bad_rows: int = 5,
                      chat: Optional[ChatFormat] = None, overlong: str = "truncate") -> DataPlan:
    """Driver-side planning; raises DataError (one line) for missing or unreadable input.
    With `chat` (SFT) rows are conversations; the format's template and special tokens are
    completed from the tokenizer (its own chat_template wins over the built-in one)."""
    files = resolve_files(source, glob, fmt)
    if chat is not None:
        text_files = [f.uri for f in files if f.format == "text"]
        if text_files:
            raise DataError(f"{text_files[0]}: SFT needs JSONL or Parquet rows (prompt/completion or messages), not text files")
    shards = plan_shards(files, max(1, int(shard_mb * 2**20)), seed if shuffle else None)
    sample = _tokenizer_sample(files, shards, text_field, int(tokenizer_sample_mb * 2**20), chat) if not tokenizer else []
    if not tokenizer and not sample:
        raise DataError(f"data.source {source}: no valid documents found (every row was malformed or empty)")
    tok = load_or_train(tokenizer, tokenizer_save_path, sample, vocab_size)
    if tok.vocab_size > vocab_size:
        raise DataError(f"data.vocab_size {vocab_size}: the tokenizer has {tok.vocab_size} tokens; raise data.vocab_size")
    if chat is not None:
        chat = dataclasses.replace(chat, chat_template=chat.chat_template or tok.chat_template,
                                   eos_token=tok.eos_token, bos_token=tok.bos_token)
    return DataPlan(shards=shards, tokenizer=tok, seq_len=seq_len, text_field=text_field, seed=seed, shuffle=shuffle,
                    tokenize_cpus=tokenize_cpus, report_bad_rows=report_bad_rows,
                    corpus_bytes=sum(f.size for f in files), files=len(files), chat=chat, overlong=overlong)


# ---------------------------------------------------------------- Ray Data stages


def _read_documents(plan: DataPlan, shard: Shard, epoch: int, shard_pos: int, skip: int) -> pa.Table:
    docs, bad = read_shard(shard, plan.text_field, plan.report_bad_rows, plan.chat)
    n = max(len(docs), 1)  # an all-bad shard still carries its bad-row record downstream
    return pa.table({
        "text": pa.array(docs if docs else [None], pa.large_string()),
        "shard_id": pa.array([shard.shard_id] * n, pa.int64()),
        "epoch": pa.array([epoch] * n, pa.int64()),
        "shard_pos": pa.array([shard_pos] * n, pa.int64()),
        "skip": pa.array([skip] * n, pa.int64()),
        # Bad rows are reported once per shard and epoch, and not again when resuming inside it.
        "bad_rows": pa.array([json.dumps(bad.to_dict()) if (bad.total and skip == 0) else ""] + [""] * (n - 1), pa.string()),
    })


def tokenize_and_pack(batch: Dict[str, np.ndarray], plan: DataPlan) -> Dict[str, np.ndarray]:
    """map_batches stage: one whole shard in, its packed samples out (in order). Plain tasks
    (no actor pool): the tokenizer is parsed once per worker process and cached."""
    out: Dict[str, list] = {k: [] for k in SAMPLE_COLUMNS}
    shard_ids = batch["shard_id"]
    # Robust to Ray Data coalescing blocks: group rows by (epoch, shard_pos) in order.
    keys = list(zip(batch["epoch"].tolist(), batch["shard_pos"].tolist()))
    bounds = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    tok = from_json(plan.tokenizer.json)
    for a, b in zip(bounds[:-1], bounds[1:]):
        texts = [t for t in batch["text"][a:b].tolist() if t is not None]
        skip = int(batch["skip"][a])
        bad = next((s for s in batch["bad_rows"][a:b].tolist() if s), "")
        if plan.chat is None:
            ids = [e.ids for e in tok.encode_batch(texts)] if texts else []
            packed = pack_documents(ids, plan.seq_len, plan.tokenizer.eos_id, plan.tokenizer.pad_id)
        else:
            packed, long_rows = _tokenize_conversations(texts, plan, tok)
            if long_rows.total and skip == 0:  # reported once per shard and epoch, like bad rows
                merged = BadRows.from_dict(json.loads(bad)) if bad else BadRows()
                merged.merge(long_rows)
                bad = json.dumps(merged.to_dict())
        n = len(packed["n_real"])
        # Consecutive samples of a shard come from the same few files: visit them in a seeded
        # order so a global batch mixes the whole shard. `offset` is the position in that
        # order (what the cursor counts); the sample id keeps the packing index (stable).
        order = sample_order(n, plan.seed, keys[a][0], int(shard_ids[a]), plan.shuffle)
        for j, off in enumerate(range(min(skip, n), n)):
            i = int(order[off])
            for k in ("tokens", "positions", "doc_ids", "labels", "n_real"):
                out[k].append(packed[k][i])
            out["sample_id"].append(sample_id(int(shard_ids[a]), i))
            out["epoch"].append(keys[a][0])
            out["shard_pos"].append(keys[a][1])
            out["offset"].append(off)
            out["shard_samples"].append(n)
            out["bad_rows"].append(bad if j == 0 else "")
    L = plan.seq_len
    res = {}
    for k in SAMPLE_COLUMNS:
        if k in ("tokens", "positions", "doc_ids", "labels"):
            res[k] = np.stack(out[k]).astype(np.int32) if out[k] else np.zeros((0, L), np.int32)
        elif k == "bad_rows":
            res[k] = np.array(out[k], dtype=object)
        else:
            res[k] = np.array(out[k], dtype=np.int64)
    return res


def _tokenize_conversations(texts: List[str], plan: DataPlan, tok) -> tuple:
    """SFT: render each conversation, tokenize its segments, fit it into seq_len (truncate or
    skip, counted), and pack without splitting an example across samples."""
    eos = plan.tokenizer.eos_id
    ids_all, masks, long_rows = [], [], BadRows(keep=plan.report_bad_rows)
    for i, t in enumerate(texts):
        ids, mask = tokenize_segments(render_segments(json.loads(t), plan.chat), tok.encode_batch, eos)
        if len(ids) + 1 > plan.seq_len:
            if plan.overlong == "skip":
                long_rows.add("too_long", f"conversation {i} of its shard ({len(ids) + 1} tokens > data.seq_len {plan.seq_len})")
                continue
            long_rows.add("truncated", f"conversation {i} of its shard ({len(ids) + 1} tokens > data.seq_len {plan.seq_len})")
            # Cut to fit with its EOS; a cut answer must not teach the model to stop there.
            ids, mask = ids[:plan.seq_len - 1], mask[:plan.seq_len - 1] + [False]
        if not any(mask[:len(ids)]):
            continue  # nothing left to learn (e.g. the completion was cut off entirely)
        ids_all.append(ids)
        masks.append(mask)
    return pack_documents(ids_all, plan.seq_len, eos, plan.tokenizer.pad_id, masks, split_documents=False), long_rows


def build_dataset(plan: DataPlan, cursor: Cursor, epochs: int = 1):
    """A lazy Ray Dataset of packed samples starting exactly at `cursor`, spanning `epochs`."""
    import ray.data
    from ray.data import ReadTask
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource

    tasks_spec = []
    for e in range(cursor.epoch, cursor.epoch + max(1, epochs)):
        order = shard_order(plan.num_shards, e, plan.seed, plan.shuffle)
        first = cursor.shard_pos if e == cursor.epoch else 0
        for pos in range(first, plan.num_shards):
            skip = cursor.offset if (e == cursor.epoch and pos == cursor.shard_pos) else 0
            tasks_spec.append((plan.shards[int(order[pos])], e, pos, skip))

    class ShardDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> Optional[int]:
            return sum(s.size for s, *_ in tasks_spec)

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> List[ReadTask]:
            return [ReadTask((lambda s=s, e=e, p=p, k=k: [_read_documents(plan, s, e, p, k)]),
                             BlockMetadata(num_rows=None, size_bytes=s.size, input_files=None, exec_stats=None))
                    for s, e, p, k in tasks_spec]

    ds = ray.data.read_datasource(ShardDatasource(), override_num_blocks=max(1, len(tasks_spec)))
    return ds.map_batches(tokenize_and_pack, fn_kwargs={"plan": plan}, batch_size=None, batch_format="numpy",
                          num_cpus=plan.tokenize_cpus, concurrency=2, zero_copy_batch=True)


def configure_data_context(max_buffer_bytes: int = 64 * 2**20) -> None:
    """Settings every stream needs: strict order (the data order is part of the contract), no
    progress bars in logs, and a bounded read-ahead per stream (each train worker runs one)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(object_store_memory=max_buffer_bytes)


def epochs_needed(plan: DataPlan, cursor: Cursor, samples_needed: int) -> int:
    """Epochs to plan from `cursor` so the stream very likely covers `samples_needed` samples
    (estimated from bytes per token; GlobalBatches continues the stream if it falls short)."""
    per_epoch = max(1.0, plan.estimated_samples_per_epoch())
    return max(1, math.ceil(samples_needed * 1.25 / per_epoch) + 1)


@dataclass
class DatasetFactory:
    """Called by Ray Train on every worker-group start (`datasets={"train": factory}`).

    `cursor_fn` returns the data position of the checkpoint the workers will resume from
    (the train layer knows where checkpoints live; data does not)."""

    plan: DataPlan
    cursor_fn: Callable[[], Cursor]
    samples_total: int

    def __call__(self):
        configure_data_context()
        cur = self.cursor_fn()
        log.info("data stream starts at epoch %d shard %d offset %d (%d samples consumed)", cur.epoch, cur.shard_pos, cur.offset, cur.consumed)
        return build_dataset(self.plan, cur, epochs_needed(self.plan, cur, max(0, self.samples_total - cur.consumed)))


# ---------------------------------------------------------------- worker side


class GlobalBatches:
    """Exact global batches of `global_batch` samples from an ordered stream.

    `first` is the iterator Ray Train gave this worker (may be None); `make_dataset(cursor)`
    builds a continuation when the stream runs out or when `first` does not start at `cursor`.
    Every worker sees every sample and takes its rank's slice, so the split never depends on
    how Ray Data scheduled blocks."""

    def __init__(self, first, make_dataset: Callable[[Cursor], object], cursor: Cursor, global_batch: int,
                 num_shards: int, prefetch_batches: int = 2):
        self.make_dataset = make_dataset
        self.cursor = cursor
        self.B = global_batch
        self.num_shards = num_shards
        self.prefetch = prefetch_batches
        self._it: Optional[Iterator] = self._batches(first) if first is not None else None
        self._buf: Optional[Dict[str, np.ndarray]] = None
        self.bad_rows = BadRows()
        self.continuations = 0
        self.skipped_on_seek = 0
        self._checked_start = first is None
        # Position after the last row pulled from a stream (buffered rows included): where a
        # continuation must start so that no row is repeated.
        self._pulled = cursor

    def _batches(self, it) -> Iterator[Dict[str, np.ndarray]]:
        return iter(it.iter_batches(batch_size=self.B, batch_format="numpy", prefetch_batches=self.prefetch))

    def _next_chunk(self) -> Dict[str, np.ndarray]:
        while True:
            if self._it is None:
                self.continuations += 1
                self._it = self._batches(self.make_dataset(self._pulled))
                self._checked_start = True
                self._rows_in_stream = 0
            try:
                chunk = next(self._it)
            except StopIteration:
                self._it = None
                if getattr(self, "_rows_in_stream", 1) == 0:
                    # A whole stream (at least one full epoch) without a sample: waiting longer
                    # would loop forever.
                    raise RuntimeError("data: a full pass over the data produced no samples (every row malformed, "
                                       "or every conversation too long for data.seq_len with nothing left to learn)")
                continue
            self._rows_in_stream = getattr(self, "_rows_in_stream", 0) + len(chunk["sample_id"])
            if not self._checked_start:
                chunk = self._align_start(chunk)
                if chunk is None:
                    continue
            if len(chunk["sample_id"]):
                i = len(chunk["sample_id"]) - 1
                self._pulled = self._pulled.after(int(chunk["epoch"][i]), int(chunk["shard_pos"][i]), int(chunk["offset"][i]),
                                                  int(chunk["shard_samples"][i]), self.num_shards, 0)
            return chunk

    def _align_start(self, chunk):
        """The given stream must start at our cursor; drop rows before it or rebuild if it is ahead."""
        want = self.cursor.key()
        keys = list(zip(chunk["epoch"].tolist(), chunk["shard_pos"].tolist(), chunk["offset"].tolist()))
        if keys and keys[0] == want:
            self._checked_start = True
            return chunk
        if keys and keys[0] < want:
            idx = next((i for i, k in enumerate(keys) if k >= want), None)
            if idx is not None and keys[idx] == want:
                self.skipped_on_seek += idx
                self._checked_start = True
                return {k: v[idx:] for k, v in chunk.items()}
            if idx is None:
                self.skipped_on_seek += len(keys)
                return None
        log.warning("dataset stream starts at %s, not at the checkpoint cursor %s: rebuilding from the cursor", keys[:1], want)
        self._checked_start = True
        self._it = self._batches(self.make_dataset(self.cursor))
        return None

    def take_bad_rows(self) -> BadRows:
        """Malformed rows met since the last call (each shard's record arrives with its first sample)."""
        out, self.bad_rows = self.bad_rows, BadRows(keep=self.bad_rows.keep)
        return out

    def next(self) -> Dict[str, np.ndarray]:
        """The next global batch (exactly B rows) and advance the cursor past it."""
        parts, have = [], 0
        if self._buf is not None:
            parts.append(self._buf)
            have = len(self._buf["sample_id"])
            self._buf = None
        while have < self.B:
            c = self._next_chunk()
            parts.append(c)
            have += len(c["sample_id"])
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if have > self.B:
            self._buf = {k: v[self.B:] for k, v in batch.items()}
            batch = {k: v[:self.B] for k, v in batch.items()}
        for s in batch["bad_rows"].tolist():
            if s:
                self.bad_rows.merge(BadRows.from_dict(json.loads(s)))
        i = self.B - 1
        self.cursor = self.cursor.after(int(batch["epoch"][i]), int(batch["shard_pos"][i]), int(batch["offset"][i]),
                                        int(batch["shard_samples"][i]), self.num_shards, self.cursor.consumed + self.B)
        return batch
