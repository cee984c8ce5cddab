"""`ray job submit` against a token-authenticated multi-node cluster, as users deploy it.

A real local cluster from scripts/local_cluster.sh (head with no CPUs, a CPU node offering
`driver`/`reward`, a trainer node offering `trainer`, token auth with a generated token in a
temp dir, every port chosen free, its own temp dir) receives the tiny pretraining job through
the Jobs API with the shipped jobs/runtime_env.yaml. Checked: the job succeeds and its
checkpoint is complete; requests without or with a wrong token are refused; `ray job stop`
on a running job leaves no train workers and the last checkpoint intact. Nothing is written
to ~/.ray, and only this cluster's processes are ever stopped (never `ray stop`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "local_cluster.sh"
BIN = Path(sys.executable).parent
RUNTIME_ENV = REPO / "jobs" / "runtime_env.yaml"

# Small and fast: 1 worker, 4 steps, a checkpoint every 2 steps, a 1 MB tokenizer sample.
TINY = ["--set", "scaling.min_workers=1", "--set", "scaling.max_workers=1",
        "--set", "scaling.resources_per_worker={trainer: 1}",
        "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4",
        "--set", "checkpoint.every_steps=2", "--set", "data.tokenizer_sample_mb=1",
        "--set", "wandb.mode=disabled"]
DRIVER = ["--entrypoint-num-cpus", "1", "--entrypoint-resources", '{"driver": 1}']


def _ray_cli() -> str:
    ray = BIN / "ray"
    return str(ray) if ray.exists() else shutil.which("ray") or "ray"


def _run(cmd: List[str], env: Dict[str, str], timeout: float, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_runtime_env_keeps_the_upload_small(tmp_path):
    """The package Ray builds from jobs/runtime_env.yaml excludes state and stays far below
    Ray's upload limit, even with .gitignore ignored (RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1)."""
    from ray._private.runtime_env import packaging

    env = yaml.safe_load(RUNTIME_ENV.read_text())
    assert env["working_dir"] == "."
    out = tmp_path / "pkg.zip"
    packaging.create_package(str(REPO), out, include_gitignore=False, excludes=env["excludes"])
    names = zipfile.ZipFile(out).namelist()
    assert "jobs/pretrain.py" in names and "elastic/config/schema.py" in names
    banned = (".git/", ".venv/", "runs/", "wandb/", "__pycache__/", ".pytest_cache/")
    leaked = [n for n in names if any(n.startswith(b) or f"/{b}" in n for b in banned) or n.endswith(".pyc")]
    assert not leaked, f"excluded paths in the upload: {leaked[:10]}"
    assert out.stat().st_size < min(50 * 2**20, packaging.GCS_STORAGE_MAX_SIZE // 4)


@pytest.fixture(scope="module")
def cluster():
    """Head (0 CPUs) + CPU node (driver, reward) + trainer node, token auth, all in a temp dir."""
    try:
        import aiohttp  # noqa: F401  (the Jobs API server and CLI need ray[default])
    except ImportError:
        pytest.fail("`ray job submit` needs ray[default] (aiohttp); pyproject.toml asks for it: rerun scripts/setup.sh")
    d = tempfile.mkdtemp(prefix="rdp-", dir="/tmp")  # short: Ray socket paths are length-limited
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Workers must import the uploaded working dir, not this checkout through PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != REPO)
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        env.pop(k, None)
    env.update(ELASTIC_CLUSTER_DIR=d, RAY=_ray_cli(), WANDB_MODE="disabled")
    try:
        for args in (["start"], ["add-node", "cpu", "--cpus", "2"], ["add-node", "trainer", "--cpus", "2"]):
            r = _run(["bash", str(SCRIPT), *args], env, timeout=180)
            assert r.returncode == 0, f"local_cluster.sh {args}: {r.stdout}\n{r.stderr}"
        lines = _run(["bash", str(SCRIPT), "env"], env, timeout=30).stdout.split()
        client = dict(env)
        client.update(kv.split("=", 1) for kv in lines if "=" in kv)
        assert client["RAY_AUTH_MODE"] == "token" and Path(client["RAY_AUTH_TOKEN_PATH"]).is_file()
        yield {"dir": Path(d), "env": env, "client": client, "address": client["RAY_ADDRESS"]}
    finally:
        _run(["bash", str(SCRIPT), "stop"], env, timeout=120)
        left = _run(["bash", str(SCRIPT), "pids"], env, timeout=30).stdout.split()
        shutil.rmtree(d, ignore_errors=True)
        assert not left, f"cluster processes survived stop: {left}"


def _submit(c, args: List[str], timeout: float, wait: bool = True, env=None) -> subprocess.CompletedProcess:
    cmd = [_ray_cli(), "job", "submit", "--address", c["address"], "--working-dir", ".",
           "--runtime-env", str(RUNTIME_ENV.relative_to(REPO)), *DRIVER]
    cmd += [] if wait else ["--no-wait"]
    return _run(cmd + ["--", "python", "jobs/pretrain.py", *args], env or c["client"], timeout)


def _evidence(c) -> str:
    """What a failed submission leaves on the cluster, for the assertion message: each
    unpacked working dir with its file count (and whether elastic/data/mixture.py is in it),
    and the log lines that name an import error. The fixture deletes the cluster dir after
    the module, so this is the only trace a CI failure keeps."""
    root = c["dir"]
    lines = []
    for pkg in sorted(root.glob("*/ray/session_*/runtime_resources/working_dir_files/*")):
        if pkg.is_dir():
            n = sum(1 for _ in pkg.rglob("*.py"))
            lines.append(f"{pkg.parents[4].name}: unpacked {pkg.name}: {n} .py files, mixture.py={(pkg / 'elastic/data/mixture.py').exists()}")
    for log in sorted(root.glob("head/ray/session_*/logs/*")):  # every node logs here (symlinks)
        if log.is_file() and log.suffix in (".out", ".err", ".log"):
            text = log.read_text(errors="replace")
            hits = [ln for ln in text.splitlines() if "ModuleNotFoundError" in ln or "ImportError" in ln]
            lines += [f"{log.name}: {h[:300]}" for h in hits[:3]]
    return "\n".join(lines[-40:]) or "(no unpacked working dir and no import errors in the Ray logs)"


