"""Hugging Face format out: `jobs/export_hf.py --checkpoint <run>/step_N --out <dir>`.

The checkpoints are written the way the trainer writes them: FSDP2 (fully_shard per block +
root) in a Ray Train group, `get_state_dict(model, optimizer)` saved with DCP as
{"model", "optim"} into step_N/ (.metadata, __R_0.distcp, train_state.json), next to the
run's config.json and tokenizer.json. The same initial weights are saved at world size 2
and 1 (an AdamW step with lr=0 populates the optimizer state without moving the weights).
Two models: Llama-shaped (tied, no biases; the `tiny` family) and Qwen2-shaped (untied,
q/k/v biases). Logit parity with transformers: fp32, within 1e-5 absolute (observed: equal).
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from elastic.config import ConfigError, from_dict, resolved_model_dims, resolved_tokenizer, to_dict
from elastic.model.dcp_io import read_model_state
from elastic.model.hf import check_init_from, from_pretrained, load_hf_state_dict, read_hf_dims, save_hf
from elastic.model.llama import ModelArgs

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "llama": {"model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128},
              "data": {"vocab_size": 300, "seq_len": 64}, "run": {"seed": 3}},
    "qwen2": {"model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 160,
                        "tie_embeddings": False, "qkv_bias": True, "rope_theta": 20000.0},
              "data": {"vocab_size": 300, "seq_len": 48}, "run": {"seed": 4}},
}


def save_worker(config):
    """Build, shard and checkpoint every model as the trainer does."""
    import ray.train
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from elastic.model import Transformer

    torch.set_num_threads(1)
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    for name, raw in MODELS.items():
        cfg = from_dict(raw)
        model = Transformer(ModelArgs(**resolved_model_dims(cfg)))
        model.init_weights(seed=cfg.run.seed)
        g = torch.Generator().manual_seed(cfg.run.seed)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith(".bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.1)
        model(torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(rank))).float().mean().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        step_dir = os.path.join(config["root"], name, "step_00000001")
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=step_dir)
        if rank == 0:
            with open(os.path.join(step_dir, "train_state.json"), "w") as f:
                json.dump({"step": 1, "world_size": world}, f)
        dist.barrier()


def _write_checkpoints(root: Path, world: int) -> Path:
    from ray.train import RunConfig, ScalingConfig
    from elastic.launch.runtime.lean_train import PrivateTorchTrainer as TorchTrainer  # as jobs run (on ray_local)

    from elastic.data.tokenizer import train_bpe
    from tests.hf_helpers import TEXT

    tok = train_bpe(TEXT, 300)
    for name, raw in MODELS.items():
        run = root / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(to_dict(from_dict(dict(raw, scaling={"min_workers": world, "max_workers": world})))))
        tok.save(str(run / "tokenizer.json"))
    TorchTrainer(save_worker, train_loop_config={"root": str(root)},
                 scaling_config=ScalingConfig(num_workers=world, use_gpu=False, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name=f"save-ws{world}", storage_path=str(root / "ray"))).fit()
    return root


@pytest.fixture(scope="module")
def ckpts(ray_local, tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpts")
    return {w: _write_checkpoints(base / f"ws{w}", w) for w in (2, 1)}


def _export(step_dir: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "export_hf.py"), "--checkpoint", str(step_dir), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def _load_hf(out: Path):
    """transformers' own loaders; returns (model, tokenizer, loading info, warnings logged)."""
    h = _Records()
    transformers.logging.get_logger().addHandler(h)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        tok = transformers.AutoTokenizer.from_pretrained(out)
    finally:
        transformers.logging.get_logger().removeHandler(h)
    return model.eval(), tok, info, h.records


