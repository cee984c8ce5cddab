"""Unit guards of the asynchronous checkpoint machinery (elastic/train/checkpoint.py) that need no
Ray cluster: the agreement collective's device, failure propagation, fault injection, and the
clean-up of local stage directories left by dead processes. The end-to-end behaviour (saves off
the critical path, a crash inside a background write) is in tests/test_checkpoint_crash.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future

import pytest
import torch

from elastic.train import checkpoint as ck
from elastic.train.comm import Comm


class RecordingComm(Comm):
    """The Comm of a model on `device`, whose all-gather records the tensor it is handed (and
    checks it like the real one) and answers with `reply`: every rank's [state, write seconds]."""

    def __init__(self, device, reply):
        super().__init__(device)
        self.reply, self.seen = reply, []

    def all_gather_(self, t):
        self.check(t, "all_gather")
        self.seen.append((t.device, t.dtype, tuple(t.shape)))
        return torch.tensor(self.reply, dtype=torch.float64)


def _checkpointer(tmp_path, comm):
    return ck.Checkpointer(2, (), run_dir=str(tmp_path), comm=comm, async_save=True)


def _pending(result=None, exc=None):
    f = Future()
    if exc is not None:
        f.set_exception(exc)
    elif result is not None:
        f.set_result(result)
    return ck._Save(4, "step_00000004", "/nowhere", {}, f)


def test_the_agreement_collective_runs_on_the_model_device(tmp_path):
    """Under NCCL a host tensor in a collective raises at run time; on this CPU machine a model on
    the meta device stands for the GPU: the agreement's tensor must be made on it, by the Comm."""
    with torch.device("meta"):
        model = torch.nn.Linear(2, 2)
    comm = RecordingComm(Comm.of(model).device, [[1.0, 0.5], [1.0, 0.7]])
    c = _checkpointer(tmp_path, comm)
    c._pending = _pending(result=0.5)
    assert c._agree() == (True, 0.7)  # every rank done; the slowest rank's write seconds
    assert comm.seen == [(torch.device("meta"), torch.float64, (2,))]
    c._pending = _pending()  # still writing here: nobody registers
    comm.reply = [[0.0, 0.0], [1.0, 0.7]]
    assert c._agree() == (False, 0.7)
    assert comm.seen[-1][0] == torch.device("meta")
    c.close()


def test_a_failed_write_anywhere_fails_every_rank(tmp_path):
    comm = RecordingComm(torch.device("cpu"), [[1.0, 0.5], [-1.0, 0.0]])
    c = _checkpointer(tmp_path, comm)
    c._pending = _pending(result=0.5)  # this rank's write went fine, rank 1's did not
    with pytest.raises(RuntimeError, match=r"checkpoint step_00000004: the write failed on rank\(s\) \[1\]"):
        c._agree()
    assert c._pending is None
    comm.reply = [[-1.0, 0.0], [0.0, 0.0]]
    c._pending = _pending(exc=OSError("disk full"))  # this rank's own error is the one raised
    with pytest.raises(OSError, match="disk full"):
        c._agree()
    c.close()


def test_no_collective_while_nothing_is_pending(tmp_path):
    comm = RecordingComm(torch.device("cpu"), [[1.0, 0.0]])
    c = _checkpointer(tmp_path, comm)
    assert c.poll() is None and c.finish() == 0.0 and comm.seen == []
    c.close()


def test_fault_delay_targets_one_rank_and_step_and_fires_once(tmp_path, monkeypatch):
    marker = tmp_path / "fired"
    monkeypatch.setenv("ELASTIC_FAULT_CKPT_DELAY", f"rank=1,step=4,seconds=7.5,once={marker}")
    assert ck.fault_delay_s(4, 0) == 0.0 and ck.fault_delay_s(2, 1) == 0.0 and not marker.exists()
    assert ck.fault_delay_s(4, 1) == 7.5 and marker.exists()
    assert ck.fault_delay_s(4, 1) == 0.0  # a restarted worker writes normally
    monkeypatch.setenv("ELASTIC_FAULT_CKPT_DELAY", "rank=1,step=4,seconds=3")
    assert ck.fault_delay_s(4, 1) == ck.fault_delay_s(4, 1) == 3.0
    monkeypatch.delenv("ELASTIC_FAULT_CKPT_DELAY")
    assert ck.fault_delay_s(4, 1) == 0.0


def test_stage_dirs_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    gone = tmp_path / f"{ck.STAGE_PREFIX}{dead_pid}-abc"
    mine = tmp_path / f"{ck.STAGE_PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for d in (gone, mine, other):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
    assert ck.sweep_stale_stages(str(tmp_path)) == [gone.name]
    assert not gone.exists() and mine.exists() and other.exists()


