"""Launch safety and a quiet console, end to end through `jobs/pretrain.py` as users run it.

- Beside another program's private Ray instance, the job starts its own (never a process-
  scan attach), finishes, and leaves the other program alone; its console starts with the
  cluster line and has no Ray log lines, nothing repeated, and fits on a screen.
- A cluster started with `ray start` on this machine is joined; one too small for the run is
  reported in one line after a bounded wait.
- Two launches of one run: the second refuses in one line before any worker starts and the
  first finishes; after a SIGKILL, the relaunch takes over the stale lease and resumes.

Every job gets RAY_TMPDIR of its own, so the `ray start` record it consults is the test's,
never the machine's, and RAY_ADDRESS is removed: the job resolves its cluster by itself.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import pytest

from elastic.launch.runtime.local_cluster import LocalCluster
from elastic.train.checkpoint import latest_complete
from tests.conftest import REPO
from tests.helpers import make_text_corpus, read_jsonl, small_run_overrides

RAY_LOG_LINE = re.compile(r"WARNING|ERROR|Traceback|\(\w+ pid=\d+|\(pid=\d+| [WE] \d+ \d+\]|Failed to query|may hang forever")


_TMPDIRS: List[str] = []


@pytest.fixture(autouse=True)
def _remove_ray_tmpdirs():
    yield
    while _TMPDIRS:
        shutil.rmtree(_TMPDIRS.pop(), ignore_errors=True)


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    _TMPDIRS.append(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths are length-limited
    env.update(RAY_TMPDIR=_TMPDIRS[-1], WANDB_MODE="disabled")
    env.update(extra or {})
    return env


def _args(overrides: List[str]) -> List[str]:
    args = [sys.executable, str(REPO / "jobs" / "pretrain.py")]
    for o in overrides:
        args += ["--set", o]
    return args


def _run(overrides: List[str], env: Dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(_args(overrides), capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def _start(overrides: List[str], env: Dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(_args(overrides), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def _kill_tree(proc: subprocess.Popen) -> None:
    procs = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _wait(cond, what: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        assert proc.poll() is None, f"job exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def _registered(run: Path) -> Optional[str]:
    """The checkpoint Ray Train resumes from: its controller's persisted snapshot in the run
    dir (a checkpoint whose files are complete but that the controller has not registered
    yet is not used)."""
    try:
        snap = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
        return (snap.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    except (OSError, ValueError):
        return None


OTHER = """
import os, sys, time, ray
ray.init(address="local", num_cpus=1, include_dashboard=False)
print("address", ray.get_runtime_context().gcs_address, flush=True)

@ray.remote
def f(x):
    return x + 1

n = 0
while not os.path.exists(sys.argv[1]):
    n += ray.get(f.remote(0), timeout=60)
    time.sleep(0.5)
