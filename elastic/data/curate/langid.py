"""Language identification with py3langid (langid.py's model, normalised probabilities): a
document is kept when its top language is in `curate.languages` with probability at least
`curate.lang_min_score` (datatrove's LanguageFilter default 0.65). Reasons: "lang:<code>" for a
document in another language, "lang:low_score" for one whose language is too uncertain."""

from __future__ import annotations

from elastic.data.curate.base import Stage, StageResult, register

MAX_CHARS = 10000  # the identifier reads this much of each document


@register("langid")
class LanguageID(Stage):
    loads = True

    def __init__(self, cfg=None, languages=None, min_score=None):
        super().__init__(cfg)
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.languages = set(languages if languages is not None else (getattr(cfg, "languages", None) or ["en"]))
        self.min_score = float(min_score if min_score is not None else getattr(cfg, "lang_min_score", 0.65))
        self._id = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def classify(self, text: str):
        lang, score = self._id.classify(text[:MAX_CHARS])
        return lang, float(score)

    def process(self, docs):
        res = StageResult(kept=[])
        for d in docs:
            lang, score = self.classify(d["text"])
            d["lang"], d["lang_score"] = lang, round(score, 4)
            if lang not in self.languages:
                res.removed.append((d, f"lang:{lang}"))
            elif score < self.min_score:
                res.removed.append((d, "lang:low_score"))
            else:
                res.kept.append(d)
        return res