def test_a_crashed_attempts_partial_dirs_are_swept_by_rank_0(tmp_path):
    (tmp_path / "step_00000004.partial").mkdir()
    (tmp_path / "step_00000002").mkdir()
    c = ck.Checkpointer(2, (), run_dir=str(tmp_path), comm=Comm(torch.device("cpu")), async_save=False)
    assert sorted(os.listdir(tmp_path)) == ["step_00000002"]
    c.close()


def test_save_local_cleans_up_when_the_write_fails(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(Exception):
        ck.save_local(object(), object(), {"step": 1})  # not a model: fails inside the save
    assert os.listdir(tmp_path) == []


def test_remote_and_local_run_dirs():
    assert ck.is_remote("s3://bucket/runs/x") and ck.is_remote("gs://b/x")
    assert not ck.is_remote("/runs/x") and not ck.is_remote("file:///runs/x")


class _Torch211Stager:
    """torch 2.11's DefaultStager as it behaves (pytorch#183413): every stage ends by closing its
    inner StateDictStager, which empties the deepcopy dispatch table it needs for the next one."""

    def __new__(cls):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        class Stager(DefaultStager):
            def _stage(self, state_dict, **kwargs):
                out = super()._stage(state_dict, **kwargs)
                self._state_dict_stager.close()
                return out

        return Stager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                     use_async_staging=False, use_non_blocking_copy=False))


def test_a_stager_closed_by_its_own_stage_is_detected_and_would_fail_the_next_save():
    """The first GPU run (torch 2.11) failed every job at its second save with
    `KeyError: <class 'type'>`: the closed stager cannot copy a class object (the optimizer's
    state holds none on CPU here, so the test stages one directly)."""
    fresh = ck._make_stager(False)
    sd = {"w": torch.ones(3), "kind": torch.Tensor}
    assert ck.stager_reusable(fresh)
    fresh.stage(sd)
    assert ck.stager_reusable(fresh)  # this torch (2.13) keeps it
    closed = _Torch211Stager()
    closed.stage(sd)
    assert not ck.stager_reusable(closed)
    with pytest.raises(KeyError):
        closed.stage(sd)


@pytest.mark.parametrize("torch_211", [False, True])
def test_an_async_save_replaces_a_stager_that_cannot_stage_again(tmp_path, monkeypatch, torch_211):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    if torch_211:
        monkeypatch.setattr(ck, "_make_stager", lambda cuda: _Torch211Stager())
    c = ck.Checkpointer(2, (), run_dir=str(tmp_path), comm=Comm.of(model), async_save=True)
    try:
        c.save(model, opt, ck.TrainState(step=2), {})
        assert (c._stager is None) == torch_211  # the next save builds a fresh one
        assert c._pending.future.result() > 0  # the write of the staged copy still completes
    finally:
        c.close()


def _every_s_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        comm = Comm(torch.device("cpu"))
        off = ck.Checkpointer(50, (), run_dir=f"{out}.off{rank}", comm=comm, async_save=False)
        on = ck.Checkpointer(50, (), run_dir=f"{out}.on{rank}", comm=comm, async_save=False, every_s=1e6)
        res = {"off": [off.due(3, False), off.due(50, False), off.due(7, True)]}
        # rank 1's own clock says "late", rank 0's does not: nobody saves
        if rank == 1:
            on._last_save_t -= 2e6
        res["rank1_late"] = on.due(2, False)
        # rank 0's clock says late (rank 1's no longer does): every rank saves
        on._last_save_t = time.monotonic() - (2e6 if rank == 0 else 0.0)
        res["rank0_late"] = on.due(3, False)
        comm.barrier()
        torch.save(res, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_every_s_saves_by_rank_0s_clock_and_every_rank_follows(tmp_path):
    """checkpoint.every_s in a real 2-process gloo group: rank 0 votes once every_s seconds have
    passed since its last save and the max over ranks decides, so a rank whose own clock says
    otherwise takes the same branch (a save is collective: ranks that disagree would hang); with
    every_s off, due() is the step rule alone."""
    import torch.multiprocessing as mp

    world, out = 2, str(tmp_path / "res")
    mp.spawn(_every_s_worker, args=(world, f"file://{tmp_path / 'rdzv'}", out), nprocs=world, join=True)
    for rank in range(world):
        r = torch.load(f"{out}.{rank}")
        assert r["off"] == [False, True, True]
        assert r["rank1_late"] is False and r["rank0_late"] is True


def test_every_s_is_checked_before_any_work():
    from elastic.config.errors import ConfigError
    from elastic.config.load import load_config

    with pytest.raises(ConfigError, match="checkpoint.every_s"):
        load_config(None, ["checkpoint.every_s=-1"])
