"""The checkpoint's optimizer state is stored by parameter name (elastic/train/checkpoint.py):
a checkpoint of the older nested form still resumes, and a tied pipeline stage's copy of the
embedding (`output.weight` on the last stage) reads the embedding's optimizer state from an
unsplit checkpoint. One process; the real DCP writer and reader."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from elastic.model.llama import ModelArgs, Transformer
from elastic.model.stages import StageModel
from elastic.train import checkpoint as ckpt_lib
from elastic.train.optim import build_optimizer

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=64, max_seq_len=16)


@pytest.fixture(autouse=True)
def one_rank(tmp_path):
    """A world of one gloo rank (the checkpoint writer asks for its rank)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trained():
    model = Transformer(ARGS)
    model.init_weights(seed=1)
    opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), fused=False)
    for s in range(2):
        tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))
        model(tokens).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _fresh():
    model = Transformer(ARGS)
    model.init_weights(seed=2)
    return model, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), fused=False)


def _adam(opt, p):
    st = opt.state[p]
    return {k: st[k].clone() for k in ("exp_avg", "exp_avg_sq")}


def test_flat_and_nested_checkpoints_resume_the_same_state(tmp_path):
    model, opt = _trained()
    flat = ckpt_lib.save_local(model, opt, {"step": 2})
    msd, osd = get_state_dict(model, opt)  # the nested form of checkpoints before issue 59
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "nested"))
    ckpt_lib._write_state_file(str(tmp_path / "nested"), {"step": 2})
    assert any(k.startswith("optim.state.tok_embeddings.weight.") for k in dcp.FileSystemReader(flat).read_metadata().state_dict_metadata)
    for path in (flat, str(tmp_path / "nested")):
        m2, o2 = _fresh()
        ckpt_lib.load(path, m2, o2)
        for (n, p), p2 in zip(model.named_parameters(), m2.parameters()):
            assert torch.equal(p, p2), n
            for k, v in _adam(opt, p).items():
                assert torch.equal(v, _adam(o2, p2)[k]), (path, n, k)
    ckpt_lib.cleanup_local(flat)


def test_a_tied_last_stage_reads_the_embeddings_optimizer_state_from_an_unsplit_checkpoint():
    model, opt = _trained()
    path = ckpt_lib.save_local(model, opt, {"step": 2})
    with torch.device("meta"):
        whole = Transformer(ARGS)
    last = StageModel(whole, 2, [1])
    last.to_empty(device="cpu")
    assert last.checkpoint_aliases() == {"output.weight": "tok_embeddings.weight"}
    o2 = build_optimizer(last, 1e-2, 0.1, (0.9, 0.95), fused=False)
    ckpt_lib.load(path, last, o2)
    assert torch.equal(last.output.weight, model.tok_embeddings.weight)
    for k, v in _adam(opt, model.tok_embeddings.weight).items():
        assert torch.equal(_adam(o2, last.output.weight)[k], v), k
    assert torch.equal(last.layers["1"].attention.wq.weight, model.layers[1].attention.wq.weight)
    ckpt_lib.cleanup_local(path)
