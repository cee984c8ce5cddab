"""Killing the job while a checkpoint is being written leaves the previous checkpoint intact,
and the relaunched run resumes from it (not from the half-written one).

Fault injection (ELASTIC_FAULT_CKPT_DELAY) stalls rank 1 inside the write of checkpoint 4
while rank 0 has written its part and waits in `ray.train.report` (a barrier: Ray uploads
nothing until every rank reports). Then the driver, the Ray cluster it started and every
worker are SIGKILLed. To also cover a crash *during the upload*, rank 0's real step-4 files
are then placed in storage the way an interrupted upload leaves them (no rank-1 shard, never
registered with Ray Train).
"""

import glob
import json
import os
import shutil
import signal
import tempfile
import subprocess
import sys
import time

import psutil

from elastic.launch import ledger
from elastic.launch.recovery import analyze
from tests.conftest import REPO
from tests.helpers import make_text_corpus, read_jsonl, small_run_overrides

STEPS = 6


def _job(overrides, env_extra, log):
    args = [sys.executable, str(REPO / "jobs" / "pretrain.py")]
    for o in overrides:
        args += ["--set", o]
    env = {**os.environ, "RAY_ADDRESS": "local", **env_extra}
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _kill_tree(proc):
    procs = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _rank0_partial(since: float, step: int):
    """Rank 0's local DCP output for `step` (it holds train_state.json), once complete."""
    for d in glob.glob(os.path.join(tempfile.gettempdir(), "elastic-ckpt-*")):
        st = os.path.join(d, "train_state.json")
        if os.path.exists(st) and os.path.getmtime(st) >= since:
            with open(st) as f:
                if json.load(f).get("step") == step:
                    return d
    return None


def test_crash_during_checkpoint_write_resumes_from_previous(tmp_path):
    corpus = make_text_corpus(tmp_path / "corpus")
    store = tmp_path / "runs"
    run = store / "crash"
    ov = small_run_overrides(store, "crash", corpus, STEPS)
    with open(tmp_path / "first.log", "w") as log:
        p = _job(ov, {"ELASTIC_FAULT_CKPT_DELAY": "rank=1,step=4,seconds=300"}, log)
        t0 = time.time()
        rank0_dir = None
        while time.time() < t0 + 300 and rank0_dir is None:
            assert p.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            rank0_dir = _rank0_partial(t0, step=4)
            time.sleep(0.5)
        assert rank0_dir is not None, "rank 0 never wrote its part of checkpoint 4"
        time.sleep(1)
        assert (run / "step_00000002").is_dir() and not (run / "step_00000004").exists()
        _kill_tree(p)
    partial = run / "step_00000004"
    shutil.copytree(rank0_dir, partial)
    assert "__0_0.distcp" in os.listdir(partial) and "__1_0.distcp" not in os.listdir(partial)

    with open(tmp_path / "second.log", "w") as log:
        p2 = _job(ov, {}, log)
        assert p2.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
    starts = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert [s["step"] for s in starts] == [0, 2]  # resumed from the previous good checkpoint
    assert "step_00000002" in starts[1]["resumed_from"]
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
    assert sorted(set(steps)) == list(range(1, STEPS + 1))
    acc = analyze(str(run))
    assert [r["cause"] for r in acc["restarts"]] == ["relaunch"] and acc["restarts"][0]["steps_redone"] == 2
    check = ledger.check(str(run / "ledger.jsonl"), 8, STEPS)
    assert check["ok"], check
    assert (run / f"step_{STEPS:08d}" / "__1_0.distcp").exists()
