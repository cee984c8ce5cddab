"""FineWeb's own quality rules (Penedo et al. 2024, section 3.3), as in datatrove's
FineWebQualityFilter: share of lines ending in terminal punctuation, share of short lines,
characters in duplicated lines, and newlines per word ("list-like" pages)."""

from __future__ import annotations

from typing import Optional

from elastic.data.curate.base import Doc, RuleStage, register
from elastic.data.curate.gopher import _duplicates
from elastic.data.curate.text import TERMINAL_PUNCTUATION, split_words


@register("fineweb")
class FineWebQuality(RuleStage):
    prefix = "fineweb"
    config_key = "fineweb"
    RULES = {
        "line_punct_ratio": 0.12,   # min share of lines ending in terminal punctuation
        "short_line_ratio": 0.67,   # max share of lines of <= short_line_length chars
        "short_line_length": 30,
        "char_dup_ratio": 0.01,     # max share of characters in duplicated lines
        "list_ratio": 0.3,          # max newlines per word
    }

    def check(self, doc: Doc) -> Optional[str]:
        t, on = self.t, self.on
        text = doc["text"]
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if not lines:
            return "empty"
        if on("line_punct_ratio") and sum(ln.endswith(TERMINAL_PUNCTUATION) for ln in lines) / len(lines) < t["line_punct_ratio"]:
            return "line_punct_ratio"
        if on("short_line_ratio"):
            short = t["short_line_length"] if on("short_line_length") else 30
            if sum(len(ln) <= short for ln in lines) / len(lines) > t["short_line_ratio"]:
                return "short_line_ratio"
        if on("char_dup_ratio") and _duplicates(lines)[1] / max(1, len(text.replace("\n", ""))) > t["char_dup_ratio"]:
            return "char_dup_ratio"
        if on("list_ratio") and text.count("\n") / max(1, len(split_words(text))) > t["list_ratio"]:
            return "list_ratio"
        return None
