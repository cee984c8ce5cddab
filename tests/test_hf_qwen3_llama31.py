"""Hugging Face Qwen3 and Llama 3.1/3.2 in and out, and the model features they need.

* Qwen3: per-head q/k RMSNorm (after the q/k projections, before RoPE), no q/k/v biases, a
  head_dim that is not hidden_size / num_attention_heads, tied or untied embeddings.
* Llama 3.1: `rope_parameters` / `rope_scaling` of rope_type "llama3". The tiny models use
  original_max_position_embeddings = 32 and head_dim 16 (theta 10000), so of the 8 RoPE
  frequencies the fastest is kept, one is interpolated (the "medium" band) and six are divided by
  the factor; sequences of 96 tokens run well past 32 positions, so the scaling changes logits.
* Llama 3.2: the same with tied embeddings.

Parity as in tests/test_hf_import.py and test_hf_export.py: random-init transformers models
(norm weights randomised too, so the q/k norm mapping matters), saved with save_pretrained;
our logits equal transformers' in fp32 within 1e-5 absolute (logits of magnitude ~1). Export:
transformers' AutoModelForCausalLM loads what save_hf writes, with no missing or unexpected
tensors, and its logits equal ours. The generation engine's cached decode (static KV cache)
gives the next-token logits of a full forward for a qk_norm + llama3-scaled model.
"""

import json
import math

import pytest
import torch

from elastic.config import ConfigError, from_dict, resolved_model_dims
from elastic.model import ModelArgs, Transformer
from elastic.model.hf import check_init_from, from_pretrained, hf_key_map, read_hf_dims, save_hf
from elastic.model.llama import rope_inv_freq

transformers = pytest.importorskip("transformers")

from elastic.data.tokenizer import EOS, PAD, train_bpe  # noqa: E402
from tests.hf_helpers import TEXT  # noqa: E402

ATOL = 1e-5
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def _hf_model(kind: str, tie: bool = False, seed: int = 0, rope=None):
    """A random-init transformers model: "qwen3" (head_dim 32 != 64/4) or "llama31"."""
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(**COMMON, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                       tie_word_embeddings=tie)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.LlamaConfig(**COMMON, max_position_embeddings=256, rms_norm_eps=1e-5,
                                       rope_parameters=dict(rope or LLAMA3, rope_theta=10000.0), tie_word_embeddings=tie)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # HF inits norms to ones: random ones make the norm mapping matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    return model


def _save(model, path):
    model.save_pretrained(path)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=train_bpe(TEXT, 300), eos_token=EOS, pad_token=PAD)
    tok.save_pretrained(path)
    return path


def _tokens(B=2, T=96, seed=0):
    return torch.randint(0, 300, (B, T), generator=torch.Generator().manual_seed(seed))


def _load_hf(out):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def _maxdiff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


# ----------------------------------------------------------------------------------- Qwen3

@pytest.mark.parametrize("tie", [False, True])
def test_qwen3_import_matches_transformers(tmp_path, tie):
    hf = _hf_model("qwen3", tie=tie)
    path = _save(hf, tmp_path / "qwen3")
    cfg = from_dict({"model": {"init_from": str(path)}, "data": {"seq_len": 96}})
    dims = resolved_model_dims(cfg)
    assert dims == dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=96,
                        tie_embeddings=tie, rope_theta=1e6, norm_eps=1e-6, qkv_bias=False, qk_norm=True, head_dim=32)
    check_init_from(cfg)
    args = ModelArgs(**dims)
    assert "layers.1.attention.q_norm.weight" in hf_key_map(args)
    assert hf_key_map(args)["layers.1.attention.k_norm.weight"] == "model.layers.1.self_attn.k_norm.weight"
    model = from_pretrained(str(path))
    assert model.args.head_dim == 32 and model.layers[0].attention.wq.weight.shape == (4 * 32, 64)
    assert (model.output.weight is model.tok_embeddings.weight) == tie
    x = _tokens()
    with torch.no_grad():
        ref, got = hf(x).logits, model(x)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    # Not vacuous: the q/k norms change the logits.
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.q_norm.weight.fill_(1.0)
        assert _maxdiff(model(x), ref) > 100 * ATOL


