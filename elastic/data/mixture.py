"""Weighted mixtures of sources (e.g. 70% web, 20% code, 10% books), kept exactly across
resumes and resizes.

Each source is its own stream over the shard cache (elastic/data/reader.py: its shards in a
seeded order, epoch after epoch; a small source simply cycles more often). What a mixture adds
is *how many samples of each source global step s takes*, a function of s and the weights
only, never of the world size or of how often the run was interrupted:

    F_k = w_1 + ... + w_k (weights normalised, exact fractions), a_k(n) = floor(n F_k) - floor(n F_{k-1})
    count_k(s) = a_k((s+1) B) - a_k(s B)

so after n samples source k has given a_k(n), which is within one sample of n w_k at every
step (not only on average), and the counts of a step add up to the global batch B. The
step's B samples (source by source, then a permutation seeded by (seed, s)) are split over
ranks like any global batch: rank r takes positions [r B/W, (r+1) B/W).

The cursor is one per source plus the samples consumed; it is saved with every checkpoint
like the single-source cursor. Sample ids stay global: each source's shards carry ids offset
by the shards of the sources before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from elastic.data.cursor import Cursor
from elastic.data.documents import BadRows


def exact_weights(weights: Sequence[float]) -> List[Fraction]:
    """Weights as exact fractions summing to 1 (from their decimal spelling: 0.7 is 7/10)."""
    fr = [Fraction(str(float(w))) for w in weights]
    total = sum(fr)
    if total <= 0 or any(w <= 0 for w in fr):
        raise ValueError(f"mixture weights must be positive, got {list(weights)}")
    return [w / total for w in fr]


def cumulative_counts(weights: Sequence[Fraction], n: int) -> List[int]:
    """a_k(n): samples of each source among the first n of the mixed stream. Sums to n."""
    out, prev, acc = [], 0, Fraction(0)
    for w in weights:
        acc += w
        cur = math.floor(n * acc)
        out.append(cur - prev)
        prev = cur
    return out


def step_counts(weights: Sequence[Fraction], global_batch: int, step: int) -> List[int]:
    """count_k(s): samples of each source in global step `step` (0-based). Sums to the batch."""
    hi = cumulative_counts(weights, (step + 1) * global_batch)
    lo = cumulative_counts(weights, step * global_batch)
    return [h - l for h, l in zip(hi, lo)]


@dataclass(frozen=True)
class MixCursor:
    """One Cursor per source and the mixed samples consumed (= steps x global batch)."""

    sources: Tuple[Cursor, ...]
    consumed: int = 0

    def to_dict(self) -> dict:
        return {"mixture": [c.to_dict() for c in self.sources], "consumed": self.consumed}

    @classmethod
    def from_dict(cls, d: dict, n_sources: int) -> "MixCursor":
        if not d:
            return cls.start(n_sources)
        if "mixture" not in d or len(d["mixture"]) != n_sources:
            raise ValueError(f"the checkpoint's data cursor is not one of a {n_sources}-source mixture: "
                             "data.mixture changed since it was written")
        return cls(tuple(Cursor.from_dict(c) for c in d["mixture"]), int(d["consumed"]))

    @classmethod
    def start(cls, n_sources: int) -> "MixCursor":
        return cls(tuple(Cursor() for _ in range(n_sources)), 0)

    @property
    def epoch(self) -> int:  # what progress lines and the builder's first position read
        return self.sources[0].epoch

    @property
    def shard_pos(self) -> int:
        return self.sources[0].shard_pos


@dataclass
class MixWalk:
    """The positions of one mixed global batch: each source's walk, the batch's order over
    the concatenated source parts, and the cursor after it."""

    walks: List[Any]
    order: np.ndarray        # [B] positions into the concatenation of the sources' parts
    cursor: MixCursor
    segments: Any = None     # (the reader passes `segments` back to read(); here: the walk itself)
    entered: List[int] = field(default_factory=list)


@dataclass
class MixturePlan:
    """The data plans of a mixture's sources (sharing one tokenizer and packing settings) and
    their weights. Exposes the fields jobs read from a single plan."""

    plans: List[Any]
    weights: List[float]
    names: List[str]

    def __getattr__(self, k: str):  # tokenizer, seq_len, report_bad_rows, chat, text_field, ...
        if k in ("plans", "weights", "names"):
            raise AttributeError(k)
        return getattr(self.plans[0], k)

    @property
    def shards(self) -> list:
        return [s for p in self.plans for s in p.shards]

    @property
    def num_shards(self) -> int:
        return sum(p.num_shards for p in self.plans)

    @property
    def files(self) -> int:
        return sum(p.files for p in self.plans)

    @property
    def corpus_bytes(self) -> int:
        return sum(p.corpus_bytes for p in self.plans)

    def estimated_samples_per_epoch(self) -> float:
        return sum(p.estimated_samples_per_epoch() for p in self.plans)

    def store_plans(self, prefix: str = "train") -> Dict[str, Any]:
        """The builder's plans: one stream per source, named `train/<k>`."""
        return {f"{prefix}/{k}": p for k, p in enumerate(self.plans)}


