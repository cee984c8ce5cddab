"""A GRPO update on 2 FSDP workers equals a 1-process update on the same rollouts.

Fixed rollouts (prompt + completion tokens, advantages, old log-probs, one completion filtered
out) go through the job's own loss function and the shared train_step: on 2 Ray Train workers
each rank takes its slice of the optimizer step's completions (elastic/rl/prompts.py) and
accumulates over micro-batches; the normalisers count the whole step. Both runs start from the
same seeded init. Tolerance as in tests/test_fsdp_equivalence.py (fp32; only the reduction
order differs).

Also with the filtered completions dropped from the micro-batches the way the GRPO job drops them
(elastic/rl/grpo.py train_plan): uneven kept counts per rank, the short rank padded with a masked
micro-batch, the same update as the masked single-process one."""

import os

import numpy as np
import torch

from elastic.config import from_dict
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.grpo import make_grpo_loss, train_plan
from elastic.rl.prompts import rank_completions
from elastic.train.comm import Comm
from elastic.train.loop import build_model, build_sharded_model
from elastic.train.optim import build_optimizer
from elastic.train.step import split_micro, train_step
from tests.test_fsdp_equivalence import CFG

N, MICRO, STEPS = 8, 2, 2


def rollouts(step: int, filtered=(3,)):
    rng = np.random.default_rng(50 + step)
    rows = []
    for k in range(N):
        p, c = int(rng.integers(3, 9)), int(rng.integers(2, 12))
        rows.append((rng.integers(2, 300, size=p).tolist(), rng.integers(2, 300, size=c).tolist()))
    L = max(len(p) + len(c) for p, c in rows)
    tokens = np.zeros((N, L), np.int64)
    doc = np.full((N, L), -1, np.int64)
    pos = np.zeros((N, L), np.int64)
    cmask = np.zeros((N, L), np.float32)
    old = np.zeros((N, L), np.float32)
    for b, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        tokens[b, :n], doc[b, :n], pos[b, :n] = p + c, 0, np.arange(n)
        cmask[b, len(p):n] = 1.0
        old[b, len(p):n] = rng.normal(-5.6, 0.3, size=len(c))  # a policy a little off the current one
    cmask[list(filtered)] = 0.0  # filtered out of the step (a sandbox_error, a zero-variance group)
    adv = rng.normal(size=N).astype(np.float32)
    batch = {"tokens": tokens, "doc_ids": doc, "positions": pos, "cmask": cmask, "old_logp": old, "adv": adv}
    counts = StepCounts(sequences=int((cmask.sum(1) > 0).sum()), tokens=int(cmask.sum()), max_new_tokens=12)
    return batch, counts


# Rank 0 of 2 keeps one completion (one micro-batch), rank 1 all four (two): rank 0 pads.
DROPPED = (1, 2, 3)


def run(model, world: int, rank: int, loss_agg: str, filtered=(3,), drop: bool = False):
    cfg = from_dict({**CFG, "rl": {"loss_agg": loss_agg, "clip_low": 0.1, "clip_high": 0.15}})
    opt = build_optimizer(model, 1e-2, 0.0, (0.9, 0.95), fused=False)
    losses = []
    for s in range(STEPS):
        batch, counts = rollouts(s, filtered)
        parts = [rank_completions(N, 1, world, r)[0] for r in range(world)]
        mine = parts[rank]
        local = {k: v[mine] for k, v in batch.items()}
        micro = split_micro(local, MICRO)
        if drop:  # the job's layout: kept rows only, padded to the count every rank runs
            keep = batch["cmask"].sum(1) > 0
            kept, n_micro = train_plan(keep, parts, MICRO)
            micro = split_micro({k: v[kept[rank]] for k, v in batch.items()}, MICRO) if kept[rank] else []
            pad = [k for k in mine if not keep[k]][:1]
            micro += [{k: v[pad] for k, v in batch.items()}] * (n_micro - len(micro))
            assert len(micro) == n_micro == 2
        out = train_step(model, opt, micro, make_grpo_loss(cfg.rl, lambda: counts), 1.0, 1.0,
                         Comm(torch.device("cpu")))
        losses.append(out.stats["loss_sum"])
    return losses


def grpo_worker(config):
    import ray.train
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    out, losses = {}, {}
    for agg in config["aggs"]:
        model, _, _ = build_sharded_model(from_dict(CFG), torch.device("cpu"), torch.float32)
        losses[agg] = run(model, ctx.get_world_size(), ctx.get_world_rank(), agg)
        out[agg] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    model, _, _ = build_sharded_model(from_dict(CFG), torch.device("cpu"), torch.float32)
    losses["dropped"] = run(model, ctx.get_world_size(), ctx.get_world_rank(), "token_mean", DROPPED, drop=True)
    out["dropped"] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ctx.get_world_rank() == 0:
        torch.save({"losses": losses, "params": out}, config["out"])


def test_grpo_update_two_workers_match_single_process(ray_local, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from elastic.launch.runtime.lean_train import PrivateTorchTrainer as TorchTrainer  # as jobs run (on ray_local)

    aggs = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
    out = str(tmp_path / "grpo.pt")
    TorchTrainer(grpo_worker, train_loop_config={"out": out, "aggs": aggs},
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name="grpo-eq", storage_path=str(tmp_path / "ray"))).fit()
    assert os.path.exists(out)
    sharded = torch.load(out)
    for agg in aggs + ["dropped"]:
        model, _, _ = build_model(from_dict(CFG), torch.device("cpu"))
        init = {k: v.clone() for k, v in model.state_dict().items()}
        # the reference keeps every row in the micro-batches, masked
        ref = run(model, 1, 0, "token_mean", DROPPED) if agg == "dropped" else run(model, 1, 0, agg)
        np.testing.assert_allclose(sharded["losses"][agg], ref, rtol=1e-5, atol=1e-7)
        moved = 0.0
        for k, v in sharded["params"][agg].items():
            torch.testing.assert_close(v, model.state_dict()[k], atol=1e-4, rtol=0, msg=lambda m: f"{agg} {k}: {m}")
            moved = max(moved, float((v - init[k]).abs().max()))
        assert moved > 1e-3, f"{agg}: the update did not move the weights"


def test_train_plan_drops_filtered_rows_and_pads_every_rank_to_one_micro_batch_count():
    """Kept rows only; every rank runs the largest ceil(kept / micro) of any rank (FSDP needs one
    forward count on all ranks). Hand-computed: N=8, 2 ranks, micro 2."""
    keep = np.array([1, 0, 0, 0, 1, 1, 1, 0], bool)
    parts = [rank_completions(8, 1, 2, r)[0] for r in range(2)]  # [0..3], [4..7]
    kept, n_micro = train_plan(keep, parts, 2)
    assert kept == [[0], [4, 5, 6]] and n_micro == 2  # rank 0: 1 micro-batch + 1 padding; rank 1: 2
    kept, n_micro = train_plan(np.zeros(8, bool) | (np.arange(8) == 5), parts, 2)
    assert kept == [[], [5]] and n_micro == 1
    kept, n_micro = train_plan(np.ones(8, bool), parts, 2)
    assert kept == [[0, 1, 2, 3], [4, 5, 6, 7]] and n_micro == 2  # nothing filtered: today's layout
    # two minibatches of 4 over 2 ranks: minibatch 1's parts
    parts1 = [rank_completions(8, 2, 2, r)[1] for r in range(2)]  # [4, 5], [6, 7]
    assert train_plan(keep, parts1, 1) == ([[4, 5], [6]], 2)
