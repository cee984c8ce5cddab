"""Pure-function parts of the reward service: scoring, checkers, extraction, loader, config."""

from __future__ import annotations

import math
import shutil

import pytest

from elastic.config import ConfigError, from_dict
from elastic.reward import ProblemError, Result, extract_code, load_problem, load_problems, speedup_reward
from elastic.reward.verifiers.code_opt.checkers import check
from tests.reward_helpers import FIXTURES


def test_reward_bounded_and_monotone():
    xs = [2.0 ** (e / 4) for e in range(-60, 61)]
    ys = [speedup_reward(x) for x in xs]
    assert all(0.1 <= y <= 1.0 for y in ys)
    assert all(b > a for a, b in zip(ys, ys[1:]) if b < 1.0)  # strictly increasing until float saturation
    assert speedup_reward(1.0) == pytest.approx(0.55)
    assert speedup_reward(4.0) == pytest.approx(0.1 + 0.9 * (1 + math.tanh(1)) / 2)
    assert speedup_reward(float("inf")) == 1.0 and speedup_reward(0.0) == 0.1
    assert speedup_reward(3.0) > speedup_reward(1.0) > speedup_reward(0.5)


@pytest.mark.parametrize("checker,out,exp,ok", [
    ("exact", b"1 2\n3  \n\n\n", b"1 2\n3\n", True),
    ("exact", b"1  2\n3\n", b"1 2\n3\n", False),
    ("tokens", b"1   2\n3", b"1 2 3\n", True),
    ("tokens", b"1 2", b"1 2 3", False),
    ("float:1e-6", b"0.3333333 x", b"0.33333333 x", True),
    ("float:1e-6", b"0.34 x", b"0.33333333 x", False),
    ("float:1e-6", b"nan", b"1.0", False),
])
def test_checkers(checker, out, exp, ok):
    assert check(checker, out, exp)[0] is ok


def test_extract_code_last_block_and_tags():
    text = "draft:\n```c\nint a;\n```\nfinal:\n```cpp\nint main(){}\n```\n```python\nprint(1)\n```\n"
    assert extract_code(text, "c") == ("cpp", "int main(){}\n")
    assert extract_code("```\nint main(){}\n```", "c") == ("c", "int main(){}\n")
    assert extract_code("```c++\nx\n```", "c")[0] == "cpp"
    assert extract_code("no code here", "c") is None
    assert extract_code("```python\nprint(1)\n```", "c") is None


def test_fixture_problems_load():
    probs = load_problems(FIXTURES)
    assert {"pair-sum", "range-sum"} <= set(probs)
    p = probs["range-sum"]
    assert p.language == "cpp" and len(p.tests) >= 3 and set(p.solutions) >= {"fast", "wrong"}


@pytest.mark.parametrize("edit,needle", [
    (lambda d: (d / "problem.yaml").write_text((d / "problem.yaml").read_text().replace("kind: algorithmic", "kind: magic")), "field 'kind'"),
    (lambda d: (d / "problem.yaml").write_text((d / "problem.yaml").read_text().replace("time_limit_s: 2.0\n", "")), "missing field 'time_limit_s'"),
    (lambda d: (d / "problem.yaml").write_text((d / "problem.yaml").read_text().replace("checker: exact", "checker: fuzzy")), "field 'checker'"),
    (lambda d: (d / "problem.yaml").write_text((d / "problem.yaml").read_text().replace("id: pair-sum", "id: other")), "field 'id'"),
    (lambda d: (d / "reference.c").unlink(), "reference.c: not found"),
    (lambda d: (d / "tests" / "01.out").unlink(), "01.out: missing expected output"),
    (lambda d: (d / "problem.yaml").write_text("id: [unclosed"), "invalid YAML"),
])
def test_malformed_problem_one_line_error(tmp_path, edit, needle):
    d = tmp_path / "pair-sum"
    shutil.copytree(FIXTURES / "pair-sum", d)
    edit(d)
    with pytest.raises(ProblemError) as e:
        load_problem(d)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and str(d) in msg


def test_result_round_trip():
    r = Result("p", "ok", 0.7, speedup=2.0)
    assert Result.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError):
        Result("p", "great", 1.0)


def test_reward_config_validation():
    assert from_dict({"reward": {"warmup_runs": 0, "env_allow": ["X"]}}).reward.env_allow == ["X"]
    for bad, key in [({"failure_reward": 0.5}, "reward.failure_reward"), ({"timing": "cycles"}, "reward.timing"),
                     ({"max_retries": -1}, "reward.max_retries"), ({"reward_floor": 1.0}, "reward.reward_floor")]:
        with pytest.raises(ConfigError, match=key):
            from_dict({"reward": bad})
