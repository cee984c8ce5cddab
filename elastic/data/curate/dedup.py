"""Exact and near-duplicate detection.

Per document (in the per-document pass, any worker): `content_hash` (xxh3-128 of the
normalised text, see text.simplify) and `minhash_bands` (MinHash over word 5-gram shingles,
14 bands x 8 rows = 112 permutations, datatrove's defaults; permutation parameters from a
fixed seed, so every worker computes the same signature).

Global (on the driver, over every document's hashes): `exact_duplicates` and
`near_duplicates` group documents and keep, in each group or LSH connected component, the
document that comes first in the input (smallest `order`): the survivor depends on the input
alone, never on workers, blocks or scheduling.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import xxhash

from elastic.data.curate.text import simplify

MERSENNE = np.uint64((1 << 61) - 1)
MAX32 = np.uint64(0xFFFFFFFF)


def content_hash(text: str) -> bytes:
    return xxhash.xxh3_128_digest(simplify(text).encode("utf-8"))


def shingles(text: str, n: int = 5) -> List[str]:
    words = simplify(text).split()
    if not words:
        return []
    if len(words) < n:
        return [" ".join(words)]
    return [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]


class MinHasher:
    """MinHash signatures and LSH band keys, deterministic in (seed, bands, rows, ngram)."""

    def __init__(self, bands: int = 14, rows: int = 8, ngram: int = 5, seed: int = 1):
        self.bands, self.rows, self.ngram = bands, rows, ngram
        rng = np.random.default_rng(seed)
        n = bands * rows
        self.a = rng.integers(1, int(MERSENNE), size=n, dtype=np.uint64)
        self.b = rng.integers(0, int(MERSENNE), size=n, dtype=np.uint64)

    def signature(self, text: str) -> np.ndarray:
        """uint32[bands*rows]; an empty document has no signature (size 0)."""
        sh = shingles(text, self.ngram)
        if not sh:
            return np.zeros(0, dtype=np.uint32)
        uniq = set(sh)  # the minimum does not depend on the iteration order
        h = np.fromiter((xxhash.xxh32_intdigest(s.encode("utf-8")) for s in uniq), dtype=np.uint64, count=len(uniq))
        with np.errstate(over="ignore"):
            ph = (h[:, None] * self.a[None, :] + self.b[None, :]) % MERSENNE
        return (ph.min(axis=0) & MAX32).astype(np.uint32)

    def band_keys(self, sig: np.ndarray) -> List[int]:
        """One 64-bit key per band (xxh64 of the band's rows), or [] for no signature."""
        if sig.size == 0:
            return []
        r = self.rows
        return [xxhash.xxh64_intdigest(sig[i * r:(i + 1) * r].tobytes(), seed=i) for i in range(self.bands)]


def jaccard_estimate(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b)) if a.size and a.size == b.size else 0.0


def jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = set(shingles(a, n)), set(shingles(b, n))
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def exact_duplicates(orders: Sequence[int], hashes: Sequence[bytes]) -> Dict[int, int]:
    """{order of a duplicate: order of the copy kept} for equal content hashes."""
    first: Dict[bytes, int] = {}
    out: Dict[int, int] = {}
    for o, h in sorted(zip(orders, hashes)):
        if h in first:
            out[o] = first[h]
        else:
            first[h] = o
    return out


def near_duplicates(orders: Sequence[int], bands: np.ndarray) -> Dict[int, int]:
    """{order of a near duplicate: order of its component's survivor}.

    `bands` is uint64[n, B] (a row of LSH band keys per document; documents without a
    signature are left out by the caller). Two documents sharing any (band, key) are joined;
    each connected component keeps its smallest order."""
    orders = np.asarray(orders, dtype=np.int64)
    n = len(orders)
    if n == 0:
        return {}
    idx = np.argsort(orders, kind="stable")
    orders, bands = orders[idx], np.asarray(bands, dtype=np.uint64)[idx]
    parent = np.arange(n)

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for j in range(bands.shape[1]):
        col = bands[:, j]
        o = np.argsort(col, kind="stable")  # ties keep input order
        s = col[o]
        same = np.nonzero(s[1:] == s[:-1])[0]
        for k in same:
            ra, rb = find(int(o[k])), find(int(o[k + 1]))
            if ra != rb:
                # The smaller index (earlier document) is the root: the root is the survivor.
                if ra < rb:
                    parent[rb] = ra
                else:
                    parent[ra] = rb
    out: Dict[int, int] = {}
    for i in range(n):
        r = find(i)
        if r != i:
            out[int(orders[i])] = int(orders[r])
    return out
