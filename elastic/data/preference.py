"""Preference pairs for DPO: rows → tokenized (prompt, chosen, rejected), and the pair cursor.

**Where the pairs live.** Preference datasets are small next to pretraining corpora (thousands
to a few hundred thousand pairs), so the driver reads and tokenizes all of them at plan time
(JSONL or Parquet through pyarrow) and ships them to the workers as three spans into one flat
int32 array (:class:`PairSet`, a few bytes per token). The limit: the tokenized pairs must fit
in the driver's memory and in each worker's (about 4 bytes per token; 100k pairs of 1k tokens
is 400 MB). A dataset beyond that wants a streamed variant (Ray Data, like pretraining).

**Rows** (TRL's preference formats):

- ``prompt``, ``chosen``, ``rejected`` as text: one user turn and two answers;
- ``prompt`` as a message list (system/user/assistant turns) and ``chosen``/``rejected`` as text
  or as message lists ending in the assistant's answer;
- no ``prompt``: ``chosen`` and ``rejected`` are whole conversations that share every message but
  the last (the implicit prompt).

Rendering is SFT's (elastic/data/chat.py): the tokenizer's chat template or the built-in one,
and the answer ends with EOS as SFT taught it. The prompt is tokenized once, the answers on their
own, so the two sequences share the prompt's tokens exactly. A malformed row is counted and
skipped with its file and line; a pair longer than ``data.seq_len`` has both answers cut to fit
(``truncate``) or is skipped (``skip``), and is counted either way.

**Order** (:class:`PairStream`): epochs over the pairs, each a seeded permutation; global step s
takes stream positions [s·B, (s+1)·B) and rank r of W the r-th slice of B/W. A pure function of
the step and the config, so a resumed or resized run trains on the same pairs in the same steps.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from elastic.data.chat import EOS, ChatFormat, RowError, render_segments, tokenize_segments
from elastic.data.documents import NOT_A_ROW, BadRows, json_row
from elastic.data.sources import DataError, filesystem_for, resolve_files

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class PairFormat:
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    # A per-pair number (reward models: how much better chosen is; TRL's `margin` column).
    # "": none. A row whose margin is not a finite number is counted and skipped.
    margin_field: str = ""


@dataclass
class PairSet:
    """Tokenized pairs: ``spans[i] = [[prompt start, end], [chosen ...], [rejected ...]]`` into
    ``ids``. Picklable and compact (what the workers receive)."""

    ids: np.ndarray                                      # int32, all tokens back to back
    spans: np.ndarray                                    # int64 [n, 3, 2]
    where: List[str] = field(default_factory=list)       # file:line per pair (driver only)
    margins: Optional[np.ndarray] = None                 # float32 [n] when the rows carry one

    def __len__(self) -> int:
        return int(self.spans.shape[0])

    def pair(self, i: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = self.spans[i]
        return tuple(self.ids[a:b] for a, b in s)  # type: ignore[return-value]

    def subset(self, idx: Sequence[int]) -> "PairSet":
        parts, spans, where, off = [], [], [], 0
        for i in idx:
            seqs = self.pair(int(i))
            row = []
            for s in seqs:
                row.append([off, off + len(s)])
                parts.append(s)
                off += len(s)
            spans.append(row)
            if self.where:
                where.append(self.where[int(i)])
        ids = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        margins = self.margins[np.asarray(list(idx), np.int64)] if self.margins is not None else None
        return PairSet(ids, np.asarray(spans, np.int64).reshape(-1, 3, 2), where, margins)

    def tokens(self) -> int:
        return int(self.ids.size)

    def digest(self) -> str:
        """SHA-256 of the tokens and spans (identifies the pairs, e.g. for stored reference log-probs)."""
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.spans).tobytes())
        h.update(np.ascontiguousarray(self.ids.astype(np.int32)).tobytes())
        return h.hexdigest()

    @classmethod
    def build(cls, pairs: Sequence[Tuple[Sequence[int], Sequence[int], Sequence[int]]], where: Sequence[str] = (),
              margins: Optional[Sequence[float]] = None) -> "PairSet":
        ids: List[int] = []
        spans = []
        for seqs in pairs:
            row = []
            for s in seqs:
                row.append([len(ids), len(ids) + len(s)])
                ids.extend(int(t) for t in s)
            spans.append(row)
        return cls(np.asarray(ids, np.int32), np.asarray(spans, np.int64).reshape(-1, 3, 2), list(where),
                   np.asarray(margins, np.float32) if margins is not None else None)


# ------------------------------------------------------------------------- rows → messages

def _messages(value: Any, name: str) -> List[Dict[str, str]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowError(f"field {name!r} is neither text nor a list of messages") from None
    if not isinstance(value, list) or not value:
        raise RowError(f"field {name!r} is not a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise RowError(f"{name}[{i}]: expected {{role: system|user|assistant, content: text}}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _is_text(value: Any) -> bool:
    """Plain text, not a JSON-encoded message list (Parquet/JSONL writers sometimes store those)."""
    if not isinstance(value, str):
        return False
    if not value.lstrip().startswith("["):
        return True
    try:
        v = json.loads(value)
    except json.JSONDecodeError:
        return True
    return not (isinstance(v, list) and v and all(isinstance(m, dict) and "role" in m for m in v))


def _answer(value: Any, name: str) -> Tuple[List[Dict[str, str]], str]:
    """An answer field → (messages before the answer, the answer's text)."""
    if _is_text(value):
        ctx, text = [], value
    else:
        msgs = _messages(value, name)
        if msgs[-1]["role"] != "assistant":
            raise RowError(f"field {name!r} does not end with an assistant message")
        ctx, text = msgs[:-1], msgs[-1]["content"]
    if not text.strip():
        raise RowError(f"field {name!r} is empty")
    return ctx, text


def pair_messages(obj: Any, fmt: PairFormat) -> Tuple[List[Dict[str, str]], str, str]:
    """A row → (the conversation before the answer, chosen text, rejected text). RowError names
    the field at fault (one line)."""
    if not isinstance(obj, dict):
        raise RowError("row is not an object")
    for f in (fmt.chosen_field, fmt.rejected_field):
        if obj.get(f) is None:
            raise RowError(f"needs fields {fmt.chosen_field!r} and {fmt.rejected_field!r} (and {fmt.prompt_field!r})")
    c_ctx, chosen = _answer(obj[fmt.chosen_field], fmt.chosen_field)
    r_ctx, rejected = _answer(obj[fmt.rejected_field], fmt.rejected_field)
    if c_ctx != r_ctx:
        raise RowError(f"fields {fmt.chosen_field!r} and {fmt.rejected_field!r} differ before their last message")
    prompt = obj.get(fmt.prompt_field)
    if prompt is None:
        if not c_ctx:
            raise RowError(f"no field {fmt.prompt_field!r}, and {fmt.chosen_field!r} is not a conversation with a prompt")
        context = c_ctx
    elif _is_text(prompt):
        if not prompt.strip():
            raise RowError(f"field {fmt.prompt_field!r} is empty")
        context = [{"role": "user", "content": prompt}] + c_ctx
    else:
        context = _messages(prompt, fmt.prompt_field) + c_ctx
    if chosen == rejected:
        raise RowError(f"fields {fmt.chosen_field!r} and {fmt.rejected_field!r} are the same answer")
    return context, chosen, rejected


# ------------------------------------------------------------------------- messages → tokens

def _split_answer(segments):
    """Rendered segments → (prompt segments, answer segments): the answer is the last run of
    learned segments (trailing unlearned text after it is dropped: it comes after the answer)."""
    segs = list(segments)
    while segs and not segs[-1][1]:
        segs.pop()
    j = len(segs)
    while j > 0 and segs[j - 1][1]:
        j -= 1
    return segs[:j], segs[j:]


def encode_pair(context: List[Dict[str, str]], chosen: str, rejected: str, chat: ChatFormat, tok,
                eos_id: int) -> Tuple[List[int], List[int], List[int]]:
    """(prompt ids, chosen ids, rejected ids); each answer ends with EOS, as SFT learned it."""
    out = []
    prompt: Optional[List[int]] = None
    for text in (chosen, rejected):
        p_segs, a_segs = _split_answer(render_segments(context + [{"role": "assistant", "content": text}], chat))
        p_ids, _ = tokenize_segments(p_segs, tok, eos_id, chat.parse_special_tokens)
        a_ids, _ = tokenize_segments(a_segs + [(EOS, True)], tok, eos_id, chat.parse_special_tokens)
        if prompt is not None and p_ids != prompt:
            raise RowError("the chat template renders the prompt differently for the two answers")
        prompt = p_ids
        out.append(a_ids)
    assert prompt is not None
    return prompt, out[0], out[1]


def fit_pair(prompt: List[int], chosen: List[int], rejected: List[int], seq_len: int,
             overlong: str) -> Optional[Tuple[List[int], List[int], List[int], bool]]:
    """Make prompt + each answer fit in seq_len: cut both answers (`truncate`) or give up
    (`skip`, or a prompt that leaves no room). Returns None when skipped, else the pair and
    whether it was cut."""
    if len(prompt) + max(len(chosen), len(rejected)) <= seq_len:
        return prompt, chosen, rejected, False
    room = seq_len - len(prompt)
    if overlong == "skip" or room < 1:
        return None
    return prompt, chosen[:room], rejected[:room], True


# ------------------------------------------------------------------------------- reading

def _jsonl_rows(uri: str, bad: BadRows) -> Iterator[Tuple[str, Any]]:
    fs, path = filesystem_for(uri)
    with fs.open_input_stream(path) as s:
        data = s.read()
    for n, raw in enumerate(data.split(b"\n"), start=1):
        obj = json_row(raw, f"{uri}:{n}", bad)
        if obj is not NOT_A_ROW:
            yield f"{uri}:{n}", obj


def _parquet_rows(uri: str, fmt: PairFormat) -> Iterator[Tuple[str, Any]]:
    import pyarrow.parquet as pq

    fs, path = filesystem_for(uri)
    pf = pq.ParquetFile(fs.open_input_file(path))
    cols = [c for c in (fmt.prompt_field, fmt.chosen_field, fmt.rejected_field) if c in pf.schema_arrow.names]
    row = 0
    for rg in range(pf.num_row_groups):
        for obj in pf.read_row_group(rg, columns=cols).to_pylist():
            yield f"{uri}:row{row}", obj
            row += 1


def read_pair_rows(source: str, glob: str, fmt_name: str, fmt: PairFormat, bad: BadRows) -> Iterator[Tuple[str, Any]]:
    """(file:line, row) of every JSONL/Parquet row of the source, in file order. DataError for a
    missing source or text files."""
    files = resolve_files(source, glob, fmt_name)
    for f in files:
        if f.format == "jsonl":
            yield from _jsonl_rows(f.uri, bad)
        elif f.format == "parquet":
            yield from _parquet_rows(f.uri, fmt)
        else:
            raise DataError(f"{f.uri}: DPO needs JSONL or Parquet rows (prompt/chosen/rejected), not text files")


def load_pairs(source: str, glob: str, fmt_name: str, fmt: PairFormat, chat: ChatFormat, tokenizer, eos_id: int,
               seq_len: int, overlong: str, keep_examples: int = 5) -> Tuple[PairSet, BadRows]:
    """Read, render and tokenize every pair of a source (driver side). Malformed rows are
    counted and skipped (`bad_json`, `invalid_utf8`, `bad_pair`), as are overlong pairs
    (`too_long` when skipped, `truncated` when cut)."""
    bad = BadRows(keep=keep_examples)
    pairs, where, margins = [], [], []
    for loc, obj in read_pair_rows(source, glob, fmt_name, fmt, bad):
        try:
            margin = _margin(obj, fmt.margin_field) if fmt.margin_field else 0.0
            context, chosen, rejected = pair_messages(obj, fmt)
            p, c, r = encode_pair(context, chosen, rejected, chat, tokenizer, eos_id)
        except RowError as e:
            bad.add("bad_pair", f"{loc} ({e})")
            continue
        fitted = fit_pair(p, c, r, seq_len, overlong)
        if fitted is None:
            bad.add("too_long", f"{loc} ({len(p)} prompt + {max(len(c), len(r))} answer tokens > data.seq_len {seq_len})")
            continue
        if fitted[3]:
            bad.add("truncated", f"{loc} (answers cut to {seq_len - len(p)} tokens)")
        pairs.append(fitted[:3])
        where.append(loc)
        margins.append(margin)
    return PairSet.build(pairs, where, margins if fmt.margin_field else None), bad


def _margin(obj: Dict[str, Any], name: str) -> float:
    import math

    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise RowError(f"field {name!r} is not a finite number ({v!r})")
    return float(v)


# ------------------------------------------------------------------------------- code-opt

def code_opt_pair_rows(problems_dir: str, ids: Sequence[str], rejected: Sequence[str]) -> List[Dict[str, str]]:
    """Preference rows from the shipped problems: the statement (GRPO's and SFT's prompt), the
    fast solution chosen over each of `rejected` ("wrong": solutions/wrong, which fails the
    tests; "reference": the correct but slow reference) that the problem has."""
    from elastic.data.code_opt import _solution, completion_text, prompt_text

    rows = []
    for pid in ids:
        d = Path(problems_dir) / pid
        prompt = prompt_text(d)
        fast = completion_text(*_solution(d / "solutions", "fast"))
        for kind in rejected:
            try:
                lang, src = _solution(d / "solutions", "wrong") if kind == "wrong" else _solution(d, "reference")
            except DataError:
                continue
            rows.append({"prompt": prompt, "chosen": fast, "rejected": completion_text(lang, src), "problem": pid,
                         "rejected_kind": kind})
    return rows


# ------------------------------------------------------------------------------- order

@functools.lru_cache(maxsize=4)
def _pair_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0xD90]).permutation(n)


