"""C4's page rules (Raffel et al. 2020, section 2.2; tensorflow_datasets c4_utils), as in
datatrove's C4QualityFilter: lines without terminal punctuation, with fewer than 3 words, with
a word over 1000 characters, mentioning "javascript" or a cookie/terms policy are dropped from
the page (when `rewrite_lines` is on, as in C4); a page with "lorem ipsum" or a curly bracket is
removed, and so is one left with fewer than 5 sentences. The bad-words rule is the `toxicity`
stage."""

from __future__ import annotations

import re
from typing import Optional

from elastic.data.curate.base import Doc, RuleStage, StageResult, register
from elastic.data.curate.text import count_sentences

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


@register("c4")
class C4Quality(RuleStage):
    prefix = "c4"
    config_key = "c4"
    # 1 = on for the yes/no rules; numbers are thresholds.
    RULES = {
        "lorem_ipsum": 1, "curly_bracket": 1, "min_sentences": 5,
        "min_words_per_line": 3, "max_word_length": 1000, "terminal_punct": 1,
        "javascript": 1, "policy": 1, "remove_citations": 1, "rewrite_lines": 1,
    }

    def process(self, docs):
        res = StageResult(kept=[])
        dropped = 0
        for d in docs:
            rule, lines_dropped = self._check(d)
            dropped += lines_dropped
            if rule is None:
                res.kept.append(d)
            else:
                res.removed.append((d, f"c4:{rule}"))
        res.counts["c4_lines_dropped"] = dropped
        return res

    def check(self, doc: Doc) -> Optional[str]:
        return self._check(doc)[0]

    def _check(self, doc: Doc):
        t, on = self.t, self.on
        sentences, kept, dropped = 0, [], 0
        for line in doc["text"].splitlines():
            line = line.strip()
            words = line.split()
            if on("max_word_length") and any(len(w) > t["max_word_length"] for w in words):
                dropped += 1
                continue
            if on("remove_citations") and t["remove_citations"]:
                line = CITATION.sub("", line)
            if on("terminal_punct") and t["terminal_punct"] and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                dropped += 1
                continue
            if on("min_words_per_line") and len(words) < t["min_words_per_line"]:
                dropped += 1
                continue
            low = line.lower()
            if on("lorem_ipsum") and t["lorem_ipsum"] and "lorem ipsum" in low:
                return "lorem_ipsum", dropped
            if on("javascript") and t["javascript"] and "javascript" in low:
                dropped += 1
                continue
            if on("curly_bracket") and t["curly_bracket"] and "{" in line:
                return "curly_bracket", dropped
            if on("policy") and t["policy"] and any(p in low for p in POLICY):
                dropped += 1
                continue
            sentences += count_sentences(line)
            kept.append(line)
        if on("min_sentences") and sentences < t["min_sentences"]:
            return "min_sentences", dropped
        if on("rewrite_lines") and t["rewrite_lines"]:
            doc["text"] = "\n".join(kept).strip()
        return None, dropped
