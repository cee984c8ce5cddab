"""Curation stages: raw documents -> kept documents + removed documents with a reason.

Pure Python (no Ray, no torch); elastic/launch/curate.py runs them as Ray Data operators.
Per-document stages (registered in STAGES): unicode, langid, gopher_quality,
gopher_repetition, c4, fineweb, toxicity, pii, perplexity. Global stages: exact_dedup,
near_dedup (elastic/data/curate/dedup.py).
"""

from elastic.data.curate import c4, fineweb, gopher, langid, perplexity, pii, toxicity, unicode  # noqa: F401 (register)
from elastic.data.curate.base import STAGES, Stage, StageResult, as_docs, known_rules, register  # noqa: F401
from elastic.data.curate.pipeline import (DEDUP_STAGES, DEFAULT_STAGES, DocPipeline, check_curate_config,  # noqa: F401
                                          doc_stage_names)