@dataclass(frozen=True)
class PairStream:
    """Which pairs global step s trains on, at any world size (see the module docstring)."""

    num_pairs: int
    seed: int

    def at(self, position: int) -> int:
        epoch, i = divmod(int(position), self.num_pairs)
        return int(_pair_order(self.num_pairs, self.seed, epoch)[i])

    def step(self, step: int, batch: int) -> List[Tuple[int, int]]:
        """(stream position, pair index) of the `batch` pairs of 0-based step `step`."""
        first = step * batch
        return [(p, self.at(p)) for p in range(first, first + batch)]

    def rank_slice(self, step: int, batch: int, world: int, rank: int) -> List[Tuple[int, int]]:
        """This rank's equal share of the step's pairs (batch divisible by world: checked in the config)."""
        n = batch // world
        return self.step(step, batch)[rank * n:(rank + 1) * n]


def holdout_split(n: int, fraction: float, seed: int) -> Tuple[List[int], List[int]]:
    """(train, held-out) pair indices: a seeded `fraction` of the pairs (at least 1) held out,
    both lists in file order. Used when no held-out source is given."""
    k = max(1, int(round(fraction * n)))
    if n - k < 1:
        raise DataError(f"eval.fraction {fraction}: only {n} pair(s); nothing would be left to train on (set eval.source)")
    held = set(np.random.default_rng([seed, 0xE7A1]).permutation(n)[:k].tolist())
    return [i for i in range(n) if i not in held], sorted(held)
