"""Hugging Face format in: `model.init_from: <HF dir>` resolves sizes from config.json and the
weights load by renaming alone (our RoPE is HF's rotate-half layout).

Parity: random-init transformers LlamaForCausalLM (GQA, untied) and Qwen2ForCausalLM (q/k/v
biases, tied), saved with save_pretrained; our logits equal transformers' in fp32 within
1e-5 absolute (logits of magnitude ~1; observed: exactly equal on this CPU).
"""

import pytest
import torch

from elastic.config import ConfigError, from_dict, resolved_model_dims, resolved_tokenizer
from elastic.model import ModelArgs, Transformer
from elastic.model.hf import check_hf_dir, check_init_from, from_pretrained, hf_key_map, load_hf_state_dict, load_state_into

pytest.importorskip("transformers")
from tests.hf_helpers import make_hf_dir  # noqa: E402


def _cfg(init_from, **model):
    return from_dict({"model": {"init_from": str(init_from), **model}, "data": {"seq_len": 64}})


def _tokens(B=3, T=40, seed=0):
    return torch.randint(0, 300, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_init_from_hf_dir_matches_transformers_logits(tmp_path, kind):
    hf = make_hf_dir(tmp_path / kind, kind)
    cfg = _cfg(tmp_path / kind)  # config resolution: no preset needed, sizes from config.json
    dims = resolved_model_dims(cfg)
    want = dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=64,
                tie_embeddings=kind == "qwen2", rope_theta=5000.0 if kind == "llama" else 10000.0,
                norm_eps=1e-5 if kind == "llama" else 1e-6, qkv_bias=kind == "qwen2")
    assert dims == want
    assert resolved_tokenizer(cfg) == str(tmp_path / kind / "tokenizer.json")
    check_init_from(cfg)
    args = ModelArgs(**dims)
    model = Transformer(args)
    load_state_into(model, load_hf_state_dict(str(tmp_path / kind), args))
    x = _tokens()
    with torch.no_grad():
        ref = hf(x).logits
        got = model(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # The same through the convenience loader (meta-device build, tied weights re-tied).
    with torch.no_grad():
        torch.testing.assert_close(from_pretrained(str(tmp_path / kind))(x), ref, atol=1e-5, rtol=0)
    assert (model.output.weight is model.tok_embeddings.weight) == (kind == "qwen2")


def test_sharded_hf_dir_with_index_loads(tmp_path):
    hf = make_hf_dir(tmp_path / "m", "llama", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "m").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "m" / "model.safetensors.index.json").exists()
    x = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(from_pretrained(str(tmp_path / "m"))(x), hf(x).logits, atol=1e-5, rtol=0)


def test_key_map_covers_exactly_our_parameters():
    for tie, bias in ((True, False), (False, True)):
        args = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=64,
                         tie_embeddings=tie, qkv_bias=bias)
        names = {n for n, _ in Transformer(args).named_parameters()}  # tied output appears once
        assert set(hf_key_map(args)) == names
        assert ("lm_head.weight" in hf_key_map(args).values()) == (not tie)


def test_explicit_model_field_must_agree_with_init_from(tmp_path):
    make_hf_dir(tmp_path / "m", "llama")
    resolved_model_dims(_cfg(tmp_path / "m", dim=64, n_kv_heads=2))  # agreeing fields are fine
    with pytest.raises(ConfigError, match=r"^model\.dim: 128 conflicts with 64 from .*config\.json \(model\.init_from\)"):
        _cfg(tmp_path / "m", dim=128)
    with pytest.raises(ConfigError, match=r"^model\.tie_embeddings: True conflicts with False"):
        _cfg(tmp_path / "m", tie_embeddings=True)
    with pytest.raises(ConfigError, match=r"^data\.tokenizer: .* differs from the tokenizer that comes with model\.init_from"):
        from_dict({"model": {"init_from": str(tmp_path / "m")}, "data": {"tokenizer": str(tmp_path / "other.json")}})
