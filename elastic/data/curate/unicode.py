"""Unicode repair with ftfy, configured as datatrove's FTFYFormatter: mojibake, HTML entities,
terminal escapes, C1 and other control characters and surrogates are fixed; curly quotes,
line breaks, character widths, ligatures and normalisation form are left as they are (models
should see those as written). Never removes a document; counts the ones it changed."""

from __future__ import annotations

import re

from elastic.data.curate.base import Stage, StageResult, register

# ASCII text without these is exactly what ftfy returns (no mojibake, entity, escape or control
# character to fix): the common case skips ftfy.
_ASCII_WORK = re.compile(r"[&\x00-\x08\x0b\x0e-\x1f\x7f]")


@register("unicode")
class UnicodeRepair(Stage):
    def __init__(self, cfg=None):
        super().__init__(cfg)
        import ftfy

        self._fix = ftfy.fix_text
        self._config = ftfy.TextFixerConfig(
            unescape_html="auto", remove_terminal_escapes=True, fix_encoding=True, restore_byte_a0=True,
            replace_lossy_sequences=True, decode_inconsistent_utf8=True, fix_c1_controls=True,
            fix_latin_ligatures=False, fix_character_width=False, uncurl_quotes=False, fix_line_breaks=False,
            fix_surrogates=True, remove_control_chars=True, normalization=None)

    def fix(self, text: str) -> str:
        if text.isascii() and not _ASCII_WORK.search(text):
            return text
        return self._fix(text, config=self._config)

    def process(self, docs):
        changed = 0
        for d in docs:
            text = d["text"]
            fixed = self.fix(text)
            if fixed != text:
                d["text"] = fixed
                changed += 1
        return StageResult(kept=docs, counts={"unicode_fixed": changed})
