"""A crash while a checkpoint is being written never spoils the last complete one, and the run
resumes from it: with asynchronous saves (the default), the crash lands in the background write
while training has already gone on.

Fault injection (ELASTIC_FAULT_CKPT_DELAY, elastic/train/checkpoint.py) stalls rank 1 inside its
write of checkpoint 4 (before any of its data is written; with `once=`, only the first time).
Rank 0's write waits in DCP's collectives for rank 1's, so neither `.metadata` nor a `step_4`
directory ever appears: rank 0's shard sits in `step_00000004.partial/`. Training goes on to
step 5 meanwhile (the save is off the critical path); the last step's save then waits for it.

1. One worker is SIGKILLed in that state. Ray Train restarts the worker group within the same
   job, from the last *registered* checkpoint (step 2); the run finishes with the losses and the
   final weights of an undisturbed run (which saves synchronously: asynchronous saves resume
   exactly like synchronous ones), every sample trained exactly once.
2. The whole job (driver, its Ray cluster, every worker) is SIGKILLed in that state and launched
   again: it resumes from step 2, clears the half-written directory and finishes.
"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import torch

from elastic.launch import ledger
from elastic.report.recovery import analyze
from elastic.model.dcp_io import read_model_state
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


def _registered(run):
    """The checkpoint Ray Train resumes from (its controller's persisted snapshot)."""
    try:
        snap = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
        return (snap.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    except (OSError, ValueError):
        return None


def _steps_done(run):
    return {r["step"] for r in read_jsonl(run / "metrics.jsonl")} if (run / "metrics.jsonl").exists() else set()


def _save_started(run, step):
    """Whether rank 0 recorded the start of `step`'s checkpoint (it trained the step)."""
    events = run / "events.jsonl"
    return events.exists() and any(e["event"] == "checkpoint_start" and e["step"] == step
                                   for e in read_jsonl(events))


def _wait_inside_write_of_4(p, run, marker, log):
    """Until rank 1 stalls in its write of checkpoint 4, step 5 has been trained meanwhile, step 6
    has been trained and its save has begun (it waits for checkpoint 4), and checkpoint 2 is
    registered. Waiting for step 6's save to begin, not a fixed second, keeps the steps redone
    (3..6) the same on a busy machine: CI once killed the worker before step 6 had trained."""
    t0 = time.time()
    while time.time() < t0 + 300:
        assert p.poll() is None, log.read_text()[-3000:]
        if (marker.exists() and 5 in _steps_done(run) and _registered(run) == "step_00000002"
                and _save_started(run, STEPS)):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("never reached: rank 1 inside checkpoint 4, step 5 trained\n" + log.read_text()[-3000:])
    time.sleep(1)
    assert 6 not in _steps_done(run)  # the last step's save waits for checkpoint 4
    assert not (run / "step_00000004").exists()
    partial = os.listdir(run / "step_00000004.partial")
    assert "__0_0.distcp" in partial and "__1_0.distcp" not in partial and ".metadata" not in partial, partial


def _checks_after_recovery(run, redone):
    starts = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert [s["step"] for s in starts] == [0, 2]  # resumed from the previous complete checkpoint
    assert starts[1]["resumed_from"].endswith("step_00000002")
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
    assert sorted(set(steps)) == list(range(1, STEPS + 1))
    acc = analyze(str(run))
    # step 6 trained (its checkpoint_start is recorded) and waited for checkpoint 4: 3..6 are redone
    assert [r["steps_redone"] for r in acc["restarts"]] == [redone], acc["restarts"]
    check = ledger.check(str(run / "ledger.jsonl"), 8, STEPS)
    assert check["ok"], check
    assert sorted(n for n in os.listdir(run) if n.startswith("step_")) == ["step_00000004", "step_00000006"]
    assert _registered(run) == "step_00000006"
    return acc


def _final_losses(run):
    final = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        final[r["step"]] = r["loss"]
    return [final[s] for s in range(1, STEPS + 1)]


def test_worker_or_job_killed_during_async_write_resumes_from_the_previous_checkpoint(tmp_path):
    """Cases 1 and 2 of the module docstring, and the undisturbed reference run, side by side: three
    independent jobs (each with its own private Ray instance and run directory) whose time is
    mostly start-up and waiting, so they overlap instead of queueing."""
    corpus = make_text_corpus(tmp_path / "corpus")
    store = tmp_path / "runs"
    ref = _job(small_run_overrides(store, "ref", corpus, STEPS, **{"checkpoint.async_save": "false"}), {},
               open(tmp_path / "ref.log", "w"))
    run, marker, log = store / "crash", tmp_path / "delay-fired", tmp_path / "crash.log"
    p = _job(small_run_overrides(store, "crash", corpus, STEPS),
             {"ELASTIC_FAULT_CKPT_DELAY": f"rank=1,step=4,seconds=300,once={marker}"}, open(log, "w"))
    jrun, jmarker, jlog = store / "jobkill", tmp_path / "jobkill-delay-fired", tmp_path / "jobkill-first.log"
    jov = small_run_overrides(store, "jobkill", corpus, STEPS)
    j = _job(jov, {"ELASTIC_FAULT_CKPT_DELAY": f"rank=1,step=4,seconds=300,once={jmarker}"}, open(jlog, "w"))
    p2 = None
    try:
        # 1. one worker SIGKILLed inside the write of checkpoint 4
        _wait_inside_write_of_4(p, run, marker, log)
        workers = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "worker" and e["rank"] == 1]
        os.kill(workers[-1]["pid"], signal.SIGKILL)
        # 2. the whole job SIGKILLed in the same state, and launched again
        try:
            _wait_inside_write_of_4(j, jrun, jmarker, jlog)
        finally:
            _kill_tree(j)
        p2 = _job(jov, {}, open(tmp_path / "jobkill-second.log", "w"))
        assert p.wait(timeout=600) == 0, log.read_text()[-3000:]
        assert ref.wait(timeout=600) == 0, (tmp_path / "ref.log").read_text()[-3000:]
        assert p2.wait(timeout=600) == 0, (tmp_path / "jobkill-second.log").read_text()[-3000:]
    finally:
        for job in (p, ref, j, p2):
            if job is not None and job.poll() is None:
                _kill_tree(job)

    # 1. Ray Train restarted the worker group within the job, from checkpoint 2.
    acc = _checks_after_recovery(run, redone=4)
    assert [r["cause"] for r in acc["restarts"]] == ["failure"]
    done = [e["step"] for e in read_jsonl(run / "events.jsonl") if e["event"] == "checkpoint_done"]
    assert done == [2, 4, 6]  # 4 only by the restarted group

    # The same result as the undisturbed (synchronously saving) run: per-step losses, and the
    # final checkpoint's weights and optimizer state, bit for bit.
    assert _final_losses(run) == _final_losses(store / "ref")
    a, b = read_model_state(str(run / "step_00000006")), read_model_state(str(store / "ref" / "step_00000006"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("__0_0.distcp", "__1_0.distcp"):
        assert (run / "step_00000006" / name).read_bytes() == (store / "ref" / "step_00000006" / name).read_bytes()

    # 2. The relaunch resumed from checkpoint 2, cleared the half-written directory and finished.
    acc = _checks_after_recovery(jrun, redone=4)
    assert [r["cause"] for r in acc["restarts"]] == ["relaunch"]
    assert (jrun / f"step_{STEPS:08d}" / "__1_0.distcp").exists()