def _status(c, job_id: str) -> str:
    """The job's status from the Jobs REST API, with the token as a bearer header."""
    import requests

    token = Path(c["client"]["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    r = requests.get(f"{c['address']}/api/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    return r.json()["status"]


def _job_id(out: str) -> str:
    for tok in out.replace("'", " ").split():
        if tok.startswith("raysubmit_"):
            return tok
    raise AssertionError(f"no submission id in: {out[-500:]}")


def _complete_checkpoint(run_dir: Path):
    from elastic.train.checkpoint import latest_complete

    return latest_complete(str(run_dir))


def _assert_loadable(ckpt: str, tmp: Path) -> int:
    """All shards and metadata of a DCP checkpoint read back; returns its step."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from elastic.train.checkpoint import read_train_state

    dcp_to_torch_save(ckpt, str(tmp / "full.pt"))
    assert (tmp / "full.pt").stat().st_size > 0
    step = read_train_state(ckpt)["step"]
    assert Path(ckpt).name == f"step_{step:08d}"
    return step


def test_unauthenticated_submissions_are_refused(cluster):
    no_token = {k: v for k, v in cluster["client"].items() if not k.startswith("RAY_AUTH")}
    no_token["RAY_AUTH_MODE"] = "disabled"  # explicit: never fall back to a ~/.ray/auth_token
    wrong = dict(no_token, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
    for env, expect in ((no_token, "Unauthorized"), (wrong, "Forbidden")):
        r = _submit(cluster, ["--set", "run.name=must-not-run"], timeout=60, wait=False, env=env)
        assert r.returncode != 0 and expect in r.stdout + r.stderr, (r.stdout[-800:], r.stderr[-800:])
    listing = _run([_ray_cli(), "job", "list", "--address", cluster["address"]], cluster["client"], 60)
    assert listing.returncode == 0 and "must-not-run" not in listing.stdout


@pytest.mark.slow
def test_submit_tiny_pretraining_succeeds_with_a_checkpoint(cluster, tmp_path):
    runs = cluster["dir"] / "runs"
    args = TINY + ["--set", "train.steps=4", "--set", f"run.storage_path={runs}", "--set", "run.name=e2e"]
    r = _submit(cluster, args, timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"ray job submit failed (rc {r.returncode}):\n{out[-4000:]}\n{_evidence(cluster)}"
    assert _status(cluster, _job_id(out)) == "SUCCEEDED"
    run_dir = runs / "e2e"
    assert f"run directory: {run_dir}" in out, "the job log names the run directory"
    found = _complete_checkpoint(run_dir)
    assert found, f"no complete checkpoint in {run_dir}: {sorted(os.listdir(run_dir))}"
    assert _assert_loadable(found[0], tmp_path) == 4


@pytest.mark.slow
def test_job_stop_leaves_no_train_workers_and_an_intact_checkpoint(cluster, tmp_path):
    runs = cluster["dir"] / "runs"
    run_dir = runs / "e2e-stop"
    args = TINY + ["--set", "train.steps=100000", "--set", f"run.storage_path={runs}", "--set", "run.name=e2e-stop"]
    r = _submit(cluster, args, timeout=120, wait=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    job_id = _job_id(r.stdout + r.stderr)

    deadline, found = time.time() + 300, None
    while time.time() < deadline and not found:
        assert _status(cluster, job_id) in ("PENDING", "RUNNING"), _status(cluster, job_id)
        found = _complete_checkpoint(run_dir) if run_dir.exists() else None
        time.sleep(2)
    assert found, "no checkpoint within 5 minutes"
    assert _train_actors(cluster), "train workers should be running before the stop"

    r = _run([_ray_cli(), "job", "stop", "--address", cluster["address"], job_id], cluster["client"], 120)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]
    assert _status(cluster, job_id) == "STOPPED"

    deadline = time.time() + 60
    while time.time() < deadline and (_train_actors(cluster) or _train_processes(cluster)):
        time.sleep(2)
    assert not _train_actors(cluster), "train actors alive after ray job stop"
    assert not _train_processes(cluster), "train worker processes left after ray job stop"

    last = _complete_checkpoint(run_dir)
    assert last and last[0] >= found[0], (found, last)
    _assert_loadable(last[0], tmp_path)


def _train_actors(c) -> List[dict]:
    """ALIVE Ray Train actors (controller and workers) of this cluster, via the state API."""
    r = _run([_ray_cli(), "list", "actors", "--address", c["address"], "--format", "json", "--limit", "10000",
              "--filter", "state=ALIVE"], c["client"], 60)
    assert r.returncode == 0, r.stderr[-1000:]
    actors = json.loads(r.stdout[r.stdout.index("["):])
    return [a for a in actors if a.get("class_name") in ("RayTrainWorker", "TrainController")]


def _train_processes(c) -> List[str]:
    """This cluster's OS processes that still carry a Ray Train worker's title."""
    pids = _run(["bash", str(SCRIPT), "pids"], c["env"], 30).stdout.split()
    titles = []
    for pid in pids:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if title.startswith(("ray::RayTrainWorker", "ray::TrainController")):
            titles.append(f"{pid} {title}")
    return titles
