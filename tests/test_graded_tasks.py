"""datasets/graded-tasks: deterministic for a seed, held-out disjoint from train by behaviour,
every reference passes and every wrong solution fails, in the real verifiers (python_tests in
its bubblewrap sandbox, math_answer), and `--check` names the task id of a row that is not sound."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

DIR = Path(__file__).resolve().parents[1] / "datasets" / "graded-tasks"
MAKE = DIR / "make.py"


@pytest.fixture(scope="module")
def make():
    spec = importlib.util.spec_from_file_location("graded_make", MAKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def digest(d: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(d.rglob("*.jsonl")))).hexdigest()


@pytest.mark.parametrize("family", ["python", "math"])
def test_deterministic_disjoint_and_sized(make, family):
    train = make.generate_train(family)
    assert train == make.generate_train(family)
    held = make.generate_heldout(family, train)
    assert held == make.generate_heldout(family, train)
    fresh = make.generate_heldout(family, train, seed=7)
    assert fresh == make.generate_heldout(family, train, seed=7) and fresh != held
    assert len(held) >= 256 and len(fresh) >= 256 and {r["level"] for r in held} == {1, 2, 3}
    train_sigs = {make.signature(family, r) for r in train}
    for split in (held, fresh):
        sigs = [make.signature(family, r) for r in split]
        assert len(set(sigs)) == len(sigs) and not set(sigs) & train_sigs
    # Normalised prompts (names and wording aside, the tests) of the shipped files: disjoint.
    shipped_train, shipped_held = rows(DIR / family / "train.jsonl"), rows(DIR / family / "heldout.jsonl")
    assert [make.ordered(family, r) for r in train] == shipped_train
    assert not {make.signature(family, r) for r in shipped_held} & {make.signature(family, r) for r in shipped_train}
    assert not {r["instruction"] for r in shipped_held} & {r["instruction"] for r in shipped_train}


def test_check_passes_on_the_shipped_files_and_a_fresh_heldout_leaves_them_alone(tmp_path):
    before = digest(DIR)
    out = subprocess.run([sys.executable, str(MAKE), "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "python: 2000 train" in out.stdout and "math: 2000 train" in out.stdout
    fresh = tmp_path / "held7.jsonl"
    out = subprocess.run([sys.executable, str(MAKE), "--family", "python", "--seed", "7", "--heldout-only",
                          "--out", str(fresh)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = rows(fresh)
    assert len(got) == 256 and all(r["task_id"].startswith("gpy/heldout7-") for r in got)
    assert digest(DIR) == before


def test_check_names_every_unsound_row(tmp_path):
    """A held-out file with a copy of a train task (new id and name), a reference that fails, a
    wrong solution that passes: --check names exactly those three ids and exits 1."""
    train = rows(DIR / "python" / "train.jsonl")
    held = rows(DIR / "python" / "heldout.jsonl")[:5]
    copy = dict(train[3], task_id="bad/copy-of-train", entry_point="renamed_fn",
                prompt=train[3]["prompt"].replace(train[3]["entry_point"], "renamed_fn"))
    broken = dict(held[1], task_id="bad/reference", canonical_solution="    return None\n")
    lenient = dict(held[2], task_id="bad/wrong-passes", wrong_solution=held[2]["canonical_solution"])
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [held[0], copy, broken, lenient, held[4]]))
    out = subprocess.run([sys.executable, str(MAKE), "--check", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert "bad/copy-of-train: overlaps train task gpy/train-3" in lines[0]
    assert "bad/reference: the reference fails" in lines[1]
    assert "bad/wrong-passes: the wrong solution passes" in lines[2]
    math = rows(DIR / "math" / "heldout.jsonl")[:3]
    math[1]["wrong_solution"] = math[1]["answer"]
    mpath = tmp_path / "math_heldout.jsonl"
    mpath.write_text("".join(json.dumps(r) + "\n" for r in math))
    out = subprocess.run([sys.executable, str(MAKE), "--check", str(mpath)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.strip() == f"{mpath}: {math[1]['task_id']}: the wrong solution passes"


def test_references_pass_and_wrong_solutions_fail_in_the_real_verifiers():
    """A spread of held-out and train rows (every level, int and list tasks) through the
    python_tests verifier in its sandbox, and math rows through math_answer."""
    from elastic.reward.settings import EvalSettings
    from elastic.reward.verifiers.math_answer import score_math
    from elastic.reward.verifiers.python_tests.verifier import PythonTests, evaluate_python_batch
    from elastic.sandbox.isolation import SandboxUnavailable

    py = rows(DIR / "python" / "heldout.jsonl")[:24] + rows(DIR / "python" / "train.jsonl")[::250]
    assert {r["level"] for r in py} == {1, 2, 3}
    items = []
    for r in py:
        spec = PythonTests.from_humaneval(r, time_limit_s=2.0, memory_mb=256)
        for body in (r["canonical_solution"], r["wrong_solution"]):
            items.append((r["task_id"], spec, "```python\n" + r["prompt"] + body + "```"))
    try:
        res = evaluate_python_batch(items, EvalSettings())
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    ref, wrong = res[0::2], res[1::2]
    assert [x.status for x in ref] == ["ok"] * len(py), [(r["task_id"], x.status, x.reason) for r, x in zip(py, ref) if x.status != "ok"]
    assert all(x.status == "wrong_answer" for x in wrong), [(r["task_id"], x.status) for r, x in zip(py, wrong) if x.status != "wrong_answer"]
    math = rows(DIR / "math" / "heldout.jsonl") + rows(DIR / "math" / "train.jsonl")[::100]
    assert all(score_math(r["answer"], r["target"])[0] for r in math)
    assert not any(score_math(r["wrong_solution"], r["target"])[0] for r in math)
