"""Quantized generation (generation.weights, elastic/generation/quantized.py): a weight-only
quantized copy of the policy generates; the policy's own weights are untouched and stay full
precision; a refresh takes the policy's current weights. CPU, fp32, tiny models (int8; int4 has
no CPU kernel in torchao 0.18 and is refused with one line)."""

from __future__ import annotations

import pytest
import torch

from elastic.config import ConfigError, from_dict
from elastic.generation.generate import generate
from elastic.generation.quantized import QuantizationError, QuantizedCopy, check_weights, quantized_weight_bytes
from elastic.model import ModelArgs, Transformer

PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], [3, 1, 4, 1, 5, 9, 2]]
N_NEW = 24
# int8 per output channel on these weights (std 0.08, the engine tests' scale, sharp
# distributions): |log p_int8 - log p_full| over the full model's greedy tokens measured mean
# 4.6e-3 / max 9.5e-3 (gqa_tied) and mean 5.1e-3 / max 2.1e-2 (bias_untied); bounds at ~3x.
MEAN_TOL, MAX_TOL = 1.5e-2, 6e-2


def _model(kind: str = "gqa_tied") -> Transformer:
    extra = dict(tie_embeddings=False, qkv_bias=True) if kind == "bias_untied" else {}
    m = Transformer(ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                              max_seq_len=64, **extra))
    m.init_weights(seed=3)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(4)
            elif name.endswith(".bias"):
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m.eval()


def _logprobs(model, prompt, tokens) -> torch.Tensor:
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + tokens])).float()[0, len(prompt) - 1:-1], -1)
    return lp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["gqa_tied", "bias_untied"])
def test_int8_logprobs_close_to_full_and_weights_untouched(kind):
    model = _model(kind)
    before = _state(model)
    full = generate(model, PROMPTS, N_NEW)
    q = QuantizedCopy("int8")
    qm = q.refresh(model)
    assert qm is not model
    assert type(qm.layers[0].attention.wq.weight).__name__ == "Int8Tensor"
    assert type(qm.output.weight) is torch.nn.Parameter  # the head stays full precision
    assert quantized_weight_bytes(qm) < quantized_weight_bytes(model)
    # The full model's own greedy tokens, teacher-forced through both.
    d = torch.cat([(_logprobs(qm, p, c.tokens) - _logprobs(model, p, c.tokens)).abs() for p, c in zip(PROMPTS, full)])
    assert float(d.mean()) < MEAN_TOL and float(d.max()) < MAX_TOL, (float(d.mean()), float(d.max()))
    # The engine on the copy reports the copy's own log-probs.
    out = generate(qm, PROMPTS, N_NEW)
    for p, c in zip(PROMPTS, out):
        assert torch.allclose(torch.tensor(c.logprobs), _logprobs(qm, p, c.tokens), atol=1e-4)
    # The policy is bitwise what it was, shares no storage with the copy, and is not quantized.
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(p) is torch.nn.Parameter and p.dtype == torch.float32 for p in model.parameters())
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in ptrs for n, p in qm.named_parameters() if n.startswith("layers."))


def test_refresh_takes_the_new_weights():
    model = _model()
    q = QuantizedCopy("int8")
    qm = q.refresh(model)
    x = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        old = qm(x)
        for name, p in model.named_parameters():  # an optimizer step, roughly
            if name.startswith("layers.") and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
        stale = qm(x)
        assert torch.equal(stale, old)  # the copy does not follow the policy by itself
        assert q.refresh(model) is qm   # the same copy, refilled
        new, ref = qm(x), model(x)
    assert not torch.allclose(new, old, atol=1e-3)
    assert (new - ref).abs().max() < (old - ref).abs().max() / 10
    assert q.refreshes == 2


def test_lora_is_merged_into_the_copy():
    from elastic.model.lora import LoRAConfig, apply_lora, init_adapters

    model = apply_lora(_model(), LoRAConfig(rank=4, alpha=8.0, dropout=0.0, targets=("wq", "wv", "w2")))
    init_adapters(model, seed=1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    qm = QuantizedCopy("int8").refresh(model)
    full = generate(model, PROMPTS[:2], 12)
    d = torch.cat([(_logprobs(qm, p, c.tokens) - _logprobs(model, p, c.tokens)).abs() for p, c in zip(PROMPTS, full)])
    assert float(d.max()) < MAX_TOL


def test_fsdp_generate_uses_a_cached_copy_on_a_plain_model():
    from elastic.train.fsdp_generate import fsdp_generate

    model = _model()
    before = _state(model)
    out = fsdp_generate(model, PROMPTS, 8, weights="int8")
    q = model._elastic_quantized
    assert [c.tokens for c in out] == [c.tokens for c in generate(q.model, PROMPTS, 8)]
    fsdp_generate(model, PROMPTS, 8, weights="int8")
    assert model._elastic_quantized is q and q.refreshes == 2  # refreshed per call, built once
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert "_elastic_quantized" not in dict(model.named_modules())


def test_full_is_the_model_itself_and_int4_is_refused_on_cpu():
    model = _model()
    assert QuantizedCopy("full").refresh(model) is model
    with pytest.raises(QuantizationError, match="int4 needs CUDA and bfloat16"):
        QuantizedCopy("int4").refresh(model)
    with pytest.raises(QuantizationError, match="must be full|int8|int4"):
        QuantizedCopy("int3")
    check_weights("int8", torch.device("cpu"), torch.float32)


def test_config_validation():
    assert from_dict({}).generation.weights == "full"
    assert from_dict({"generation": {"weights": "int8"}}).generation.weights == "int8"
    with pytest.raises(ConfigError, match=r"^generation.weights: must be full\|int8\|int4, got 'fp8'$"):
        from_dict({"generation": {"weights": "fp8"}})
    with pytest.raises(ConfigError, match="generation.weights: int4 runs on CUDA with bfloat16"):
        from_dict({"generation": {"weights": "int4"}, "train": {"param_dtype": "fp32"}})
    cfg = from_dict({"generation": {"weights": "int4"}})
    from elastic.launch.driver import check_generation_weights

    with pytest.raises(ConfigError, match="int4 needs CUDA"):
        check_generation_weights(cfg, gpu=False, job="grpo")
    check_generation_weights(cfg, gpu=True, job="grpo")
    check_generation_weights(cfg, gpu=False, job="pretrain")  # no rollouts: nothing to refuse


def test_config_names_agree():
    from elastic.config.load import GENERATION_WEIGHTS
    from elastic.generation.quantized import WEIGHTS

    assert GENERATION_WEIGHTS == WEIGHTS


def test_eval_generates_with_the_copy_and_scores_with_the_model():
    """jobs/eval.py --weights int8: ItemEvaluator.gen_model generates; scoring keeps `model`."""
    from elastic.eval.evaluate import ItemEvaluator, TokenizerView

    model = _model()
    qm = QuantizedCopy("int8").refresh(model)
    tok = TokenizerView(encode=list, encode_plain=list, decode=str, eos_id=299, prefix_id=0)
    ev = ItemEvaluator(model, tok, 64, gen_model=qm)
    got = ev._generate(PROMPTS, 8, 0.0, 1.0, [0] * len(PROMPTS), [])
    want = generate(qm, PROMPTS, 8, stop_token_ids=[299])
    assert [c.logprobs for c in got] == [c.logprobs for c in want]
    assert ev.model is model
