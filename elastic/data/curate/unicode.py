"""Unicode repair: ftfy.fix_text (mojibake, HTML entities, odd line breaks) on every document."""

from __future__ import annotations

from elastic.data.curate.base import Stage, StageResult, register


@register("unicode")
class UnicodeRepair(Stage):
    def __init__(self, cfg=None):
        super().__init__(cfg)
        import ftfy

        self._fix = ftfy.fix_text

    def process(self, docs):
        changed = 0
        for d in docs:
            text = d["text"]
            if text.isascii() and "&" not in text:  # nothing ftfy would change (fast path)
                continue
            fixed = self._fix(text)
            if fixed != text:
                d["text"] = fixed
                changed += 1
        return StageResult(kept=docs, counts={"unicode_fixed": changed})
