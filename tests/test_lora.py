"""LoRA adapters (elastic/model/lora.py) in one process: a fresh adapter (B = 0) leaves the
model's output unchanged; only adapter tensors get gradients and move; disabling the adapters
gives the base; merging them into the weights gives the unmerged model's logits; the PEFT
rename loads in `peft` on the transformers form of the base with matching logits."""

import json

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, from_dict
from elastic.config.load import LORA_TARGETS
from elastic.model.lora import (TARGETS, LoRAConfig, adapter_parameters, adapters_disabled, apply_lora, init_adapters,
                                merge_state, peft_config, peft_state, trainable_counts)
from elastic.train.loop import build_model
from tests.test_fsdp_equivalence import CFG

LORA = {"rank": 4, "alpha": 8.0}


def _cfg(lora=None, **over):
    model = dict(CFG["model"], **({"lora": lora} if lora else {}))
    return from_dict({**CFG, "model": model, **over})


def _tokens(seed=0, b=3, t=20):
    return torch.from_numpy(np.random.default_rng(seed).integers(2, 300, size=(b, t)))


def _randomise_b(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in adapter_parameters(model).items():
            if n.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_targets_agree_with_config():
    assert tuple(LORA_TARGETS) == TARGETS


def test_zero_b_first_forward_equals_base():
    base, _, _ = build_model(_cfg(), torch.device("cpu"))
    lora, _, _ = build_model(_cfg(LORA), torch.device("cpu"))
    sd_base, sd_lora = base.state_dict(), lora.state_dict()
    assert {k for k in sd_lora if k not in sd_base} == {k for k in sd_lora if k.endswith((".lora_A", ".lora_B"))}
    for k, v in sd_base.items():  # the base draws are the same with or without adapters
        assert torch.equal(v, sd_lora[k]), k
    a = [p for n, p in adapter_parameters(lora).items() if n.endswith("lora_A")]
    assert a and all(float(p.detach().abs().max()) > 0 for p in a)  # A is random, B is zero
    x = _tokens()
    assert torch.equal(base(x), lora(x))


def test_only_adapters_receive_gradients_and_move():
    model, _, _ = build_model(_cfg({**LORA, "targets": ["wq", "wv", "w2"]}), torch.device("cpu"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable, total = trainable_counts(model)
    names = set(adapter_parameters(model))
    assert trainable == sum(p.numel() for p in adapter_parameters(model).values()) and trainable < total // 10
    assert {n.split(".")[3] for n in names} == {"wq", "wv", "w2"} and len(names) == 2 * 3 * 2  # A, B x 3 targets x 2 layers
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(2):
        x = _tokens(step)
        loss = torch.nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        for n, p in model.named_parameters():
            assert (p.grad is not None) == (n in names), n
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    for k, v in before.items():
        moved = not torch.equal(v, after[k])
        assert moved == (k in names), k


def test_disabled_adapters_give_the_base_and_merge_gives_the_unmerged_logits():
    base, _, _ = build_model(_cfg(), torch.device("cpu"))
    model, _, _ = build_model(_cfg(LORA), torch.device("cpu"))
    _randomise_b(model)
    x = _tokens(3)
    with torch.no_grad():
        unmerged = model(x)
        with adapters_disabled(model):
            torch.testing.assert_close(model(x), base(x), atol=0, rtol=0)
        assert float((unmerged - base(x)).abs().max()) > 1e-3  # the adapters do something
    sd = model.state_dict()
    merged = merge_state({k: v for k, v in sd.items()}, sd, LoRAConfig(**LORA).scaling)
    base.load_state_dict(merged)
    with torch.no_grad():
        torch.testing.assert_close(base(x), unmerged, atol=1e-5, rtol=1e-5)


def test_adapter_init_is_seeded():
    a, _, _ = build_model(_cfg(LORA), torch.device("cpu"))
    b, _, _ = build_model(_cfg(LORA), torch.device("cpu"))
    c, _, _ = build_model(_cfg(LORA, run={"seed": 4}), torch.device("cpu"))
    pa, pb, pc = adapter_parameters(a), adapter_parameters(b), adapter_parameters(c)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], pc[k]) for k in pa if k.endswith("lora_A"))


def test_peft_loads_the_adapter_with_matching_logits(tmp_path):
    """Our adapters on a transformers Llama (our from_pretrained of the same directory), renamed
    to PEFT's layout: `PeftModel.from_pretrained` reports nothing missing and its logits equal ours."""
    peft = pytest.importorskip("peft")
    import transformers
    from safetensors.torch import save_file

    from elastic.model.hf import from_pretrained
    from tests.hf_helpers import make_hf_dir

    hf = tmp_path / "base"
    make_hf_dir(hf, "llama")
    ours = from_pretrained(str(hf))
    lora = LoRAConfig(rank=4, alpha=12.0)
    apply_lora(ours, lora)
    init_adapters(ours, seed=0)
    _randomise_b(ours, seed=5)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(peft_state(ours.state_dict()), str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps(peft_config(lora, str(hf))))
    ref = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(hf), str(adapter)).eval()
    x = _tokens(7, t=16)
    with torch.no_grad():
        torch.testing.assert_close(ref(x).logits, ours(x), atol=1e-5, rtol=1e-5)
        with adapters_disabled(ours), ref.disable_adapter():
            torch.testing.assert_close(ref(x).logits, ours(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("over,key", [
    ({"rank": -1}, "model.lora.rank"), ({"rank": 4, "alpha": 0}, "model.lora.alpha"),
    ({"rank": 4, "dropout": 1.0}, "model.lora.dropout"), ({"rank": 4, "targets": ["wq", "q_proj"]}, "model.lora.targets[1]"),
    ({"rank": 4, "targets": []}, "model.lora.targets"), ({"rank": 4, "targets": ["wq", "wq"]}, "model.lora.targets")])
def test_bad_lora_config_is_one_line(over, key):
    with pytest.raises(ConfigError) as e:
        _cfg(over)
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)
