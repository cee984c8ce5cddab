"""Contamination check: 13-gram overlap between evaluation items and a run's training data.

The criterion is lm-evaluation-harness's decontamination one (Brown et al. 2020, GPT-3 §4):
an item is *contaminated* when at least one of its 13-grams also occurs in the training data.
Per task we report how many items are, and how much of each item's 13-grams the data holds.

Unit: token-level 13-grams with the run's own tokenizer (lm-eval uses word-level 13-grams
of normalized text). The run keeps its training data as tokens only: the packed shard cache
(elastic/data/store.py), whose token ids the model actually trained on; the source text may
be gone, remote, or expensive to re-read. So an item is encoded with the run's
`tokenizer.json` (no special tokens) and its token 13-grams are looked up among the cache's.
Consequences: (1) a 13-token window is shorter than 13 words (about 3 bytes per token for
the stdlib-trained 2048-token BPE; digits are single tokens), so the check flags more than
lm-eval's at the same n. Measured on the 164 HumanEval prompts against 3 shards (1.0M
tokens) of a stdlib-trained run: 8 flagged at n=13, every match a literal run such as
"1, 2, 3, 4, 5, 6, 7"; 2 at n=20, 0 at n=26; 0 with word-level 13-grams over the same
documents' text. Raise `n` with a small-vocabulary tokenizer; (2) no normalization: case
and punctuation count; (3) BPE tokens at an item's first word may differ from the same text inside a training
document (e.g. "def" vs " def"), which can only lose the one or two 13-grams touching the
edges, never the interior ones. For users whose training data is raw text,
:func:`text_ngrams_overlap` does lm-eval's word-level check.

Which tokens count (see elastic/data/packing.py): every real token of a document, never a
padding position (`doc_ids == PAD_DOC`) nor the EOS that ends each document (an item
tokenized without special tokens never contains it). Prompt tokens that carry no loss in SFT
(`labels == IGNORE`) are counted: the model read them, and they are training data. An
n-gram never crosses a document boundary; a document that continues from one packed row
into the next (pretraining splits documents at row ends) is stitched back, so its n-grams
spanning the row cut count too (a row whose last token is a real non-EOS token continues
into the next row: packing ends every document with EOS).

Which shards count: the run's saved data plans (`cache/plans/*.pkl`, written by
elastic/data/builder.py) say which shard keys form the training plan and which the held-out
(`eval`) plan; with `splits="train"` only committed training shards are read (held-out
shards share the packing directory when `eval.source` is set, or are the last
`eval.fraction` of the planned shards). Without readable plans every committed shard is
read, and `info["split_source"]` says so. The plans are pickles: a run directory is trusted
as much as its checkpoints.

Hash: polynomial, mod 2^64, Horner form over the n token ids of a window:
    h(t_0..t_{n-1}) = sum_j t_j * BASE^(n-1-j)  mod 2^64,   BASE = 0x9E3779B97F4A7C15 (odd)
computed with numpy's wrapping uint64 arithmetic (n multiply-adds per position). For a
fixed n this is exact up to hash collisions; a spurious match needs one of roughly
items_ngrams x cache_ngrams pairs to collide, ~1e4 x 1e10 / 2^64 = 5e-6 for a 10B-token cache.

Cost and memory: each cache token is read once and hashed with n multiply-adds; measured
on one core, :func:`contamination` scans 1.0M cache tokens in 0.4 s (Arrow decompression
included; ~1 h per 10B tokens) and :func:`cache_ngrams` in 1.0 s (its np.unique). It streams
the cache in chunks of ~1M tokens and probes each chunk against the (small) set of item
n-grams, so its memory is one chunk (~40 MB) plus the items, whatever the cache size; it
rescans the cache on each call unless given `cache_hashes`. :func:`cache_ngrams` materializes the cache's distinct
n-grams (8 bytes each, at most 8 bytes per token scanned: ~80 MB for the 10M-token stdlib
corpus, 80 GB for 10B tokens), useful to check many task sets against one small cache.
"""