def test_qwen3_without_head_dim_uses_transformers_default(tmp_path):
    """Qwen3Config's head_dim defaults to 128 (not hidden / heads) when config.json omits it."""
    path = _save(_hf_model("qwen3"), tmp_path / "q")
    raw = json.loads((path / "config.json").read_text())
    del raw["head_dim"]
    (path / "config.json").write_text(json.dumps(raw))
    assert read_hf_dims(str(path))["head_dim"] == 128
    with pytest.raises(ConfigError, match=r"self_attn\.q_proj\.weight has shape \[128, 64\], config\.json implies \[512, 64\]"):
        check_init_from(from_dict({"model": {"init_from": str(path)}}))


@pytest.mark.parametrize("tie", [False, True])
def test_qwen3_export_loads_in_transformers(tmp_path, tie):
    """HF Qwen3 → ours → save_hf → transformers: same class, same config, same logits."""
    hf = _hf_model("qwen3", tie=tie, seed=1)
    src = _save(hf, tmp_path / "src")
    ours = from_pretrained(str(src))
    save_hf(dict(ours.named_parameters()), ours.args, str(tmp_path / "out"), str(src / "tokenizer.json"))
    c = json.loads((tmp_path / "out" / "config.json").read_text())
    assert c["architectures"] == ["Qwen3ForCausalLM"] and c["model_type"] == "qwen3"
    assert c["head_dim"] == 32 and c["tie_word_embeddings"] is tie and c["attention_bias"] is False
    back = _load_hf(tmp_path / "out")
    assert type(back).__name__ == "Qwen3ForCausalLM" and back.config.head_dim == 32
    x = _tokens(seed=1)
    with torch.no_grad():
        ref, got = back(x).logits, ours(x)
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(hf(x).logits, ref, atol=ATOL, rtol=0)


def test_our_qwen3_shaped_model_exports(tmp_path):
    """A model of ours (not imported) with q/k norm, explicit head_dim and llama3 RoPE scaling:
    transformers reads it as Qwen3 with that scaling and computes the same logits."""
    args = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=128,
                     tie_embeddings=False, rope_theta=10000.0, qk_norm=True, head_dim=16 * 2, rope_scaling=dict(LLAMA3))
    model = _our_model(args)
    _save(_hf_model("qwen3"), tmp_path / "tok")  # a tokenizer directory to copy from
    save_hf(dict(model.named_parameters()), args, str(tmp_path / "out"), str(tmp_path / "tok" / "tokenizer.json"))
    back = _load_hf(tmp_path / "out")
    assert type(back).__name__ == "Qwen3ForCausalLM"
    assert back.config.rope_parameters["rope_type"] == "llama3"
    assert ModelArgs(**read_hf_dims(str(tmp_path / "out"))) == args
    x = _tokens(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), back(x).logits, atol=ATOL, rtol=0)


# ------------------------------------------------------------------------- Llama 3.1 / 3.2

