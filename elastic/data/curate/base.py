"""The stage interface and registry of the curation pipeline (elastic/data/curate).

A document is a dict with at least `id` (a stable string) and `text`; the pipeline also
carries `order` (its position in the input: the tie-breaker that makes dedup independent of
scheduling). A stage takes a batch (a list of such dicts, or a dict of columns) and returns
`StageResult(kept, removed, counts)`: `removed` pairs each dropped document with a reason
string ``"<stage>:<rule>"`` (e.g. ``"gopher:min_doc_words"``, ``"lang:de"``, ``"toxic"``);
`counts` are stage statistics that are not removals (PII redactions, lines dropped).

Stages are pure Python (no Ray, no torch) and deterministic: the same document gives the same
answer on any worker, in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

Doc = Dict[str, object]
Batch = Union[List[Doc], Mapping[str, Sequence]]


@dataclass
class StageResult:
    kept: List[Doc]
    removed: List[Tuple[Doc, str]] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)


STAGES: Dict[str, Type["Stage"]] = {}


def register(name: str) -> Callable[[Type["Stage"]], Type["Stage"]]:
    """Class decorator: make a stage available to `curate.stages` under `name`."""

    def deco(cls):
        cls.name = name
        STAGES[name] = cls
        return cls

    return deco


def as_docs(batch: Batch) -> List[Doc]:
    """A list of dicts, from either a list of dicts or a dict of equal-length columns."""
    if isinstance(batch, Mapping):
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        return [{c: batch[c][i] for c in cols} for i in range(n)]
    return list(batch)


class Stage:
    """One curation step. Subclasses set `name` (via @register) and implement `process`.
    Constructed from the `curate` config section (elastic/config/schema.py: CurateSection)."""

    name = "stage"
    # Stages that load something (a model, a word list) run in stateful Ray Data actors.
    loads = False

    def __init__(self, cfg=None):
        self.cfg = cfg

    def process(self, docs: List[Doc]) -> StageResult:
        raise NotImplementedError

    def __call__(self, batch: Batch) -> StageResult:
        return self.process(as_docs(batch))


class RuleStage(Stage):
    """A stage made of named threshold rules (Gopher, C4, FineWeb): `RULES` holds the published
    defaults; the config section's dict for this stage (e.g. `curate.gopher_quality`) overrides
    any of them by name, and `curate.skip_rules` turns single rules off ("gopher:min_doc_words").
    The first rule a document fails names the reason, "<prefix>:<rule>"."""

    RULES: Dict[str, float] = {}
    prefix = ""
    config_key = ""

    def __init__(self, cfg=None, **overrides: float):
        super().__init__(cfg)
        self.t: Dict[str, Optional[float]] = dict(self.RULES)
        given = dict(getattr(cfg, self.config_key, None) or {}) if cfg is not None else {}
        given.update(overrides)
        for k, v in given.items():
            if k not in self.RULES:
                raise KeyError(f"{self.prefix}: unknown rule {k!r} (known: {', '.join(self.RULES)})")
            self.t[k] = v
        for r in (getattr(cfg, "skip_rules", None) or []):
            pre, _, rule = r.partition(":")
            if pre == self.prefix and rule in self.t:
                self.t[rule] = None

    def on(self, rule: str) -> bool:
        return self.t.get(rule) is not None

    def check(self, doc: Doc) -> Optional[str]:
        """The failed rule's name, or None to keep (may rewrite doc["text"])."""
        raise NotImplementedError

    def process(self, docs: List[Doc]) -> StageResult:
        res = StageResult(kept=[])
        for d in docs:
            rule = self.check(d)
            if rule is None:
                res.kept.append(d)
            else:
                res.removed.append((d, f"{self.prefix}:{rule}"))
        return res


def known_rules() -> Dict[str, List[str]]:
    """prefix -> rule names of every rule stage (for config validation)."""
    return {cls.prefix: list(cls.RULES) for cls in STAGES.values() if issubclass(cls, RuleStage)}