from __future__ import annotations

import json
import pickle
import string
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from elastic.data.packing import PAD_DOC
from elastic.data.sources import filesystem_for
from elastic.data.store import FORMAT_VERSION, PLANS_DIR, ShardMeta, shard_key
from elastic.eval.spec import Doc, TaskSpec

N = 13
BASE = np.uint64(0x9E3779B97F4A7C15)
CHUNK_TOKENS = 2**20  # cache tokens hashed at a time (bounded memory: ~40 bytes per token)
MAX_IDS = 5
SPLITS = ("train", "eval", "all")


# ---------------------------------------------------------------------------- hashing


def ngram_hashes(tokens: np.ndarray, n: int = N) -> np.ndarray:
    """uint64 hash of every n-gram (window of n consecutive ids) of a 1-D int array, in order:
    element i hashes tokens[i:i+n] as sum_j tokens[i+j] * BASE^(n-1-j) mod 2^64 (Horner;
    ids taken as uint64, negative ids wrap). Empty when len(tokens) < n."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    x = np.asarray(tokens)
    if x.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {x.shape}")
    m = len(x) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    x = x.astype(np.int64, copy=False).astype(np.uint64)
    h = x[:m].copy()
    for j in range(1, n):
        h *= BASE
        h += x[j:j + m]
    return h


def _window_ok(real: np.ndarray, brk: np.ndarray, n: int) -> np.ndarray:
    """For each window start p (len - n + 1 of them): every position in [p, p+n) is real and
    no segment starts inside (p, p+n)."""
    m = len(real) - n + 1
    if m <= 0:
        return np.zeros(0, bool)
    cr = np.concatenate([[0], np.cumsum(real, dtype=np.int64)])
    cb = np.concatenate([[0], np.cumsum(brk, dtype=np.int64)])
    p = np.arange(m)
    return (cr[p + n] - cr[p] == n) & (cb[p + n] - cb[p + 1] == 0)


# ---------------------------------------------------------------------------- the run's cache


def _read_json(fs: pafs.FileSystem, path: str) -> Any:
    with fs.open_input_stream(path) as s:
        return json.loads(s.read().decode())


def _read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as s:
        return s.read()


def _run_tokenizer(run_dir: str):
    from tokenizers import Tokenizer

    fs, base = filesystem_for(run_dir.rstrip("/") + "/tokenizer.json")
    try:
        return Tokenizer.from_str(_read_bytes(fs, base).decode())
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir}: no tokenizer.json (is this a run directory?)") from None


def _load_plans(fs: pafs.FileSystem, cache_dir: str, notes: List[str]) -> List[Dict[str, Any]]:
    """The run's saved data plans ({"train": DataPlan, "eval": DataPlan}), oldest first.
    Pickles written by this project's builder (elastic/data/builder.py save_plans)."""
    sel = pafs.FileSelector(f"{cache_dir}/{PLANS_DIR}", allow_not_found=True)
    infos = sorted((i for i in fs.get_file_info(sel) if i.type == pafs.FileType.File and i.path.endswith(".pkl")),
                   key=lambda i: (i.mtime_ns or 0, i.path))
    out = []
    for i in infos:
        try:
            out.append(pickle.loads(_read_bytes(fs, i.path)))
        except Exception as e:  # a plan from an older version of the code
            notes.append(f"unreadable plan {i.base_name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    return out


def _committed(fs: pafs.FileSystem, d: str) -> Tuple[List[ShardMeta], List[str]]:
    """Committed shards of one packing directory (record present, data file of the recorded
    size and number of batches), and the keys of the incomplete ones."""
    good, bad = [], []
    sel = pafs.FileSelector(d, allow_not_found=True)
    for i in fs.get_file_info(sel):
        if i.type != pafs.FileType.File or not i.base_name.startswith("shard-") or not i.base_name.endswith(".json"):
            continue
        key = i.base_name[len("shard-"):-len(".json")]
        try:
            rec = _read_json(fs, i.path)
            if rec.get("version") != FORMAT_VERSION:
                raise ValueError("format version")
            meta = ShardMeta.from_dict(rec)
            data = f"{d}/shard-{key}.arrow"
            info = fs.get_file_info(data)
            if info.type != pafs.FileType.File or info.size != meta.bytes:
                raise ValueError("size")
            with _open(fs, data) as src:
                if pa.ipc.open_file(src).num_record_batches != meta.batches:
                    raise ValueError("batches")
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
            bad.append(key)
            continue
        good.append(meta)
    good.sort(key=lambda m: (m.shard_id, m.key))
    return good, sorted(bad)


def _open(fs: pafs.FileSystem, path: str):
    if isinstance(fs, pafs.LocalFileSystem):
        return pa.memory_map(path)
    return fs.open_input_file(path)


def _select_shards(run_dir: str, splits: str) -> Tuple[pafs.FileSystem, List[Tuple[str, ShardMeta, int]], Dict[str, Any]]:
    """(fs, [(packing dir, meta, eos id)], info) for the shards of `splits`."""
    if splits not in SPLITS:
        raise ValueError(f"splits must be one of {', '.join(SPLITS)}, got {splits!r}")
    cache_uri = run_dir.rstrip("/") + "/cache"
    fs, cache_dir = filesystem_for(cache_uri)
    tok = _run_tokenizer(run_dir)
    tok_str = tok.to_str()
    notes: List[str] = []
    plans = _load_plans(fs, cache_dir, notes)
    from tokenizers import Tokenizer

    # Per packing directory: the plans whose tokenizer is the run's (ids comparable to the items').
    from elastic.data.store import packing_key

    train_keys, eval_keys, dir_eos, foreign_dirs = set(), set(), {}, set()
    for p in plans:
        for name, plan in p.items():
            try:
                same_tok = Tokenizer.from_str(plan.tokenizer.json).to_str() == tok_str
                pk = packing_key(plan)
            except Exception:
                continue
            if not same_tok:
                foreign_dirs.add(pk)
                continue
            dir_eos[pk] = plan.tokenizer.eos_id
            keys = {shard_key(s) for s in plan.shards}
            (train_keys if name == "train" else eval_keys).update(keys)
    both = train_keys & eval_keys
    if both:
        notes.append(f"{len(both)} shard(s) are training shards in one saved plan and held out in another: counted as train")
    eval_keys -= train_keys
    have_plans = bool(train_keys or eval_keys)
    if not have_plans and splits != "all":
        notes.append("no readable data plan in cache/plans: cannot tell training from held-out shards; scanned all")

    tok_cfg_eos = tok.token_to_id("<|endoftext|>")
    dirs = [i for i in fs.get_file_info(pafs.FileSelector(cache_dir, allow_not_found=True))
            if i.type == pafs.FileType.Directory and i.base_name != PLANS_DIR]
    chosen: List[Tuple[str, ShardMeta, int]] = []
    skipped_eval, unplanned, incomplete, skipped_dirs = 0, 0, 0, []
    for di in sorted(dirs, key=lambda i: i.base_name):
        pk = di.base_name
        if (have_plans or pk in foreign_dirs) and pk not in dir_eos:
            skipped_dirs.append(pk)  # no saved plan with the run's tokenizer packed this directory
            continue
        eos = dir_eos.get(pk, tok_cfg_eos if tok_cfg_eos is not None else -1)
        metas, bad = _committed(fs, di.path)
        incomplete += len(bad)
        for m in metas:
            if have_plans and splits != "all":
                in_train, in_eval = m.key in train_keys, m.key in eval_keys
                if not in_train and not in_eval:
                    unplanned += 1
                    if splits == "eval":
                        continue  # unknown shards are assumed trained on (a missed plan file)
                elif (splits == "train") != in_train:
                    skipped_eval += 1
                    continue
            chosen.append((di.path, m, eos))
    if skipped_dirs:
        notes.append(f"skipped packing dir(s) {', '.join(skipped_dirs)}: packed with another tokenizer "
                     "(or by no saved plan), ids not comparable")
    if unplanned and splits == "train":
        notes.append(f"{unplanned} committed shard(s) are in no saved plan: scanned as training data")
    info = {"splits": splits, "split_source": "plans" if have_plans else ("all shards" if splits == "all" else
            "no plans: all shards scanned"), "shards_scanned": len(chosen), "shards_skipped_other_split": skipped_eval,
            "shards_incomplete": incomplete, "notes": notes}
    return fs, chosen, info


def _shard_chunks(fs: pafs.FileSystem, d: str, meta: ShardMeta, eos: int) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A shard's flattened stream in chunks of ~CHUNK_TOKENS: (tokens, real, brk) where real
    marks real non-EOS tokens and brk[i] a segment (document) starting at i. A row boundary
    between two real tokens is a continuation of the same document (no break)."""
    with _open(fs, f"{d}/shard-{meta.key}.arrow") as src:
        r = pa.ipc.open_file(src)
        L = r.schema.field("tokens").type.list_size
        buf_t, buf_d, acc = [], [], 0

        def flush():
            t = np.concatenate(buf_t).reshape(-1)
            dd = np.concatenate(buf_d).reshape(-1)
            real = (dd != PAD_DOC) & (t != eos)
            brk = np.zeros(len(t), bool)
            col = np.arange(len(t)) % L
            brk[1:] = real[1:] & (~real[:-1] | ((col[1:] != 0) & (dd[1:] != dd[:-1])))
            return t, real, brk

        for b in range(r.num_record_batches):
            rb = r.get_batch(b)
            buf_t.append(rb.column("tokens").flatten().to_numpy(zero_copy_only=False))
            buf_d.append(rb.column("doc_ids").flatten().to_numpy(zero_copy_only=False))
            acc += len(buf_t[-1])
            if acc >= CHUNK_TOKENS:
                yield flush()
                buf_t, buf_d, acc = [], [], 0
        if acc:
            yield flush()


def _stream_hashes(fs, chosen, n: int, info: Dict[str, Any]) -> Iterator[np.ndarray]:
    """Valid n-gram hashes of the chosen shards, chunk by chunk (a window spanning two chunks
    of one shard is produced once, from the chunk it ends in)."""
    tokens = 0
    ngrams = 0
    for d, meta, eos in chosen:
        carry: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        for t, real, brk in _shard_chunks(fs, d, meta, eos):
            tokens += int(real.sum())
            if carry is not None:
                t = np.concatenate([carry[0], t])
                real = np.concatenate([carry[1], real])
                brk = np.concatenate([carry[2], brk])
            ok = _window_ok(real, brk, n)
            h = ngram_hashes(t, n)[ok]
            ngrams += len(h)
            k = min(n - 1, len(t))
            carry = (t[len(t) - k:], real[len(t) - k:], brk[len(t) - k:])
            yield h
    info["tokens_scanned"] = tokens
    info["ngrams_scanned"] = ngrams


def cache_ngrams(run_dir: str, n: int = N, splits: str = "train") -> Tuple[np.ndarray, Dict[str, Any]]:
    """Sorted unique uint64 hashes of every n-gram in the run's committed cache shards of
    `splits` ("train": training shards only, per the run's saved plans; "eval": held-out
    shards; "all"), never crossing a document boundary nor touching padding/EOS.

    info: splits, split_source ("plans", or "no plans: all shards scanned"), shards_scanned,
    shards_skipped_other_split, shards_incomplete, tokens_scanned (real tokens read),
    ngrams_scanned, distinct_ngrams, seconds, notes. Memory: 8 bytes per distinct n-gram
    (merged as it goes; peak about twice the result plus one chunk)."""
    t0 = time.time()
    fs, chosen, info = _select_shards(run_dir, splits)
    acc: List[np.ndarray] = []
    merged = np.zeros(0, np.uint64)
    pending = 0
    for h in _stream_hashes(fs, chosen, n, info):
        acc.append(np.unique(h))
        pending += len(acc[-1])
        if pending > max(4 * CHUNK_TOKENS, len(merged)):
            merged = np.unique(np.concatenate([merged, *acc]))
            acc, pending = [], 0
    if acc:
        merged = np.unique(np.concatenate([merged, *acc]))
    info.setdefault("tokens_scanned", 0)
    info.setdefault("ngrams_scanned", 0)
    info["distinct_ngrams"] = int(len(merged))
    info["seconds"] = round(time.time() - t0, 3)
    return merged, info


# ---------------------------------------------------------------------------- items


def item_text(doc: Doc, spec_type: str, target_delimiter: str = " ") -> str:
    """The part of an item whose presence in training data counts as contamination:
    multiple_choice: context + delimiter + gold choice; generation: context + delimiter +
    target; code: the prompt (context); perplexity: the text."""
    if spec_type == "perplexity":
        return doc.text
    if spec_type == "code":
        return doc.context
    if spec_type == "multiple_choice":
        if 0 <= doc.gold < len(doc.choices):
            return doc.context + target_delimiter + doc.choices[doc.gold]
        return doc.context
    if spec_type == "generation":
        return doc.context + target_delimiter + doc.target if doc.target else doc.context
    raise ValueError(f"unknown task type {spec_type!r}")


def _summary(per_item: Sequence[Tuple[str, int, int]]) -> Dict[str, Any]:
    """per_item: (id, n-grams, n-grams found) → the per-task figures."""
    with_ng = [(i, k, f) for i, k, f in per_item if k > 0]
    dirty = [i for i, k, f in with_ng if f > 0]
    return {"items": len(per_item), "items_with_ngrams": len(with_ng), "contaminated": len(dirty),
            "contaminated_fraction": (len(dirty) / len(with_ng)) if with_ng else 0.0,
            "mean_overlap": float(np.mean([f / k for _, k, f in with_ng])) if with_ng else 0.0,
            "contaminated_ids": dirty[:MAX_IDS]}


def contamination(docs_by_task: Mapping[str, Sequence[Doc]], types: Mapping[str, Union[str, TaskSpec]],
                  run_dir: str, n: int = N, splits: str = "train", cache_hashes: Optional[np.ndarray] = None,
                  scan_info: Optional[Dict[str, Any]] = None) -> Dict[str, Dict[str, Any]]:
    """Per task: items, items_with_ngrams (at least n tokens), contaminated (items with at least
    one n-gram in the run's training data), contaminated_fraction (contaminated /
    items_with_ngrams: a shorter item cannot be checked), mean_overlap (over items with
    n-grams, the fraction of the item's n-gram positions found), contaminated_ids (the first
    5, in item order).

    types: task → its type, or its TaskSpec (whose target_delimiter then joins context and
    answer). Items are encoded with the run's tokenizer.json, without special tokens. The
    cache is streamed once (bounded memory, see the module docstring) unless `cache_hashes`
    (from :func:`cache_ngrams`) is given; `scan_info`, if a dict, receives the scan's info."""
    t0 = time.time()
    tok = _run_tokenizer(run_dir)
    ids: Dict[str, List[str]] = {}
    item_h: Dict[str, List[np.ndarray]] = {}
    texts_all: List[str] = []
    order: List[Tuple[str, str]] = []
    for task, docs in docs_by_task.items():
        t = types[task]
        typ, delim = (t.type, t.target_delimiter) if isinstance(t, TaskSpec) else (t, " ")
        for d in docs:
            texts_all.append(item_text(d, typ, delim))
            order.append((task, d.id))
    encs = tok.encode_batch(texts_all, add_special_tokens=False) if texts_all else []
    for (task, did), e in zip(order, encs):
        ids.setdefault(task, []).append(did)
        item_h.setdefault(task, []).append(ngram_hashes(np.asarray(e.ids, np.int64), n))
    every = [h for hs in item_h.values() for h in hs]
    universe = np.unique(np.concatenate(every)) if every else np.zeros(0, np.uint64)
    found = np.zeros(len(universe), bool)
    info: Dict[str, Any]
    if cache_hashes is not None:
        found = np.isin(universe, cache_hashes, assume_unique=True)
        info = {"source": "cache_hashes given", "distinct_ngrams": int(len(cache_hashes))}
    else:
        fs, chosen, info = _select_shards(run_dir, splits)
        if len(universe):
            for h in _stream_hashes(fs, chosen, n, info):
                if not len(h):
                    continue
                pos = np.searchsorted(universe, h)
                np.minimum(pos, len(universe) - 1, out=pos)
                hit = universe[pos] == h
                found[pos[hit]] = True
        else:
            for _ in _stream_hashes(fs, chosen, n, info):
                pass
    info["item_ngrams_distinct"] = int(len(universe))
    info["seconds"] = round(time.time() - t0, 3)
    if scan_info is not None:
        scan_info.update(info)
    out: Dict[str, Dict[str, Any]] = {}
    for task in docs_by_task:
        rows = []
        for did, h in zip(ids.get(task, []), item_h.get(task, [])):
            k = len(h)
            f = int(found[np.searchsorted(universe, h)].sum()) if k else 0
            rows.append((did, k, f))
        out[task] = _summary(rows)
    return out


# ---------------------------------------------------------------------------- raw text, word level

# lm-eval's Janitor (lm_eval/decontamination/janitor.py): str.translate with a table that maps
# ASCII upper case to lower case and deletes string.punctuation (not replaced by a space:
# "don't" -> "dont", "a-b" -> "ab"), then str.split() on whitespace; n-grams are the words
# joined by one space. Non-ASCII letters keep their case, as there.
_JANITOR_TABLE = str.maketrans(string.ascii_lowercase + string.ascii_uppercase, string.ascii_lowercase * 2,
                               string.punctuation)


def normalize_words(s: str) -> List[str]:
    """lm-eval janitor normalization: ASCII lower case, punctuation deleted, whitespace split."""
    return s.translate(_JANITOR_TABLE).split()


def word_ngrams(s: str, n: int = N) -> List[str]:
    w = normalize_words(s)
    return [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]


def text_ngrams_overlap(items: Sequence[str], corpus_texts: Iterable[str], n: int = N) -> Dict[str, Any]:
    """Word-level n-gram contamination of raw-text items against a raw-text corpus (lm-eval's
    janitor normalization, see `normalize_words`). N-grams never span two corpus texts.
    Memory: the items' n-grams only; the corpus is streamed once.

    Returns the per-task figures of :func:`contamination` (contaminated_ids are item indices)
    plus `overlap`: per item, the fraction of its n-grams found (None with no n-gram)."""
    grams = [word_ngrams(s, n) for s in items]
    wanted = {g for gs in grams for g in gs}
    seen = set()
    for text in corpus_texts:
        if len(seen) == len(wanted):
            break
        w = normalize_words(text)
        for i in range(len(w) - n + 1):
            g = " ".join(w[i:i + n])
            if g in wanted:
                seen.add(g)
    rows = [(i, len(gs), sum(g in seen for g in gs)) for i, gs in enumerate(grams)]
    out = _summary(rows)
    out["overlap"] = [(f / k) if k else None for _, k, f in rows]
    return out
