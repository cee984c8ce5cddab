"""`python -m elastic.reward` prints a Result (JSON with --json) through the pool's code path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.reward_helpers import FIXTURES, REPO


def cli(*args, cache):
    env = dict(os.environ, ELASTIC_REWARD_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "elastic.reward", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


def test_cli_json_and_human(tmp_path):
    prob = FIXTURES / "pair-sum"
    r = cli("--problem", str(prob), "--program", str(prob / "solutions" / "fast.c"), "--json", "--timing-runs", "1",
            cache=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "ok" and d["speedup"] > 0 and d["sandbox"]["net_namespace"]
    r = cli("--problem", str(prob), "--program", str(prob / "solutions" / "wrong.c"), "--timing-runs", "1", cache=tmp_path)
    assert r.returncode == 0 and "wrong_answer" in r.stdout


def test_cli_bad_problem_exit_2(tmp_path):
    r = cli("--problem", str(tmp_path / "missing"), "--program", "x.c", cache=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "problem.yaml: not found" in r.stderr
