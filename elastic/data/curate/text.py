"""Text helpers shared by the rule stages: one word splitter and sentence splitter (regex,
language-independent), so every rule counts words the same way on every worker."""

from __future__ import annotations

import re
import unicodedata
from typing import List

# Words and runs of punctuation (punctuation runs are "symbol words", as in Gopher).
_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]+")
_SENT_END = re.compile(r"[.!?。！？]+[\"'”’)\]]*(?=\s|$)")
_PUNCT_CATS = ("P", "S")
_NON_WORD = re.compile(r"[^\w\s]+")
_WS = re.compile(r"\s+")

TERMINAL_PUNCTUATION = (".", "!", "?", "。", "！", "？", "…", "؟", "।", "॥")


def split_words(text: str) -> List[str]:
    return _WORD.findall(text)


def count_sentences(text: str) -> int:
    n = len(_SENT_END.findall(text))
    return n if n else (1 if text.strip() else 0)


def is_symbol(word: str) -> bool:
    """A token made only of punctuation/symbols."""
    return all(unicodedata.category(c)[0] in _PUNCT_CATS for c in word)


def simplify(text: str) -> str:
    """The normalisation that dedup hashes: lower case, punctuation removed, whitespace runs
    collapsed, diacritics stripped (datatrove's simplify_text without number/date rewriting)."""
    text = _NON_WORD.sub(" ", text.lower())
    text = _WS.sub(" ", text).strip()
    if not text.isascii():
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return text