def test_llama3_frequencies_equal_transformers_and_cover_three_bands():
    cfg = transformers.LlamaConfig(**COMMON, max_position_embeddings=256, rope_parameters=dict(LLAMA3, rope_theta=10000.0))
    ref, scale = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    got = rope_inv_freq(16, 10000.0, LLAMA3)
    assert scale == 1.0 and torch.equal(got, ref)
    plain = rope_inv_freq(16, 10000.0)
    kept, divided = got == plain, got == plain / 8.0
    assert kept.sum() == 1 and divided.sum() == 6 and (~kept & ~divided).sum() == 1  # high / low / medium bands
    linear, _ = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["linear"](
        transformers.LlamaConfig(**COMMON, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "cpu")
    assert torch.equal(rope_inv_freq(16, 10000.0, {"rope_type": "linear", "factor": 2.0}), linear)


@pytest.mark.parametrize("tie", [False, True], ids=["llama3.1", "llama3.2-tied"])
def test_llama31_import_matches_transformers(tmp_path, tie):
    hf = _hf_model("llama31", tie=tie)
    path = _save(hf, tmp_path / "m")
    cfg = from_dict({"model": {"init_from": str(path)}, "data": {"seq_len": 96}})
    dims = resolved_model_dims(cfg)
    assert dims["rope_scaling"] == LLAMA3 and dims["tie_embeddings"] is tie
    assert "qk_norm" not in dims and "head_dim" not in dims
    check_init_from(cfg)
    model = from_pretrained(str(path))
    assert (model.output.weight is model.tok_embeddings.weight) == tie
    x = _tokens()
    with torch.no_grad():
        ref, got = hf(x).logits, model(x)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    # Not vacuous: without the scaling, the logits differ.
    plain = Transformer(ModelArgs(**{**dims, "rope_scaling": None}))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert _maxdiff(plain(x), ref) > 100 * ATOL


def test_llama31_transformers_4x_config_form(tmp_path):
    """The form Meta's Llama-3.1 config.json has (transformers 4.x): top-level rope_theta and
    `rope_scaling` with `rope_type` (or the older `type`) — same dims, same logits."""
    hf = _hf_model("llama31", seed=3)
    path = _save(hf, tmp_path / "m")
    want = read_hf_dims(str(path))
    raw = json.loads((path / "config.json").read_text())
    raw.pop("rope_parameters")
    for field in ("rope_type", "type"):
        scaling = {k: v for k, v in LLAMA3.items() if k != "rope_type"}
        raw.update(rope_theta=10000.0, rope_scaling={field: "llama3", **scaling})
        (path / "config.json").write_text(json.dumps(raw))
        assert read_hf_dims(str(path)) == want
    x = _tokens(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(from_pretrained(str(path))(x), hf(x).logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(_load_hf(path)(x).logits, hf(x).logits, atol=0, rtol=0)  # transformers agrees


@pytest.mark.parametrize("tie", [False, True], ids=["llama3.1", "llama3.2-tied"])
def test_llama31_export_loads_in_transformers(tmp_path, tie):
    hf = _hf_model("llama31", tie=tie, seed=4)
    src = _save(hf, tmp_path / "src")
    ours = from_pretrained(str(src))
    save_hf(dict(ours.named_parameters()), ours.args, str(tmp_path / "out"), str(src / "tokenizer.json"))
    c = json.loads((tmp_path / "out" / "config.json").read_text())
    assert c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama"
    assert c["rope_parameters"] == dict(LLAMA3, rope_theta=10000.0) and c["rope_scaling"] == LLAMA3
    assert c["tie_word_embeddings"] is tie and c["head_dim"] == 16
    from safetensors import safe_open

    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tie)
    back = _load_hf(tmp_path / "out")
    assert back.config.rope_parameters["rope_type"] == "llama3"
    assert torch.equal(back.model.rotary_emb.inv_freq, hf.model.rotary_emb.inv_freq)
    if tie:
        assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    x = _tokens(seed=4)
    with torch.no_grad():
        ref = back(x).logits
        torch.testing.assert_close(ours(x), ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(hf(x).logits, ref, atol=ATOL, rtol=0)
    assert read_hf_dims(str(tmp_path / "out"))["rope_scaling"] == LLAMA3


def test_linear_rope_scaling_import(tmp_path):
    linear = {"rope_type": "linear", "factor": 4.0}
    hf = _hf_model("llama31", rope=linear, seed=5)
    path = _save(hf, tmp_path / "m")
    assert read_hf_dims(str(path))["rope_scaling"] == linear
    x = _tokens(seed=5)
    with torch.no_grad():
        torch.testing.assert_close(from_pretrained(str(path))(x), hf(x).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("key,value,needle", [
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32}, "rope_parameters.rope_type 'yarn' not supported"),
    ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_scaling.type 'dynamic' not supported"),
    ("rope_scaling", {"rope_type": "longrope", "factor": 2.0}, "rope_scaling.rope_type 'longrope' not supported"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0},
     "rope_parameters.low_freq_factor must be a positive number for rope_type 'llama3'"),
])
def test_unsupported_rope_scaling_is_one_line_before_any_work(tmp_path, key, value, needle):
    path = _save(_hf_model("llama31"), tmp_path / "m")
    raw = json.loads((path / "config.json").read_text())
    raw.pop("rope_parameters")
    raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))
    (path / "model.safetensors").unlink()  # nothing reads weights before the config is refused
    for call in (lambda: from_dict({"model": {"init_from": str(path)}}), lambda: from_pretrained(str(path)),
                 lambda: read_hf_dims(str(path))):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and needle in msg and str(path / "config.json") in msg, msg


