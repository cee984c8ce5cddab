"""scripts/scale_trainers.sh builds the right `kubectl patch` and refuses to lower replicas.

There is no Kubernetes here, so `kubectl` is a stand-in script that answers the two `get`
queries the script makes with a fixed RayCluster state and records every `patch` call; what
is checked is the script's own logic (group lookup by name, the JSON patch, the refusals).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "scale_trainers.sh"

# Groups in a different order than ray-cluster.yaml, so a hard-coded index would be caught.
FAKE_KUBECTL = r"""#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *"get rayjob"*) printf 'elastic-pretrain-x7k2p' ;;
  *"get raycluster"*) printf 'reward-cpu 1 1 4\ntrainer-gpu 3 2 4\n' ;;
  *patch*) echo "raycluster.ray.io/elastic patched" ;;
  *) echo "unexpected kubectl call: $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def run(tmp_path):
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    calls = tmp_path / "calls"

    def _run(*args: str):
        env = dict(os.environ, KUBECTL=str(kubectl), CALLS=str(calls))
        r = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        patches = [json.loads(line.split(" -p ", 1)[1]) for line in lines if " patch " in f" {line} "]
        return r, lines, patches

    return _run


def test_patches_min_and_max_of_the_trainer_group_only(run):
    r, _, patches = run("2", "6")
    assert r.returncode == 0, r.stderr
    (patch,) = patches
    assert patch == [
        {"op": "test", "path": "/spec/workerGroupSpecs/1/groupName", "value": "trainer-gpu"},
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/minReplicas", "value": 2},
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/maxReplicas", "value": 6},
    ]
    assert "running: " in r.stdout and "replicas=3 minReplicas=2 maxReplicas=4" in r.stdout


def test_refuses_to_lower_replicas(run):
    r, _, patches = run("--replicas", "1", "1", "4")
    assert r.returncode == 2 and "refusing to lower replicas from 3 to 1" in r.stderr
    assert not patches


def test_may_raise_replicas_to_prewarm(run):
    r, _, patches = run("--replicas", "4", "2", "4")
    assert r.returncode == 0, r.stderr
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 4} in patches[0]


def test_warns_when_max_drops_below_current_pods(run):
    r, _, patches = run("1", "2")
    assert r.returncode == 0 and "will remove 1 pod(s)" in r.stdout
    assert all(op["path"].split("/")[-1] != "replicas" for op in patches[0])


@pytest.mark.parametrize("args, message", [
    (("5", "3"), "must be <= MAX"),
    (("-1", "3"), "unknown option"),
    (("x", "3"), "non-negative integers"),
    (("--group", "nosuch", "1", "2"), "no worker group 'nosuch'"),
])
def test_rejects_bad_input(run, args, message):
    r, _, patches = run(*args)
    assert r.returncode == 2 and message in r.stderr and not patches


def test_dry_run_changes_nothing_and_rayjob_is_resolved(run):
    r, calls, patches = run("--dry-run", "--rayjob", "elastic-pretrain", "2", "4")
    assert r.returncode == 0 and "dry run" in r.stdout and not patches
    assert any("get raycluster elastic-pretrain-x7k2p" in c for c in calls)