class MixedStream:
    """The mixed stream over one SampleStream per source (the reader's stream interface:
    walk / read / bad_rows / close), so RankBatches serves mixtures unchanged."""

    def __init__(self, streams: List[Any], weights: Sequence[float], seed: int):
        self.streams = streams
        self.weights = exact_weights(weights)
        self.seed = seed
        self.plan = streams[0].plan
        self.rows_read = 0

    def walk(self, cursor: MixCursor, count: int) -> MixWalk:
        step, rem = divmod(cursor.consumed, count)
        if rem:
            raise ValueError(f"mixed cursor at {cursor.consumed} samples is not on a global-batch boundary of {count}")
        counts = step_counts(self.weights, count, step)
        walks = [s.walk(c, n) for s, c, n in zip(self.streams, cursor.sources, counts)]
        order = np.random.default_rng([self.seed, step, 7]).permutation(count)
        w = MixWalk(walks, order, MixCursor(tuple(x.cursor for x in walks), cursor.consumed + count))
        w.segments = w
        return w

    def read(self, w: MixWalk, start: int, stop: int) -> Dict[str, np.ndarray]:
        """Rows at positions [start, stop) of the batch's (permuted) order."""
        sizes = [sum(s.stop - s.start for s in x.segments) for x in w.walks]
        bounds = np.cumsum([0] + sizes)
        want = w.order[start:stop]
        src = np.searchsorted(bounds, want, side="right") - 1
        parts: Dict[int, Dict[str, np.ndarray]] = {}
        for k in sorted(set(src.tolist())):
            mine = np.sort(want[src == k] - bounds[k])
            # contiguous runs of the source's positions, one read each
            cuts = np.flatnonzero(np.diff(mine) != 1) + 1
            rows = [self.streams[k].read(w.walks[k].segments, int(r[0]), int(r[-1]) + 1) for r in np.split(mine, cuts)]
            parts[k] = {key: np.concatenate([r[key] for r in rows]) for key in rows[0]}
            parts[k]["_pos"] = mine + bounds[k]
        # put the rows back in the batch's order
        cat = {key: np.concatenate([parts[k][key] for k in sorted(parts)]) for key in next(iter(parts.values()))}
        where = {int(p): i for i, p in enumerate(cat.pop("_pos"))}
        idx = np.array([where[int(p)] for p in want], dtype=np.int64)
        self.rows_read += stop - start
        return {key: v[idx] for key, v in cat.items()}

    def bad_rows(self, w: MixWalk) -> BadRows:
        out = BadRows(keep=self.plan.report_bad_rows)
        for s, x in zip(self.streams, w.walks):
            out.merge(s.bad_rows(x))
        return out

    def close(self) -> None:
        for s in self.streams:
            s.close()