# ---------------------------------------------------------------------------- generation

def _our_model(args: ModelArgs, sharpen: float = 1.0) -> Transformer:
    m = Transformer(args)
    m.init_weights(seed=3)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(sharpen)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    return m.eval()


@pytest.mark.parametrize("mode", ["eager", "fixed"])
def test_cached_decode_logits_equal_a_full_forward(mode):
    """qk_norm + llama3 scaling + head_dim != dim / n_heads through the engine's prefill and
    static-cache decode steps: every next-token logit row equals a full forward's, at positions
    well past original_max_position_embeddings; greedy tokens are that forward's argmax."""
    from elastic.generation.generate import generate

    args = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=128,
                     qk_norm=True, head_dim=32, rope_scaling=dict(LLAMA3), rope_theta=10000.0)
    m = _our_model(args, sharpen=4.0)
    prompts = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99]]
    n_new = 60
    seen = []
    hook = m.output.register_forward_hook(lambda mod, inp, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            got = generate(m, prompts, n_new, mode=mode)
    finally:
        hook.remove()
    assert len(seen) == n_new  # one prefill, then one decode step per further token
    worst = 0.0
    for i, (p, c) in enumerate(zip(prompts, got)):
        assert len(c.tokens) == n_new
        with torch.no_grad():
            full = m(torch.tensor([p + c.tokens]))[0]
        assert c.tokens == full[len(p) - 1:-1].argmax(-1).tolist(), f"prompt {i}"
        for t in range(n_new):
            step = seen[t][i].reshape(-1)  # prefill [n, V]; decode [b, 1, V]
            worst = max(worst, _maxdiff(step, full[len(p) - 1 + t]))
        logp = full[len(p) - 1:-1].float().log_softmax(-1).gather(-1, torch.tensor(c.tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), logp, atol=1e-5, rtol=1e-5)
    assert worst < 1e-4, worst
    assert len(prompts[1]) + n_new > 2 * LLAMA3["original_max_position_embeddings"]


def test_qk_norm_decode_step_traces_as_one_full_graph():
    """The CUDA path's compile of the decode step (fullgraph: no graph break) with q/k norm."""
    from elastic.generation.decoder import CachedDecoder
    from elastic.generation.step import compiled_decode_step
    from elastic.generation.generate import generate, run_decoder
    from elastic.generation.sampling import SamplingParams

    args = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=128,
                     qk_norm=True, head_dim=32, rope_scaling=dict(LLAMA3))
    m = _our_model(args, sharpen=4.0)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    prompts = [[5, 17, 42], [7, 8, 9, 10], [1, 2], [3]]
    with torch.no_grad():
        dec = CachedDecoder(m, len(prompts), 64, SamplingParams(0.0, 0, 1.0), "fixed", step_fn=compiled_decode_step(backend),
                            kv_bucket=16)
        out = run_decoder(dec, prompts, [0] * 4, 24)
    assert [c.tokens for c in out] == [c.tokens for c in generate(m, prompts, 24)]
    assert len(graphs) == 1


def test_new_fields_default_to_the_old_model():
    """Existing dims (presets, checkpoints' configs) build exactly the model they built before."""
    a = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=64)
    assert a.head_dim == 16 and not a.qk_norm and a.rope_scaling is None
    assert a == ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=64,
                          head_dim=16)
    names = [n for n, _ in Transformer(a).named_parameters()]
    assert not any("q_norm" in n or "k_norm" in n for n in names)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert torch.equal(rope_inv_freq(16, 10000.0), inv) and math.isclose(inv[0].item(), 1.0)
