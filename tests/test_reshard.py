"""A DCP checkpoint written by 4 workers in HSDP (2 replicas x 2 shards) loads at 1 worker and at
3 (FSDP) with identical state: checkpoints load at any data-parallel layout.

"Identical" is exact equality of the full (unsharded) model parameters and AdamW state
(step, exp_avg, exp_avg_sq): resharding moves bytes, it does no arithmetic.
"""

import glob
import os
import shutil

import torch

from elastic.config import from_dict
from elastic.train import checkpoint as ckpt_lib
from elastic.train.loop import build_sharded_model
from elastic.train.optim import build_optimizer
from tests.test_fsdp_equivalence import CFG, local_step

STEPS = 2


def _full_state(model, opt):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=o), "optim": get_optimizer_state_dict(model, opt, options=o)}


def reshard_worker(config):
    import ray.train
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model, _, _ = build_sharded_model(from_dict({**CFG, "parallel": {"dp_replicate": config.get("dp_replicate", 1)}}),
                                      torch.device("cpu"), torch.float32)
    opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), fused=False)
    if config["mode"] == "save":
        for s in range(STEPS):
            local_step(model, opt, s, world, rank)
        d = ckpt_lib.save_local(model, opt, {"step": STEPS, "world_size": world})
        # What Ray Train's report does: every rank's files land in one storage directory.
        for f in glob.glob(os.path.join(d, "*")) + glob.glob(os.path.join(d, ".metadata")):
            shutil.copy(f, config["ckpt"])
        ckpt_lib.cleanup_local(d)
        dist.barrier()
    else:
        state = ckpt_lib.load(config["ckpt"], model, opt)
        assert state["step"] == STEPS
    full = _full_state(model, opt)
    if rank == 0:
        torch.save(full, config["out"])


def _fit(tmp_path, name, workers, config):
    from ray.train import RunConfig, ScalingConfig
    from elastic.launch.runtime.lean_train import PrivateTorchTrainer as TorchTrainer  # as jobs run (on ray_local)

    TorchTrainer(reshard_worker, train_loop_config=config,
                 scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray"))).fit()


def test_checkpoint_from_hsdp_2x2_loads_at_1_and_3(ray_local, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _fit(tmp_path, "save4", 4, {"mode": "save", "ckpt": str(ckpt), "out": str(tmp_path / "w4.pt"), "dp_replicate": 2})
    assert len(glob.glob(str(ckpt / "*.distcp"))) == 4 and (ckpt / ".metadata").exists()
    ref = torch.load(tmp_path / "w4.pt", weights_only=False)
    for w in (1, 3):
        out = tmp_path / f"w{w}.pt"
        _fit(tmp_path, f"load{w}", w, {"mode": "load", "ckpt": str(ckpt), "out": str(out)})
        got = torch.load(out, weights_only=False)
        assert got["model"].keys() == ref["model"].keys()
        for k in ref["model"]:
            assert torch.equal(got["model"][k], ref["model"][k]), f"world {w}: model {k}"
        for pid, st in ref["optim"]["state"].items():
            for k, v in st.items():
                assert torch.equal(torch.as_tensor(got["optim"]["state"][pid][k]), torch.as_tensor(v)), f"world {w}: optim {pid}.{k}"
        assert got["optim"]["param_groups"] == ref["optim"]["param_groups"]
