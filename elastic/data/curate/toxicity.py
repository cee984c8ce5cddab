"""Word-list toxicity filter: a document is removed ("toxic") when the share of its words that
are on the list exceeds `curate.toxic_threshold` (0: any listed word, as C4's bad-words rule).
The shipped list (badwords_en.py) is a short English profanity/slur list in the spirit of
LDNOOBW; `curate.toxic_words` points at another file (one word or phrase per line)."""

from __future__ import annotations

import re
from typing import FrozenSet

from elastic.data.curate.badwords_en import WORDS
from elastic.data.curate.base import Stage, StageResult, register

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def load_words(path: str) -> FrozenSet[str]:
    with open(path, encoding="utf-8") as f:
        return frozenset(ln.strip().lower() for ln in f if ln.strip() and not ln.startswith("#"))


@register("toxicity")
class Toxicity(Stage):
    loads = True

    def __init__(self, cfg=None, words_file=None, threshold=None):
        super().__init__(cfg)
        path = words_file or getattr(cfg, "toxic_words", "")
        words = load_words(path) if path else frozenset(w.strip().lower() for w in WORDS if w.strip())
        self.words = frozenset(w for w in words if " " not in w)
        self.phrases = tuple(w for w in words if " " in w)
        self.threshold = float(threshold if threshold is not None else getattr(cfg, "toxic_threshold", 0.0))

    def score(self, text: str) -> float:
        low = text.lower()
        toks = _WORD.findall(low)
        if not toks:
            return 0.0
        hits = sum(t in self.words for t in toks) + sum(low.count(p) for p in self.phrases)
        return hits / len(toks)

    def process(self, docs):
        res = StageResult(kept=[])
        for d in docs:
            (res.removed.append((d, "toxic")) if self.score(d["text"]) > self.threshold else res.kept.append(d))
        return res
