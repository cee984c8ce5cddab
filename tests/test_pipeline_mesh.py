"""Pipeline stages on the worker's one mesh (elastic/train/mesh.py WorkerMesh, loop.build_sharded_model,
pipeline.pipeline_train_step) over real gloo ranks: PP 2 x DP 2 (each stage FSDP-sharded over
its two data-parallel ranks), PP 2 x TP 2 (each stage tensor-parallel inside) and PP 2 with two
interleaved virtual stages per rank train two
steps exactly like one process on the whole batch: the same loss sums and gradient norms
(accumulated over two micro-batches, a tied embedding's two copies summed once), and the
same weights after the updates."""

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elastic.config import from_dict

BASE = {"model": {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64}, "data": {"vocab_size": 300, "seq_len": 16},
        "train": {"global_batch_size": 8, "micro_batch_size": 2}}
STEPS = 2


def _cfg(n_layers: int, parallel: dict, workers: int):
    return from_dict({**BASE, "model": {**BASE["model"], "n_layers": n_layers}, "parallel": parallel,
                      "scaling": {"min_workers": workers, "max_workers": workers}})


def _batch(step: int):
    """8 packed rows of two documents each (positions restart; the last token of each has no target)."""
    g = np.random.default_rng(step)
    tok = g.integers(0, 300, (8, 16))
    cut = g.integers(4, 12, 8)
    ar = np.tile(np.arange(16), (8, 1))
    doc = (ar >= cut[:, None]).astype(np.int64)
    pos = np.where(doc == 0, ar, ar - cut[:, None])
    lab = np.full((8, 16), -100)
    same = doc[:, 1:] == doc[:, :-1]
    lab[:, :-1] = np.where(same, tok[:, 1:], -100)
    return {"tokens": tok, "labels": lab, "positions": pos, "doc_ids": doc}


def _split(rows, size):
    n = len(rows["tokens"])
    return [{k: v[i:i + size] for k, v in rows.items()} for i in range(0, n, size)]


def _full(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Without cpu_offload: every rank gets its stages' whole tensors (with it, global rank 0 only).
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _worker(rank: int, world: int, init: str, n_layers: int, parallel: dict, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        from elastic.train.comm import Comm
        from elastic.train.loop import build_sharded_model, pipeline_of, worker_mesh
        from elastic.train.optim import build_optimizer
        from elastic.train.pipeline import pipeline_train_step

        cfg = _cfg(n_layers, parallel, world)
        dev = torch.device("cpu")
        mesh = worker_mesh(cfg, dev)
        model, _, _ = build_sharded_model(cfg, dev, torch.float32, mesh)
        pipe = pipeline_of(model, cfg, mesh, dev)
        opt = build_optimizer(model, 0.01, 0.1, (0.9, 0.95), fused=False)
        lay = mesh.layout
        dp_comm = Comm(dev, group=mesh.dp_group())
        res = {"steps": [], "mesh": lay.describe()}
        for s in range(STEPS):
            rows = _batch(s)
            norm = float((rows["labels"] != -100).sum())
            mine = {k: v[lay.dp_rank(rank)::lay.dp] for k, v in rows.items()}  # this data-parallel rank's rows
            o = pipeline_train_step(pipe, opt, _split(mine, 2), norm, 0.5, dp_comm)
            res["steps"].append((o.stats["loss_sum"], o.grad_norm, o.skipped))
        res["params"] = {k: v.clone() for k, v in _full(model).items()}
        torch.save(res, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _reference(n_layers: int):
    from elastic.train.comm import Comm
    from elastic.train.loop import build_model
    from elastic.train.optim import build_optimizer
    from elastic.train.step import causal_lm_loss, train_step

    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/one", rank=0, world_size=1)
        try:
            model, _, _ = build_model(_cfg(n_layers, {}, 1), torch.device("cpu"))
            opt = build_optimizer(model, 0.01, 0.1, (0.9, 0.95), fused=False)
            steps = []
            for s in range(STEPS):
                rows = _batch(s)
                o = train_step(model, opt, _split(rows, 4), causal_lm_loss, float((rows["labels"] != -100).sum()), 0.5,
                               Comm(torch.device("cpu")))
                steps.append((o.stats["loss_sum"], o.grad_norm, o.skipped))
            return steps, {k: v.detach().clone() for k, v in model.state_dict().items()}
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("world,n_layers,parallel,mesh", [
    (4, 2, {"pp": 2, "pp_microbatches": 2}, "PP 2 x FSDP 2 shards"),
    (2, 4, {"pp": 2, "pp_microbatches": 2, "pp_virtual_stages": 2, "pp_schedule": "interleaved_1f1b"}, "PP 2 x FSDP 1 shard"),
    (4, 2, {"pp": 2, "tp": 2, "pp_microbatches": 2}, "PP 2 x FSDP 1 shard x TP 2"),
])
def test_pipelined_steps_on_the_mesh_equal_one_process(world, n_layers, parallel, mesh):
    want_steps, want_params = _reference(n_layers)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, f"file://{d}/rdzv", n_layers, parallel, f"{d}/res"), nprocs=world, join=True)
        got = [torch.load(f"{d}/res.{r}") for r in range(world)]
    params = {}
    for r, g in enumerate(got):
        assert g["mesh"] == mesh
        for (loss, norm, skipped), (wl, wn, _) in zip(g["steps"], want_steps):  # every rank logs the same values
            assert not skipped and loss == pytest.approx(wl, rel=1e-5) and norm == pytest.approx(wn, rel=1e-5), r
        params.update(g["params"])
    assert sorted(params) == sorted(want_params)  # the stages' names together are the whole model's
    # After two AdamW updates (lr 0.01): float summation order moves a few elements by up to
    # ~2e-5 (Adam's m / sqrt(v) magnifies tiny gradients' rounding); an update applied wrongly
    # (a tied gradient not summed, or summed twice) moves them by about the learning rate.
    for k, v in params.items():
        torch.testing.assert_close(v, want_params[k], rtol=1e-4, atol=1e-4, msg=k)
