"""The GPU benchmarks also run on CPU in smoke mode, through the same code path (Ray Train +
Ray Data + FSDP2), and write the JSON their tables come from."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def _run(script, out, *extra):
    env = {**os.environ, "RAY_ADDRESS": "local", "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, str(REPO / "bench" / script), "--smoke", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, json.loads(out.read_text())


def test_train_throughput_smoke(tmp_path):
    stdout, res = _run("train_throughput.py", tmp_path / "tp.json")
    assert "MFU = flops_per_token" in stdout
    rows = res["results"]
    assert [r["config"]["train.activation_checkpointing"] for r in rows] == ["none", "full"]
    for r in rows:
        assert r["steps_measured"] == 2 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["attention_backend"] == "sdpa_mask" and r["device"] == "cpu"
    assert res["environment"]["torch"] and res["environment"]["ray"]


def test_data_throughput_smoke(tmp_path):
    stdout, res = _run("data_throughput.py", tmp_path / "dt.json", "--cpus", "2")
    pc = res["per_core"]
    assert pc["store"]["tokens"] == pc["bare"]["tokens"] > 0  # the same documents, the same tokens
    assert pc["ratio_cpu"] > 0 and pc["trainer"]["cores_per_gpu"] > 0 and "cores/GPU" in stdout
    ws = res["world_sizes"]
    assert [w["world_size"] for w in ws] == [1, 2] and all(w["tokenize_cpu_s"] > 0 for w in ws)
    assert ws[0]["source"] == "cache build records" and all(w["builds"] >= 1 for w in ws)
    assert res["default_job"]["steps"] == 3 and 0 <= res["default_job"]["share_all"] < 1