@pytest.mark.parametrize("name,arch", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_export_loads_in_transformers_with_equal_logits(ckpts, tmp_path, name, arch):
    step = ckpts[2] / name / "step_00000001"
    r = _export(step, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    model, tok, info, warned = _load_hf(tmp_path / "hf")
    assert type(model).__name__ == arch
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert not [w for w in warned if any(s in w.lower() for s in ("missing", "unexpected", "newly initialized", "not used"))], warned
    ours = from_pretrained(str(step))
    x = torch.randint(0, 300, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ours(x), atol=1e-5, rtol=0)
    # The tokenizer: same ids as ours, EOS and padding set. transformers >= 5 gives model_type
    # qwen2 its own Qwen2Tokenizer pipeline whatever tokenizer_config.json says (our BPE then
    # meets Qwen2's pre-tokenizer); the generic fast class reads our tokenizer.json as is.
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(ckpts[2] / name / "tokenizer.json"))
    text = "def f(x):\n    return x + 1\n"
    exact = tok if name == "llama" else transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path / "hf")
    assert exact(text)["input_ids"] == ref.encode(text).ids
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == ref.token_to_id("<|endoftext|>")
    assert tok.pad_token_id == ref.token_to_id("<|pad|>")
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_world_size_1_and_2_export_identical_bytes(ckpts, tmp_path, name):
    outs = []
    for w in (1, 2):
        assert len(list((ckpts[w] / name / "step_00000001").glob("*.distcp"))) == w
        r = _export(ckpts[w] / name / "step_00000001", tmp_path / f"ws{w}")
        assert r.returncode == 0, r.stderr
        outs.append(tmp_path / f"ws{w}")
    files = sorted(p.name for p in outs[0].iterdir())
    assert files == sorted(p.name for p in outs[1].iterdir()) and "model.safetensors" in files
    for f in files:
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_import_of_export_is_bit_identical(ckpts, tmp_path, name):
    step = ckpts[2] / name / "step_00000001"
    assert _export(step, tmp_path / "hf").returncode == 0
    ours = read_model_state(str(step))
    args = ModelArgs(**read_hf_dims(str(tmp_path / "hf")))
    back = load_hf_state_dict(str(tmp_path / "hf"), args)
    assert set(back) == set(ours) - ({"output.weight"} if args.tie_embeddings else set())
    for k, v in back.items():
        assert v.dtype == ours[k].dtype and torch.equal(v, ours[k]), k
    # And export(import(...)) writes the same weight bytes again.
    model = from_pretrained(str(tmp_path / "hf"))
    save_hf(dict(model.named_parameters()), model.args, str(tmp_path / "again"), str(tmp_path / "hf" / "tokenizer.json"))
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()


def test_sharded_and_bf16_exports(ckpts, tmp_path):
    step = ckpts[2] / "qwen2" / "step_00000001"
    assert _export(step, tmp_path / "one").returncode == 0
    r = _export(step, tmp_path / "sharded", "--max-shard-size", "40KB")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    for s in shards:  # at most 40 kB of tensor data, unless one tensor alone is larger
        names = [k for k, v in index["weight_map"].items() if v == s]
        with safe_open(tmp_path / "sharded" / s, "pt") as f:
            assert sorted(f.keys()) == sorted(names)
            nbytes = sum(f.get_tensor(k).numel() * 4 for k in names)
        assert nbytes <= 40_000 or len(names) == 1, (s, nbytes)
    assert index["metadata"]["total_size"] == os.path.getsize(tmp_path / "one" / "model.safetensors") - 8 - \
        int.from_bytes((tmp_path / "one" / "model.safetensors").read_bytes()[:8], "little")
    model, _, info, _ = _load_hf(tmp_path / "sharded")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    args = ModelArgs(**read_hf_dims(str(tmp_path / "one")))
    a, b = load_hf_state_dict(str(tmp_path / "one"), args), load_hf_state_dict(str(tmp_path / "sharded"), args)
    assert all(torch.equal(a[k], b[k]) for k in a)

    assert _export(step, tmp_path / "bf16", "--dtype", "bf16").returncode == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model, _, info, _ = _load_hf(tmp_path / "bf16")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    bf = load_hf_state_dict(str(tmp_path / "bf16"), args)
    assert all(torch.equal(bf[k], a[k].to(torch.bfloat16)) for k in a)


def test_init_from_our_checkpoint(ckpts):
    """SFT from a pretraining run: sizes, vocabulary and tokenizer come from the run."""
    step = ckpts[2] / "qwen2" / "step_00000001"
    cfg = from_dict({"model": {"init_from": str(step)}, "data": {"seq_len": 128, "vocab_size": 4096}})
    dims = resolved_model_dims(cfg)
    assert dims == dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=160, max_seq_len=128,
                        tie_embeddings=False, rope_theta=20000.0, norm_eps=1e-5, qkv_bias=True)
    assert resolved_tokenizer(cfg) == str(ckpts[2] / "qwen2" / "tokenizer.json")
    check_init_from(cfg)
    with pytest.raises(ConfigError, match=r"^model\.qkv_bias: False conflicts with True from .*config\.json"):
        from_dict({"model": {"init_from": str(step), "qkv_bias": False}})


def test_checkpoint_that_does_not_match_its_run_config(ckpts, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ckpts[1] / "llama", run)
    raw = json.loads((run / "config.json").read_text())
    raw["model"]["ffn_hidden"] = 96
    (run / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        check_init_from(from_dict({"model": {"init_from": str(run / "step_00000001")}}))
    assert "\n" not in str(e.value)
    assert "tensor model.layers.0.feed_forward.w1.weight has shape [128, 64]" in str(e.value) and "implies [96, 64]" in str(e.value)


def test_export_cli_bad_checkpoint(tmp_path):
    r = _export(tmp_path / "nope", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: --checkpoint: {tmp_path / 'nope'}: no such directory"]
    hf = tmp_path / "hfdir"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    r = _export(hf, tmp_path / "out")
    assert r.returncode == 2 and "not one of our checkpoints (no train_state.json)" in r.stderr
