"""Generation inside a 2-worker FSDP2 Ray Train group equals generation in one process.

Each rank generates its own prompts, with a different number of decode steps per rank
(different max_new_tokens, a stop token that ends some rows early, continuous batching with
fewer slots than prompts): with one all-gather per decode step that would hang on mismatched
collectives. torch.profiler confirms the mechanism: inside `gathered_parameters` generation
issues no collective at all, while the reference path (generate_reference, which calls the root
forward and so FSDP's hooks) on the sharded model without it issues FSDP all-gathers (the
control shows the profiler does see them). The engine itself refuses a sharded model (it runs
the blocks without FSDP's hooks). Training still works on the model afterwards.
fp32 parameters: tokens must be identical, log-probabilities within 1e-5. A bf16
mixed-precision group must give the same greedy tokens as the model cast to bf16.
"""

import json
import os

import torch

from elastic.model import ModelArgs, Transformer
from elastic.generation.generate import generate
from elastic.generation.reference import generate_reference

ARGS = dict(vocab_size=300, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=32)
PROMPTS = {0: [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15]], 1: [[20, 21], [22, 23, 24, 25, 26]]}
MAX_NEW = {0: 40, 1: 24}
SAMPLING = dict(temperature=0.8, top_k=50, seed=[11, 12, 13])
COLLECTIVE_WORDS = ("all_gather", "allgather", "reduce_scatter", "all_reduce", "allreduce", "broadcast", "gloo", "c10d")


def build_model() -> Transformer:
    model = Transformer(ModelArgs(**ARGS))
    model.init_weights(seed=7)
    with torch.no_grad():  # sharper distributions than a 0.02 init, so greedy has clear winners
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


def stop_token(model: Transformer) -> int:
    """A token greedy decoding emits for rank 0's first prompt: that row stops early while the
    others run on (rows leave the batch at different steps)."""
    toks = generate(model, [PROMPTS[0][0]], 12)[0].tokens
    return toks[5]


def _collectives(prof) -> list:
    return sorted({e.name for e in prof.events() if any(w in e.name.lower() for w in COLLECTIVE_WORDS)})


def worker(config):
    import ray.train
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.profiler import ProfilerActivity, profile

    from elastic.train.fsdp_generate import fsdp_generate, gathered_parameters

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    model = build_model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for i, block in enumerate(model.layers):  # as elastic/train/parallelize.py does
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)

    stop = config["stop"]
    prompts, n_new = PROMPTS[rank], MAX_NEW[rank]
    with gathered_parameters(model):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            greedy = [c.__dict__ for c in generate(model, prompts, n_new, stop_token_ids=[stop])]
            sampled = [c.__dict__ for c in generate(model, prompts, n_new, **dict(SAMPLING, seed=SAMPLING["seed"][:len(prompts)]))]
            batched = [c.__dict__ for c in generate(model, prompts, n_new, stop_token_ids=[stop], max_batch=1)]
    inside = _collectives(prof)
    # Control: same step count on both ranks (no hang), no gathering: FSDP all-gathers per forward.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate_reference(model, [[1, 2, 3]], 3)
    control = _collectives(prof)
    try:
        generate(model, [[1, 2, 3]], 3)
        refused = False
    except ValueError as e:
        refused = "gathered_parameters" in str(e)
    # The convenience wrapper, and training afterwards (parameters resharded, grads flow).
    again = [c.__dict__ for c in fsdp_generate(model, prompts, n_new, stop_token_ids=[stop])]
    tokens = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(rank))
    loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    grad_ok = all(p.grad is not None and torch.isfinite(p.grad.full_tensor()).all().item() for p in model.parameters())
    # bf16 compute as on GPUs (MixedPrecisionPolicy param_dtype=bf16): the cache follows the
    # compute dtype, RoPE stays fp32 (complex inputs are not cast).
    bf = build_model()
    mp16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in bf.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp16)
    fully_shard(bf, mesh=mesh, mp_policy=mp16)
    bf16 = [c.__dict__ for c in fsdp_generate(bf, prompts, 16)]
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"greedy": greedy, "sampled": sampled, "batched": batched, "refused": refused, "again": again,
                   "inside": inside, "control": control,
                   "grad_ok": grad_ok, "resharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
                   "bf16": bf16}, f)


def test_fsdp_generation_matches_single_process(ray_local, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from elastic.launch.runtime.lean_train import PrivateTorchTrainer as TorchTrainer  # as jobs run (on ray_local)

    ref_model = build_model()
    stop = stop_token(ref_model)
    TorchTrainer(worker, train_loop_config={"out": str(tmp_path), "stop": stop},
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name="fsdp-generate", storage_path=str(tmp_path / "ray"))).fit()
    saw_stop = False
    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.json") as f:
            got = json.load(f)
        assert got["inside"] == [], f"rank {rank}: collectives during gathered generation: {got['inside']}"
        assert any("all_gather" in n.lower() for n in got["control"]), f"rank {rank}: control saw no all-gather: {got['control']}"
        assert got["grad_ok"] and got["resharded"] and got["refused"]
        prompts, n_new = PROMPTS[rank], MAX_NEW[rank]
        ref_greedy = generate(ref_model, prompts, n_new, stop_token_ids=[stop])
        ref_sampled = generate(ref_model, prompts, n_new, **dict(SAMPLING, seed=SAMPLING["seed"][:len(prompts)]))
        for name, ref in (("greedy", ref_greedy), ("sampled", ref_sampled), ("again", ref_greedy), ("batched", ref_greedy)):
            for i, (a, b) in enumerate(zip(got[name], ref)):
                assert a["tokens"] == b.tokens, f"rank {rank} {name} prompt {i}"
                assert a["finish_reason"] == b.finish_reason
                torch.testing.assert_close(torch.tensor(a["logprobs"]), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        saw_stop |= any(c["finish_reason"] == "stop" for c in got["greedy"])
        ref16 = generate(build_model().to(torch.bfloat16), prompts, 16)
        assert [c["tokens"] for c in got["bf16"]] == [c.tokens for c in ref16], f"rank {rank} bf16"
    assert saw_stop  # the two ranks really ran different numbers of decode steps
