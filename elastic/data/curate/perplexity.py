"""Perplexity stage (off unless "perplexity" is in `curate.stages`).

The scorer is a callable mapping a list of texts to a list of perplexities. The job passes the
built-in one (elastic/launch/curate_scorer.py: a project or Hugging Face model, loaded once per
Ray Data actor; this layer imports no model code); or `curate.perplexity_scorer` names a
factory "package.module:function", called once per worker with `curate.perplexity_model`
(CCNet-style KenLM bucketing plugs in here). Documents above `curate.perplexity_max` are
removed ("perplexity"); the score is kept in the document's `perplexity` field."""

from __future__ import annotations

import importlib

from elastic.data.curate.base import Stage, StageResult, register


def load_scorer(spec: str, model_path: str):
    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise ValueError(f"curate.perplexity_scorer {spec!r}: expected 'package.module:function'")
    return getattr(importlib.import_module(mod), fn)(model_path)


@register("perplexity")
class Perplexity(Stage):
    loads = True

    def __init__(self, cfg=None, scorer=None, max_perplexity=None):
        super().__init__(cfg)
        self.score = scorer or load_scorer(getattr(cfg, "perplexity_scorer", ""), getattr(cfg, "perplexity_model", ""))
        self.max = float(max_perplexity if max_perplexity is not None else getattr(cfg, "perplexity_max", 0.0))

    def process(self, docs):
        res = StageResult(kept=[])
        scores = list(self.score([d["text"] for d in docs])) if docs else []
        for d, s in zip(docs, scores):
            d["perplexity"] = float(s)
            (res.removed.append((d, "perplexity")) if self.max > 0 and s > self.max else res.kept.append(d))
        return res
