"""What an evaluation task is: a small YAML file plus a data file, read into plain values.

A task YAML (lm-evaluation-harness's vocabulary where it has one):

    task: arc_easy                 # the name results are reported under
    type: multiple_choice          # perplexity | multiple_choice | generation | code
    format: arc                    # the data file's reader (elastic/eval/formats.py)
    data: arc_easy.jsonl           # JSONL / .jsonl.gz / Parquet; relative to the YAML's folder,
                                   # absolute, or any pyarrow filesystem URI
    fewshot_data: ""               # few-shot pool; empty: the data file itself (the item excluded)
    num_fewshot: 0
    fewshot_seed: 1234
    fewshot_sampler: random        # random (lm-eval: one Random(seed) per task, in item order) | first_n
    description: ""                # text before the few-shot examples (MMLU's subject line)
    target_delimiter: " "          # between a context and its continuation
    fewshot_delimiter: "\\n\\n"    # between few-shot examples
    limit: 0                       # the first N items only (0: all)
    # generation / code
    until: ["\\n\\n"]              # stop sequences (the model's EOS always stops)
    max_gen_toks: 256
    extract: none                  # none | regex | math_answer (what exact_match compares)
    pattern: ""                    # extract: regex, the answer is group 1 (else the whole match)
    group_select: 0                # which match counts (-1: the last)
    ignore_case: false
    regexes_to_ignore: []          # removed from prediction and reference before comparing
    # code
    samples: 1                     # completions per item; 1 = greedy
    k: [1]                         # pass@k reported for every k <= samples
    temperature: 0.0
    top_p: 1.0

A reader turns each row into a :class:`Doc`; nothing here knows about models or Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

from elastic.config.load import ConfigError

TYPES = ("perplexity", "multiple_choice", "generation", "code")
EXTRACTS = ("none", "regex", "math_answer")


class EvalConfigError(ConfigError):
    """A task YAML that cannot be used; one line naming the file and the field."""


@dataclass
class Doc:
    """One evaluation item after its reader (lm-eval's doc_to_text / doc_to_choice / doc_to_target).

    perplexity:      `text` (the whole document).
    multiple_choice: `context` (no trailing delimiter), `choices` (continuations, without the
                     target delimiter), `gold` (index into choices).
    generation:      `context`, `target` (the reference answer, compared after extraction),
                     `fewshot_target` (what follows the context in a few-shot example; default
                     the target).
    code:            `context` (the prompt the body continues), `test`, `entry_point` (HumanEval's
                     `check(candidate)`), or `test_list` / `test_setup` (MBPP).
    """

    id: str
    context: str = ""
    choices: List[str] = field(default_factory=list)
    gold: int = -1
    target: str = ""
    fewshot_target: str = ""
    text: str = ""
    test: str = ""
    entry_point: str = ""
    test_list: List[str] = field(default_factory=list)
    test_setup: str = ""
    where: str = ""  # "file:line", for messages

    def shot_target(self) -> str:
        """The text after the context when this doc is a few-shot example."""
        if self.choices:
            return self.choices[self.gold]
        return self.fewshot_target or self.target


@dataclass
class TaskSpec:
    task: str
    type: str
    format: str = "jsonl"
    data: str = ""
    fewshot_data: str = ""
    num_fewshot: int = 0
    fewshot_seed: int = 1234
    # random: lm-eval's draws (one random.Random(fewshot_seed) per task, used up in item order,
    # the item itself excluded), made on the driver so sharding and resumption do not change
    # them; first_n: the pool's first num_fewshot rows in order (lm-eval's MMLU).
    fewshot_sampler: str = "random"
    description: str = ""
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    limit: int = 0
    until: List[str] = field(default_factory=lambda: ["\n\n"])
    max_gen_toks: int = 256
    extract: str = "none"
    pattern: str = ""
    group_select: int = 0
    ignore_case: bool = False
    regexes_to_ignore: List[str] = field(default_factory=list)
    samples: int = 1
    k: List[int] = field(default_factory=lambda: [1])
    temperature: float = 0.0
    top_p: float = 1.0
    fields: Dict[str, Any] = field(default_factory=dict)  # format: jsonl, our name -> the file's
    source: str = ""  # the YAML file this came from ("" for a built-in)

    def check(self) -> "TaskSpec":
        where = self.source or f"task {self.task}"
        if self.type not in TYPES:
            raise EvalConfigError(f"{where}: type: {self.type!r} is not one of {', '.join(TYPES)}")
        if self.extract not in EXTRACTS:
            raise EvalConfigError(f"{where}: extract: {self.extract!r} is not one of {', '.join(EXTRACTS)}")
        if self.fewshot_sampler not in ("random", "first_n"):
            raise EvalConfigError(f"{where}: fewshot_sampler: {self.fewshot_sampler!r} is not one of random, first_n")
        if self.extract == "regex" and not self.pattern:
            raise EvalConfigError(f"{where}: extract: regex needs a pattern")
        if self.num_fewshot < 0 or self.limit < 0 or self.max_gen_toks < 1 or self.samples < 1:
            raise EvalConfigError(f"{where}: num_fewshot and limit must be >= 0, max_gen_toks and samples >= 1")
        bad_k = [k for k in self.k if k < 1 or k > self.samples]
        if bad_k:
            raise EvalConfigError(f"{where}: k: {bad_k} must lie in 1..samples ({self.samples})")
        if self.samples > 1 and self.temperature <= 0:
            raise EvalConfigError(f"{where}: samples > 1 needs temperature > 0 (greedy samples are all the same)")
        if not self.data:
            raise EvalConfigError(f"{where}: data: a data file is required")
        return self


def _resolve(path: str, base: str) -> str:
    if not path or "://" in path or path.startswith("pkg:") or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, path))


def spec_from_dict(d: Dict[str, Any], source: str = "", base: str = "") -> TaskSpec:
    """A checked TaskSpec from a YAML mapping; unknown keys are errors (a typo must not be ignored)."""
    where = source or "task"
    if not isinstance(d, dict):
        raise EvalConfigError(f"{where}: a task file must be a mapping of keys to values")
    known = {f.name for f in fields(TaskSpec)} - {"source"}
    unknown = sorted(set(d) - known)
    if unknown:
        raise EvalConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    for req in ("task", "type"):
        if req not in d:
            raise EvalConfigError(f"{where}: {req}: required")
    d = dict(d)
    if isinstance(d.get("until"), str):
        d["until"] = [d["until"]]
    if isinstance(d.get("k"), int):
        d["k"] = [d["k"]]
    try:
        spec = TaskSpec(**d, source=source)
    except TypeError as e:
        raise EvalConfigError(f"{where}: {e}") from None
    spec.data = _resolve(spec.data, base)
    spec.fewshot_data = _resolve(spec.fewshot_data, base)
    return spec.check()


def load_spec(path: str) -> TaskSpec:
    import yaml

    if not os.path.isfile(path):
        raise EvalConfigError(f"{path}: no such task file")
    try:
        with open(path) as f:
            d = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise EvalConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return spec_from_dict(d, source=path, base=os.path.dirname(os.path.abspath(path)))


def shipped_tasks_dir() -> str:
    """The project's own task YAMLs (datasets/eval/tasks)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "datasets", "eval", "tasks")


def find_spec(name_or_path: str) -> TaskSpec:
    """A task by YAML path, or by the name of a shipped task (datasets/eval/tasks/<name>.yaml)."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        return load_spec(name_or_path)
    p = os.path.join(shipped_tasks_dir(), name_or_path + ".yaml")
    if os.path.isfile(p):
        return load_spec(p)
    have = sorted(f[:-5] for f in os.listdir(shipped_tasks_dir()) if f.endswith(".yaml")) if os.path.isdir(shipped_tasks_dir()) else []
    raise EvalConfigError(f"{name_or_path}: no such task (a YAML path, or one of: {', '.join(have)})")


# Task types that run inside training (elastic/eval/in_training.py) on the live model.
IN_TRAINING_TYPES = ("perplexity", "multiple_choice")


@dataclass
class PlannedTask:
    """A task read on the driver (checked before any worker starts) and shipped by value to the
    in-training hook (elastic/eval/in_training.py). Here, without torch: the driver plans it."""

    spec: TaskSpec
    docs: List[Doc]
    contexts: List[str]  # each item's full context (few-shot examples drawn on the driver)
