"""A user's ray.data.Dataset trains through the Python API and resumes exactly.

Run "a" trains uninterrupted on the Dataset. Run "b" trains on the same Dataset in a separate
driver process (with a private Ray instance, so it trains beside run a) that is SIGKILLed, its
instance with it, once its step-3 checkpoint exists; relaunched in this process
with the Dataset built in a *different* row order (what an unordered or non-deterministic
pipeline could give on a second execution), it must still finish with exactly run a's samples,
steps and losses: the first launch froze the Dataset's order in `<run>/source`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from elastic.config import load_config
from elastic.data import DataError
from elastic.data.ray_dataset import snapshot_dataset
from elastic.launch.pretrain import run_pretraining
from tests.helpers import WORDS, ledger_by_step, read_jsonl, small_run_overrides

STEPS, KILL_AFTER = 8, 3  # 8: enough steps after the kill at 3 for the resume to matter


def _rows(n=120, seed=0):
    rng = np.random.default_rng(seed)
    return [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(5, 200)))), "n": i} for i in range(n)]


def _overrides(store, name, **extra):
    o = small_run_overrides(store, name, "unused", STEPS, **{"checkpoint.every_steps": 1, **extra})
    return [x for x in o if not x.startswith(("data.source=", "data.glob="))]




DRIVER = r"""
import sys, ray
sys.path.insert(0, sys.argv[1])
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # a private instance
from tests.test_ray_dataset_source import _rows, _overrides
from elastic.config import load_config
from elastic.launch.pretrain import run_pretraining
run_pretraining(load_config(None, _overrides(sys.argv[2], "b")), dataset=ray.data.from_items(_rows()), progress=False)
"""


def test_user_dataset_trains_and_resumes_exactly_after_a_kill(ray_local, tmp_path):
    import ray

    store = tmp_path / "runs"
    # Run b's first driver (its own process and private Ray instance) trains beside run a, and is
    # SIGKILLed, with its instance, once its step-3 checkpoint exists.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.Popen([sys.executable, "-c", DRIVER, repo, str(store)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = store / "b" / f"step_{KILL_AFTER:08d}" / "train_state.json"
    alive_at_kill = []

    def kill_at_checkpoint():
        deadline = time.time() + 240
        while time.time() < deadline and not ck.exists() and p.poll() is None:
            time.sleep(0.2)
        alive_at_kill.append(p.poll() is None)
        try:
            tree = [p.pid] + [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    killer = threading.Thread(target=kill_at_checkpoint, daemon=True)
    killer.start()
    try:
        a = run_pretraining(load_config(None, _overrides(store, "a")), dataset=ray.data.from_items(_rows()), progress=False)
    finally:
        killer.join(timeout=300)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert a.summary["last_step"] == STEPS
    assert alive_at_kill == [True], "the driver of run b ended before it could be killed"
    assert ck.exists()

    shuffled = ray.data.from_items(list(reversed(_rows())))  # a different order on purpose
    b = run_pretraining(load_config(None, _overrides(store, "b")), dataset=shuffled, progress=False)
    assert b.summary["last_step"] == STEPS

    la, lb = ledger_by_step(store / "a" / "ledger.jsonl"), ledger_by_step(store / "b" / "ledger.jsonl")
    assert lb == la  # the same samples, in the same steps, on the same ranks
    ma = {r["step"]: r for r in read_jsonl(store / "a" / "metrics.jsonl")}
    mb = {r["step"]: r for r in read_jsonl(store / "b" / "metrics.jsonl")}  # the last record of each step
    assert sorted(mb) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([mb[s]["loss"] for s in sorted(ma)], [ma[s]["loss"] for s in sorted(ma)], rtol=1e-6)
    starts = [e["step"] for e in read_jsonl(store / "b" / "events.jsonl") if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 1  # resumed from a checkpoint, not from scratch


def test_snapshot_keeps_the_dataset_order_and_is_written_once(ray_local, tmp_path):
    import pyarrow.parquet as pq
    import ray

    rows = _rows(300)
    ds = ray.data.from_items(rows, override_num_blocks=7).map_batches(lambda b: b, batch_size=16)
    dest = str(tmp_path / "snap")
    rec = snapshot_dataset(ds, dest, "text", min_rows_per_file=50)
    files = sorted(f for f in os.listdir(dest) if f.endswith(".parquet"))
    got = [t for f in files for t in pq.read_table(os.path.join(dest, f)).column("text").to_pylist()]
    assert got == [r["text"] for r in rows] and rec["rows"] == 300 and rec["files"] == len(files) > 1
    before = {f: os.path.getmtime(os.path.join(dest, f)) for f in files}
    again = snapshot_dataset(ray.data.from_items(rows[:10]), dest, "text")  # a finished snapshot is kept
    assert again == rec and {f: os.path.getmtime(os.path.join(dest, f)) for f in files} == before


def test_a_dataset_without_the_text_column_is_one_line(ray_local, tmp_path):
    import ray

    with pytest.raises(DataError, match=r"no column 'text' \(data.text_field\); its columns are \['body'\]"):
        snapshot_dataset(ray.data.from_items([{"body": "x"}]), str(tmp_path / "s"), "text")
