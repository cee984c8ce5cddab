"""Gopher quality and repetition rules (Rae et al. 2021, "Scaling Language Models", appendix A,
table A1), with the thresholds datatrove's GopherQualityFilter / GopherRepetitionFilter use."""

from __future__ import annotations

import re
from collections import Counter
from typing import List, Optional, Tuple

from elastic.data.curate.base import Doc, RuleStage, register
from elastic.data.curate.text import is_symbol, split_words

STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])


@register("gopher_quality")
class GopherQuality(RuleStage):
    prefix = "gopher"
    config_key = "gopher_quality"
    RULES = {
        "min_doc_words": 50,             # non-symbol words
        "max_doc_words": 100000,
        "min_mean_word_length": 3,       # characters, over non-symbol words
        "max_mean_word_length": 10,
        "max_hash_word_ratio": 0.1,      # "#" per word
        "max_ellipsis_word_ratio": 0.1,  # "..." or "…" per word
        "max_bullet_lines_ratio": 0.9,   # lines starting with a bullet
        "max_ellipsis_lines_ratio": 0.3,  # lines ending with an ellipsis
        "min_alpha_words_ratio": 0.8,    # words with at least one letter
        "min_stop_words": 2,             # distinct English stop words present
    }

    def check(self, doc: Doc) -> Optional[str]:
        text = doc["text"]
        t, on = self.t, self.on
        words = split_words(text)
        n_words = len(words) or 1
        real = [w for w in words if not is_symbol(w)]
        n_real = len(real)
        if on("min_doc_words") and n_real < t["min_doc_words"]:
            return "min_doc_words"
        if on("max_doc_words") and n_real > t["max_doc_words"]:
            return "max_doc_words"
        mean = sum(map(len, real)) / n_real if n_real else 0.0
        if on("min_mean_word_length") and mean < t["min_mean_word_length"]:
            return "min_mean_word_length"
        if on("max_mean_word_length") and mean > t["max_mean_word_length"]:
            return "max_mean_word_length"
        if on("max_hash_word_ratio") and text.count("#") / n_words > t["max_hash_word_ratio"]:
            return "max_hash_word_ratio"
        if on("max_ellipsis_word_ratio") and (text.count("...") + text.count("…")) / n_words > t["max_ellipsis_word_ratio"]:
            return "max_ellipsis_word_ratio"
        lines = text.splitlines() or [""]
        if on("max_bullet_lines_ratio") and sum(
                s.lstrip().startswith(("•", "-")) for s in lines) / len(lines) > t["max_bullet_lines_ratio"]:
            return "max_bullet_lines_ratio"
        if on("max_ellipsis_lines_ratio") and sum(
                s.rstrip().endswith(("...", "…")) for s in lines) / len(lines) > t["max_ellipsis_lines_ratio"]:
            return "max_ellipsis_lines_ratio"
        if on("min_alpha_words_ratio") and sum(
                any(c.isalpha() for c in w) for w in words) / n_words < t["min_alpha_words_ratio"]:
            return "min_alpha_words_ratio"
        if on("min_stop_words") and len(STOP_WORDS.intersection(w.lower() for w in words)) < t["min_stop_words"]:
            return "min_stop_words"
        return None


def _duplicates(xs: List[str]) -> Tuple[int, int]:
    """(duplicate elements, their characters): every repeat after the first occurrence."""
    seen, n, chars = set(), 0, 0
    for x in xs:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


def _top_ngram_chars(words: List[str], n: int) -> int:
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    g, c = grams.most_common(1)[0]
    return len(g) * c


def _dup_ngram_chars(words: List[str], n: int) -> int:
    """Characters in n-grams that repeat an earlier one, skipping past each repeat (datatrove)."""
    seen, chars, i, end = set(), 0, 0, len(words) - n + 1
    while i < end:
        g = "".join(words[i:i + n])
        if g in seen:
            chars += len(g)
            i += n
        else:
            seen.add(g)
            i += 1
    return chars


_PARA = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


@register("gopher_repetition")
class GopherRepetition(RuleStage):
    prefix = "gopher_rep"
    config_key = "gopher_repetition"
    RULES = {
        "dup_para_frac": 0.3, "dup_para_char_frac": 0.2,
        "dup_line_frac": 0.3, "dup_line_char_frac": 0.2,
        "top_2_gram": 0.20, "top_3_gram": 0.18, "top_4_gram": 0.16,
        "dup_5_gram": 0.15, "dup_6_gram": 0.14, "dup_7_gram": 0.13,
        "dup_8_gram": 0.12, "dup_9_gram": 0.11, "dup_10_gram": 0.10,
    }

    def check(self, doc: Doc) -> Optional[str]:
        text = doc["text"]
        t, on = self.t, self.on
        if not text:
            return "empty"
        paras = _PARA.split(text.strip())
        n, chars = _duplicates(paras)
        if on("dup_para_frac") and n / len(paras) > t["dup_para_frac"]:
            return "dup_para_frac"
        if on("dup_para_char_frac") and chars / len(text) > t["dup_para_char_frac"]:
            return "dup_para_char_frac"
        lines = _LINES.split(text)
        n, chars = _duplicates(lines)
        if on("dup_line_frac") and n / len(lines) > t["dup_line_frac"]:
            return "dup_line_frac"
        if on("dup_line_char_frac") and chars / len(text) > t["dup_line_char_frac"]:
            return "dup_line_char_frac"
        words = split_words(text)
        for k in (2, 3, 4):
            r = f"top_{k}_gram"
            if on(r) and len(words) >= k and _top_ngram_chars(words, k) / len(text) > t[r]:
                return r
        for k in range(5, 11):
            r = f"dup_{k}_gram"
            if on(r) and _dup_ngram_chars(words, k) / len(text) > t[r]:
                return r
        return None
