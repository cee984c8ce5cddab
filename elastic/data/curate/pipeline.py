"""The per-document pass: the configured stages in order, then the dedup hashes of what is left.

`DocPipeline(cfg).run(docs)` returns every input document once, with `reason` "" (kept) or the
reason of the first stage that removed it, and the stage counts. Kept documents carry
`content_hash` and `bands` for the global dedup step."""

from __future__ import annotations

from typing import Dict, List, Tuple

import phonenumbers

from elastic.config import ConfigError
from elastic.data.curate.base import STAGES, Doc, known_rules
from elastic.data.curate.dedup import MinHasher, content_hash

DEDUP_STAGES = ("exact_dedup", "near_dedup")
DEFAULT_STAGES = ["unicode", "langid", "gopher_quality", "gopher_repetition", "c4", "fineweb", "toxicity", "pii",
                  "exact_dedup", "near_dedup"]


def doc_stage_names(stages: List[str]) -> List[str]:
    return [s for s in stages if s not in DEDUP_STAGES]


def check_curate_config(cs) -> None:
    """One-line ConfigError for a curate section that cannot run (before any work)."""
    known = set(STAGES) | set(DEDUP_STAGES)
    for s in cs.stages:
        if s not in known:
            raise ConfigError(f"curate.stages: unknown stage {s!r} (known: {', '.join(sorted(known))})")
    if len(set(cs.stages)) != len(cs.stages):
        raise ConfigError(f"curate.stages: a stage is listed twice: {cs.stages}")
    rules = known_rules()
    for key, prefix in (("gopher_quality", "gopher"), ("gopher_repetition", "gopher_rep"), ("c4", "c4"), ("fineweb", "fineweb")):
        for k in getattr(cs, key):
            if k not in rules[prefix]:
                raise ConfigError(f"curate.{key}.{k}: unknown rule (known: {', '.join(rules[prefix])})")
    for r in cs.skip_rules:
        pre, _, rule = r.partition(":")
        if pre not in rules or rule not in rules[pre]:
            raise ConfigError(f"curate.skip_rules: unknown rule {r!r} (write '<stage prefix>:<rule>', e.g. 'c4:curly_bracket')")
    if cs.format not in ("auto", "text", "jsonl", "parquet", "html", "warc"):
        raise ConfigError(f"curate.format: must be auto|text|jsonl|parquet|html|warc, got {cs.format!r}")
    if not cs.output:
        raise ConfigError("curate.output: must name an output directory")
    if cs.workers < 1:
        raise ConfigError(f"curate.workers: must be >= 1, got {cs.workers}")
    if cs.block_mb <= 0:
        raise ConfigError(f"curate.block_mb: must be > 0, got {cs.block_mb}")
    if not 0.0 <= cs.lang_min_score <= 1.0:
        raise ConfigError(f"curate.lang_min_score: must be in [0, 1], got {cs.lang_min_score}")
    if "langid" in cs.stages and not cs.languages:
        raise ConfigError("curate.languages: langid is on but no language is kept")
    if cs.toxic_threshold < 0:
        raise ConfigError(f"curate.toxic_threshold: must be >= 0, got {cs.toxic_threshold}")
    if cs.minhash_bands < 1 or cs.minhash_rows < 1 or cs.minhash_ngram < 1:
        raise ConfigError("curate.minhash_bands/minhash_rows/minhash_ngram: must be >= 1")
    bad = [k for k in cs.pii_kinds if k not in ("email", "ip", "ipv6", "phone")]
    if bad:
        raise ConfigError(f"curate.pii_kinds: unknown kind(s) {bad} (known: email, ip, ipv6, phone)")
    bad = [r for r in cs.pii_phone_regions if not isinstance(r, str) or r.upper() not in phonenumbers.SUPPORTED_REGIONS]
    if bad:
        norway = "; YAML reads an unquoted NO (Norway) as false: write 'NO'" if "false" in str(bad).lower() else ""
        raise ConfigError(f"curate.pii_phone_regions: unknown region code(s) {bad} (ISO 3166 codes libphonenumber "
                          f"knows, e.g. US, GB, DE, FR, IN{norway})")
    if "perplexity" in cs.stages and not (cs.perplexity_scorer or cs.perplexity_model):
        raise ConfigError("curate.perplexity_model: the perplexity stage needs a checkpoint, run or Hugging Face "
                          "directory (or curate.perplexity_scorer)")
    if cs.perplexity_max < 0 or cs.perplexity_token_budget < 1:
        raise ConfigError("curate.perplexity_max must be >= 0 and curate.perplexity_token_budget >= 1")
    if cs.perplexity_dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"curate.perplexity_dtype: must be auto|float32|bfloat16|float16, got {cs.perplexity_dtype!r}")
    if cs.toxic_words:
        import os

        if not os.path.isfile(cs.toxic_words):
            raise ConfigError(f"curate.toxic_words: {cs.toxic_words}: no such file")


class DocPipeline:
    """The configured per-document stages, built once per worker (models and lists loaded here).
    `scorer`: the perplexity stage's texts -> perplexities callable, built by the caller (the
    launch layer loads the model; this layer knows nothing of models)."""

    def __init__(self, cs, scorer=None):
        self.cs = cs
        self.names = doc_stage_names(cs.stages)
        self.stages = [STAGES[n](cs, scorer=scorer) if n == "perplexity" and scorer is not None else STAGES[n](cs)
                       for n in self.names]
        self.dedup = any(s in cs.stages for s in DEDUP_STAGES)
        self.hasher = MinHasher(cs.minhash_bands, cs.minhash_rows, cs.minhash_ngram, cs.minhash_seed) \
            if "near_dedup" in cs.stages else None

    def run(self, docs: List[Doc]) -> Tuple[List[Doc], Dict[str, int]]:
        counts: Dict[str, int] = {}
        # Documents the reader already removed (an HTML page with no text: "html:no_text").
        out: List[Doc] = [d for d in docs if d.get("reason")]
        live = [d for d in docs if not d.get("reason")]
        for st in self.stages:
            res = st.process(live)
            for k, v in res.counts.items():
                counts[k] = counts.get(k, 0) + v
            for d, reason in res.removed:
                d["reason"] = reason
                out.append(d)
            live = res.kept
        for d in live:
            d["reason"] = ""
            if "exact_dedup" in self.cs.stages:
                d["content_hash"] = content_hash(d["text"])
            if self.hasher is not None:
                d["bands"] = self.hasher.band_keys(self.hasher.signature(d["text"]))
            out.append(d)
        out.sort(key=lambda d: d["order"])
        return out, counts