print("tasks", n, flush=True)
ray.shutdown()
"""


def test_job_beside_another_programs_private_ray_starts_its_own_and_keeps_a_quiet_console(tmp_path):
    corpus = make_text_corpus(tmp_path / "corpus")
    stop = tmp_path / "stop"
    other = subprocess.Popen([sys.executable, "-c", OTHER, str(stop)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=_env(), start_new_session=True)
    try:
        first = other.stdout.readline()
        assert first.startswith("address "), f"the other program did not start Ray: {first!r}"
        other_addr = first.split()[1]
        job_env = _env()
        t_command = time.time()
        r = _run(small_run_overrides(tmp_path / "runs", "beside", corpus, 6), job_env)
        t_command = time.time() - t_command
        console = r.stdout + r.stderr
        assert r.returncode == 0, console[-4000:]
        assert other.poll() is None, "the other program died during the job"
    finally:
        stop.touch()
        out, _ = other.communicate(timeout=120)
    assert other.returncode == 0 and re.search(r"tasks (\d+)", out) and int(re.search(r"tasks (\d+)", out)[1]) >= 10, out

    lines = [ln for ln in console.splitlines() if ln.strip()]
    # What start-up waits for, when a phase takes more than 5 s (a loaded machine): one line each.
    waits = [ln for ln in lines if ln.startswith("[elastic] waiting for: ")]
    lines = [ln for ln in lines if ln not in waits]
    assert len(waits) <= 8, console
    assert lines[0].startswith("[elastic] ray: started a private local instance at "), lines[0]
    assert other_addr not in lines[0] and "no RAY_ADDRESS" in lines[0]
    noisy = [ln for ln in lines + waits if RAY_LOG_LINE.search(ln) or not ln.startswith("[elastic]")]
    assert not noisy, "Ray log lines on the console:\n" + "\n".join(noisy)
    repeated = [ln for ln, n in collections.Counter(lines + waits).items() if n > 1]
    assert not repeated, repeated
    assert any(ln.startswith("[elastic] step 6/6 (100%) loss ") for ln in lines), console
    done = [ln for ln in lines if ln.startswith("[elastic] done in ")]
    assert len(done) == 1 and "start-up " in done[0] and "first step done at " in done[0], console
    assert len(lines) <= 20, console

    # Start-up, from the command's start (the process's) to the first step's beginning and end.
    summary = json.loads((tmp_path / "runs" / "beside" / "summary.json").read_text())
    # Ray Train's controller polls its workers every 0.5 s, not its default 2 s (lean_train.POLL_S).
    first = next(e for e in read_jsonl(tmp_path / "runs" / "beside" / "events.jsonl") if e["event"] == "controller_state")
    assert first["from"] == "InitializingState" and first["poll_s"] == 0.5, first
    assert 0 < summary["startup_s"] <= summary["first_step_s"] <= summary["job_s"] < t_command, (summary, t_command)

    # Ray's services that one machine cannot use are not started (cluster.PRIVATE_TRAIN_ENV,
    # PRIVATE_SKIPPED_DAEMONS, PRIVATE_SYSTEM_CONFIG; runtime/lean_train.py).
    actors = {ln.split(":actor_name:", 1)[1].strip() for p in Path(job_env["RAY_TMPDIR"]).rglob("worker-*.out")
              for ln in p.read_text(errors="replace").splitlines()[:3] if ln.startswith(":actor_name:")}
    assert {"TrainController", "RayTrainWorker"} <= actors, actors
    assert not {"PreemptionWatcher", "PlacementGroupCleaner", "DatasetManager"} & actors, actors
    logs = [p.name for p in Path(job_env["RAY_TMPDIR"]).rglob("*.log")]
    assert not [n for n in logs if n.startswith(("monitor.", "log_monitor."))], logs
    idle = [p.name for p in Path(job_env["RAY_TMPDIR"]).rglob("worker-*-ffffffff-*.out")]  # prestarted, no job
    assert not idle, idle


def test_ray_start_cluster_is_joined_and_a_too_small_one_is_reported_in_one_line(tmp_path):
    corpus = make_text_corpus(tmp_path / "corpus")
    cluster = LocalCluster(head_cpus=2).start()
    try:
        recorded = open(cluster.record).read().strip()  # what `ray start` recorded (the node's own IP)
        port = cluster.address.rsplit(":", 1)[1]
        assert recorded.endswith(f":{port}")
        env = _env(cluster.env)  # cluster.env carries its RAY_TMPDIR: the job finds that record
        t0 = time.time()
        big = _run(small_run_overrides(tmp_path / "runs", "big", corpus, 4, **{"scaling.resource_wait_s": 3}), env)
        assert big.returncode == 4, big.stdout + big.stderr
        assert time.time() - t0 < 120
        err = [ln for ln in big.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith(f"cluster error: the cluster at {recorded} cannot hold"), big.stderr
        joined = f"[elastic] ray: joined the cluster started with `ray start` on this machine at {recorded} (recorded in {cluster.record})"
        assert big.stdout.splitlines()[0] == joined
        assert "2 train workers x {CPU: 1} plus a data packer {CPU: 1}" in err[0]
        assert "after waiting 3s (scaling.resource_wait_s): CPU 3 needed, the cluster has 2" in err[0]
        assert not (tmp_path / "runs" / "big" / "lease.json").exists()  # released on the way out

        one = {"scaling.min_workers": 1, "scaling.max_workers": 1}
        r = _run(small_run_overrides(tmp_path / "runs", "small", corpus, 4, **one), env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert r.stdout.splitlines()[0] == joined
        assert not r.stderr.strip(), r.stderr
        assert latest_complete(str(tmp_path / "runs" / "small"))[0].endswith("step_00000004")
    finally:
        cluster.stop()


def test_stops_by_sigterm_ctrl_c_and_sigkill_each_resume_and_a_second_launch_of_the_live_run_refuses(tmp_path):
    """One run, launched four times (one set of launches instead of three tests' six):

    - a scheduler's SIGTERM (to the driver alone, as `timeout` or `ray job stop` send it) and a
      terminal's Ctrl-C (SIGINT to the whole process group): each ends the job with one line naming
      the checkpoint a relaunch resumes from and the command, exit code 143 / 130, the run's lease
      released, and none of Ray's signal-handler output; each relaunch resumes there;
    - a SIGKILL (the whole process tree) leaves the lease behind; the relaunch takes over the
      stale lease and resumes from the last registered checkpoint;
    - while that relaunch is live, a second launch of the same run refuses in one line before any
      worker starts, and the live one finishes: every sample trained on exactly once, no start
      but the four launches', the lease released."""
    from elastic.launch import ledger

    corpus = make_text_corpus(tmp_path / "corpus")
    run = tmp_path / "runs" / "stopped"
    lease = run / "lease.json"
    ov = small_run_overrides(tmp_path / "runs", "stopped", corpus, 10)
    for sig, stall_at, resume_at, code in ((signal.SIGTERM, 4, 2, 143), (signal.SIGINT, 6, 4, 130)):
        log = tmp_path / f"{sig.name}.log"
        # Rank 1 stalls inside a checkpoint, so the job is alive right after the one before it.
        job = _start(ov, _env({"ELASTIC_FAULT_CKPT_DELAY": f"rank=1,step={stall_at},seconds=300"}), log)
        try:
            _wait(lambda: _registered(run) == f"step_{resume_at:08d}", f"checkpoint {resume_at} registered", job, log)
            if sig == signal.SIGINT:
                os.killpg(job.pid, sig)  # Ctrl-C: the terminal signals the foreground process group
            else:
                os.kill(job.pid, sig)
            assert job.wait(timeout=120) == code, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                _kill_tree(job)
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        assert lines[-1].startswith(f"[elastic] stopped by {sig.name}; the relaunch resumes from "
                                    f"{run / f'step_{resume_at:08d}'}. Resume with: "), lines[-1]
        assert "jobs/pretrain.py --set run.storage_path=" in lines[-1]
        noisy = [ln for ln in lines if RAY_LOG_LINE.search(ln) or "SIGTERM received" in ln or "logging.cc" in ln
                 or not ln.startswith("[elastic]")]
        assert not noisy, "\n".join(noisy)
        assert sum("stopped by" in ln for ln in lines) == 1
        assert not lease.exists()  # released on the way out

    # SIGKILL: rank 1 stalls inside checkpoint 8, so the run is reliably alive after checkpoint 6.
    log = tmp_path / "SIGKILL.log"
    killed = _start(ov, _env({"ELASTIC_FAULT_CKPT_DELAY": "rank=1,step=8,seconds=300"}), log)
    try:
        _wait(lambda: _registered(run) == "step_00000006", "checkpoint 6 registered by Ray Train", killed, log)
    finally:
        _kill_tree(killed)
    assert lease.exists()  # SIGKILL: nobody released it

    # The relaunch takes the stale lease over; a second launch while it is live refuses.
    log = tmp_path / "relaunch.log"
    first = _start(ov, _env(), log)
    try:
        _wait(lambda: lease.exists() and f'"pid": {first.pid},' in lease.read_text(), "the relaunch's lease", first, log)
        t0 = time.time()
        second = _run(ov, _env(), timeout=120)
        took = time.time() - t0
        assert first.poll() is None
        assert first.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if first.poll() is None:
            _kill_tree(first)
    assert second.returncode == 3, second.stdout + second.stderr
    out = [ln for ln in (second.stdout + second.stderr).splitlines() if ln.strip()]
    assert len(out) == 1, out  # the refusal alone: no cluster line, no worker ever started
    assert out[0].startswith(f"run error: run directory {run} is in use by a live run: pid {first.pid} on host ")
    assert took < 60

    console = log.read_text()
    assert f"[elastic] lease: took over a stale lease (pid {killed.pid} on " in console
    assert f"[elastic] run directory: {run} (existing run, latest checkpoint step_00000006)" in console
    assert "[elastic] workers: 2 started, resuming at step 6 " in console
    starts = [e["step"] for e in read_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert starts == [0, 2, 4, 6]  # the refused launch never started a worker
    assert latest_complete(str(run))[0].endswith("step_00000010")
    chk = ledger.check(str(run / "ledger.jsonl"), 8, 10)
    assert chk["ok"], chk  # only the live run trained: every sample exactly once
    assert not lease.exists()
