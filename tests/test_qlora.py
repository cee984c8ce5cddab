"""QLoRA (`model.quantize_base: nf4`): the frozen base's block linears in NF4 (torchao), LoRA on top.

- NF4 against bitsandbytes (the reference QLoRA quantizer) with one level of quantization: the
  per-block absmax is the same, bit for bit; the 4-bit codes (packed two per byte, high nibble
  first) are the same except for values within 2e-5 of a boundary between two codes, which
  torchao's codebook (bnb's 16 values rounded to 4 decimals) moves (2 of 49152 codes here). Our
  stored tensor is torchao's own `to_nf4` of the weight, bit for bit. The double quantizations
  differ (torchao: int8 absmax after subtracting their mean; bnb: its dynamic 8-bit map).
- A QLoRA step against PEFT + bitsandbytes on the same weights: see
  test_qlora_step_matches_peft_bitsandbytes for the three references and their tolerances.
- Through the trainer (2 FSDP workers over gloo for a step, then resumed at 1): checkpoints hold the adapters
  only and record `quantize_base`; the merged export (the base's NF4 round trip + adapters) and
  the PEFT export give the logits of our QLoRA model.
"""

import json

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, load_config

LORA = {"model.lora.rank": 4, "model.lora.alpha": 8.0}


def test_config_needs_lora():
    with pytest.raises(ConfigError, match="model.quantize_base: nf4 quantizes the frozen base of LoRA"):
        load_config(None, ["model.quantize_base=nf4"])
    with pytest.raises(ConfigError, match="model.quantize_base: unknown 'int4'"):
        load_config(None, ["model.quantize_base=int4", "model.lora.rank=4"])
    with pytest.raises(ConfigError, match="dpo.reference: precomputed scores the unquantized base"):
        load_config(None, ["model.quantize_base=nf4", "model.lora.rank=4", "dpo.reference=precomputed"])
    assert load_config(None, ["model.quantize_base=nf4", "model.lora.rank=4"]).model.quantize_base == "nf4"
    from elastic.config.load import QUANTIZE_BASE
    from elastic.model import quantize

    assert QUANTIZE_BASE == quantize.QUANTIZE_BASE


def test_build_model_quantizes_block_linears_only():
    """The single-process build: block linears in NF4 (frozen), embeddings/norms/head as they
    were; forward and backward run and only the adapters get gradients."""
    from elastic.model.quantize import dequantize, is_nf4
    from elastic.train.loop import build_model

    cfg = load_config(None, ["model.quantize_base=nf4", "model.lora.rank=4", "data.vocab_size=320", "data.seq_len=32"])
    model, _, _ = build_model(cfg, torch.device("cpu"))
    nf4 = {n for n, p in model.named_parameters() if is_nf4(p)}
    assert nf4 == {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("layers.")}
    assert len(nf4) == 7 * len(model.layers)
    assert not is_nf4(model.tok_embeddings.weight) and not is_nf4(model.output.weight)
    w = model.layers[0].attention.wq.weight
    assert not w.requires_grad and dequantize(w).shape == w.shape
    model(torch.randint(0, 320, (2, 16))).float().square().mean().backward()
    assert {n for n, p in model.named_parameters() if p.grad is not None} == \
        {n for n, _ in model.named_parameters() if n.endswith((".lora_A", ".lora_B"))}


def test_nf4_matches_bitsandbytes_bit_for_bit():
    bnb = pytest.importorskip("bitsandbytes")
    from elastic.model.quantize import BLOCK_SIZE, dequantize, scaler_block_size, to_nf4
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4 as torchao_to_nf4

    w = torch.randn(256, 192, generator=torch.Generator().manual_seed(0)) * 0.02
    ours = to_nf4(w)
    # One level (no double quantization) in bnb: per-block absmax and packed codes.
    packed, st = bnb.functional.quantize_4bit(w, blocksize=BLOCK_SIZE, quant_type="nf4", compress_statistics=False)
    absmax = w.flatten().view(-1, BLOCK_SIZE).abs().amax(dim=1)
    assert torch.equal(st.absmax, absmax)  # torchao's first-level scalers are this same absmax
    np.testing.assert_allclose(ours.nf4.numpy(), st.code.numpy(), atol=5e-5)
    # Codes (packed two per byte, high nibble first): equal except where a value lies on the
    # boundary between two codes that torchao's 4-decimal codebook moves (here 2 of 49152 codes,
    # each within 2e-5 of bnb's exact midpoint).
    theirs_codes = torch.stack([packed.flatten() >> 4, packed.flatten() & 15], 1).flatten().long()
    our_codes = torch.stack([ours.quantized_data >> 4, ours.quantized_data & 15], 1).flatten().long()
    differ = (theirs_codes != our_codes).nonzero().flatten()
    assert len(differ) <= 4, len(differ)
    scaled = (w.flatten().view(-1, BLOCK_SIZE) / absmax[:, None]).flatten()
    code = st.code.double()
    for i in differ.tolist():
        lo, hi = sorted((int(theirs_codes[i]), int(our_codes[i])))
        assert hi == lo + 1 and abs(float(scaled[i]) - float(code[lo] + code[hi]) / 2) < 2e-5
    # Our stored tensor is torchao's own quantization of the weight.
    ref = torchao_to_nf4(w, BLOCK_SIZE, scaler_block_size(w.numel()))
    for a in ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4"):
        assert torch.equal(getattr(ours, a), getattr(ref, a))
    # Double quantization differs between the libraries; the dequantized weights stay close.
    packed2, st2 = bnb.functional.quantize_4bit(w, blocksize=BLOCK_SIZE, quant_type="nf4", compress_statistics=True)
    theirs = bnb.functional.dequantize_4bit(packed2, st2)
    assert torch.equal(packed2, packed)
    # Double quantization differs between the libraries (torchao: int8 absmax minus their mean;
    # bnb: its dynamic 8-bit map): where the codes agree, the dequantized values differ only by
    # the block scale, within 2% of the block's absmax.
    diff = (dequantize(ours) - theirs).flatten().view(-1, BLOCK_SIZE).abs() / absmax[:, None]
    same = (theirs_codes == our_codes).view(-1, BLOCK_SIZE)
    assert float(diff[same].max()) < 2e-2


PROJ = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
        "w1": "mlp.gate_proj", "w3": "mlp.up_proj", "w2": "mlp.down_proj"}


def _bnb_peft(hf_dir, ours, same_codes: bool, plain: bool = False):
    """transformers + bitsandbytes Linear4bit (nf4) on every block linear + PEFT LoRA whose
    adapters are our model's. `same_codes`: bnb's codes and block scales are set to ours (one
    level, the scales being our dequantized double-quantized absmax), so both sides compute with
    the same base up to the codebooks' last digits; else bnb quantizes the HF weights itself
    (nf4 + its double quantization) and the two bases differ by the libraries' double quantization."""
    import bitsandbytes as bnb
    import peft
    import transformers

    from elastic.model.quantize import dequantize

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    for i, layer in enumerate(model.model.layers):
        for w, path in PROJ.items():
            parent, attr = path.split(".")
            lin = getattr(getattr(layer, parent), attr)
            mine = ours.get_parameter(f"layers.{i}.{'attention' if w in ('wq', 'wk', 'wv', 'wo') else 'feed_forward'}.{w}.weight")
            if plain:  # the very values our forward computes with, in a plain nn.Linear
                with torch.no_grad():
                    lin.weight.copy_(dequantize(mine))
                continue
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.float32,
                                  quant_type="nf4", compress_statistics=not same_codes)
            q.weight = bnb.nn.Params4bit(lin.weight.data.clone(), requires_grad=False, quant_type="nf4",
                                         compress_statistics=not same_codes, blocksize=64)
            q = q.to("cpu")
            if same_codes:
                scales = mine.dequantize_scalers(mine.quantized_scalers, mine.quantization_factor, mine.scaler_block_size)
                q.weight.data.copy_(mine.quantized_data.view(-1, 1))
                q.weight.quant_state.absmax.copy_(scales)
            setattr(getattr(layer, parent), attr, q)
    cfg = peft.LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=[p.split(".")[1] for p in PROJ.values()])
    model = peft.get_peft_model(model, cfg)
    from elastic.model.lora import adapter_parameters, peft_state

    theirs = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in peft_state({n: p.detach() for n, p in adapter_parameters(ours).items()}).items():
            theirs[k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")].copy_(v)
    return model


def test_qlora_step_matches_peft_bitsandbytes(tmp_path):
    """One QLoRA step (loss, adapter gradients, loss after one AdamW step) of our model against
    PEFT LoRA on transformers, from the same HF weights and the same adapters (B non-zero so the
    adapters count), CPU, fp32 compute. Three references:

    1. PEFT on plain nn.Linear weights set to our dequantized NF4 values (the same base): equal,
       bit for bit.
    2. PEFT on bitsandbytes' Linear4bit holding our 4-bit codes and block scales (one level; the
       scales are our dequantized double-quantized absmax): within 1e-4 (measured ~5e-6; the base
       differs only by torchao's 4-decimal codebook vs bnb's exact one, which bnb's CPU kernel
       hard-codes).
    3. PEFT on Linear4bit quantizing the weights itself (nf4, bnb's double quantization): within
       1e-3 (measured ~1e-4 loss, ~3e-4 gradient): the libraries' double quantizations differ,
       so the two bases differ by up to ~1% of a block's absmax.
    """
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    import torch.nn.functional as F

    from elastic.model.hf import from_pretrained
    from elastic.model.lora import LoRAConfig, adapter_parameters, apply_lora, hf_adapter_prefix, init_adapters
    from elastic.model.quantize import quantize_base
    from tests.hf_helpers import make_hf_dir

    make_hf_dir(tmp_path / "base", "llama")
    ours = from_pretrained(str(tmp_path / "base"))
    apply_lora(ours, LoRAConfig(rank=4, alpha=8.0))
    init_adapters(ours, seed=0)
    with torch.no_grad():
        for n, p in adapter_parameters(ours).items():
            if n.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.05)
    quantize_base(ours)
    x = torch.from_numpy(np.random.default_rng(0).integers(2, 300, size=(2, 32)))

    def step(model, logits_of, params):
        opt = torch.optim.AdamW(params, lr=1e-2)
        loss = F.cross_entropy(logits_of(model).flatten(0, 1)[:-1], x.flatten()[1:])
        loss.backward()
        grads = [p.grad.clone() for p in params]
        opt.step()
        with torch.no_grad():
            after = F.cross_entropy(logits_of(model).flatten(0, 1)[:-1], x.flatten()[1:])
        return float(loss), grads, float(after)

    names = list(adapter_parameters(ours))
    theirs_name = [f"{hf_adapter_prefix(n.rsplit('.', 1)[0] + '.weight')}.{n.rsplit('.', 1)[1]}.default.weight" for n in names]
    results = []
    for same, plain in ((True, True), (True, False), (False, False)):
        ref = _bnb_peft(tmp_path / "base", ours, same, plain)
        tp = dict(ref.named_parameters())
        results.append(step(ref, lambda m: m(input_ids=x).logits, [tp[n] for n in theirs_name]))
    mine = step(ours, lambda m: m(x), [adapter_parameters(ours)[n] for n in names])
    diffs = [(abs(r[0] - mine[0]), abs(r[2] - mine[2]), max(float((a - b).abs().max()) for a, b in zip(r[1], mine[1])))
             for r in results]
    print("QLoRA vs PEFT (loss, loss after one step, adapter gradient): plain dequantized base %s; bnb with our codes "
          "and scales %s; bnb quantizing itself %s" % tuple(tuple(f"{v:.1e}" for v in d) for d in diffs))
    assert diffs[0] == (0.0, 0.0, 0.0)  # the same base values: bit for bit
    assert max(diffs[1]) < 1e-4  # bnb's Linear4bit on our codes and scales (measured ~5e-6)
    assert max(diffs[2]) < 1e-3  # two quantizations of the same weights (measured ~3e-4)


def _metadata_keys(step_dir):
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def test_qlora_sft_two_workers_resume_and_export(ray_local, tmp_path):
    """2 FSDP workers (gloo) for a step, resumed at 1 worker for the 2nd; then both exports."""
    import transformers

    from elastic.launch.pretrain import run_pretraining
    from elastic.model.hf import export_checkpoint, export_peft, from_pretrained
    from tests.hf_helpers import make_hf_dir
    from tests.helpers import read_jsonl
    from tests.test_sft import _rows, _write

    peft = pytest.importorskip("peft")
    base = tmp_path / "base"
    make_hf_dir(base, "llama")
    store = tmp_path / "runs"
    data = _write(tmp_path / "sft", _rows(16))
    o = {"run.storage_path": str(store), "run.name": "qlora", "model.init_from": str(base), "data.source": str(data),
         "data.seq_len": 128, "train.steps": 2, "train.global_batch_size": 4, "train.micro_batch_size": 2, "train.lr": 1e-2,
         "train.warmup_steps": 0, "checkpoint.every_steps": 1, "wandb.mode": "disabled", "eval.every_steps": 0,
         "model.quantize_base": "nf4", **LORA}
    run_pretraining(load_config(None, [f"{k}={v}" for k, v in {**o, "train.until_step": 1}.items()]), kind="sft",
                    progress=False)
    res = run_pretraining(load_config(None, [f"{k}={v}" for k, v in {**o, "scaling.min_workers": 1,
                                                                        "scaling.max_workers": 1}.items()]),
                          kind="sft", progress=False)
    m = read_jsonl(store / "qlora" / "metrics.jsonl")
    assert [r["world_size"] for r in m] == [2, 1] and all(np.isfinite(r["loss"]) for r in m)
    assert all(k.endswith((".lora_A", ".lora_B")) for k in _metadata_keys(res.checkpoint) if k.startswith("model."))
    rec = json.loads((store / "qlora" / "step_00000002" / "train_state.json").read_text())["lora"]
    assert rec["quantize_base"] == "nf4" and rec["rank"] == 4

    # Our QLoRA model (the base's NF4 round trip + adapters) against both exports.
    ours = from_pretrained(res.checkpoint, merge_lora=False).eval()
    x = torch.from_numpy(np.random.default_rng(0).integers(2, 300, size=(2, 24)))
    with torch.no_grad():
        want = ours(x)
    export_checkpoint(res.checkpoint, str(tmp_path / "merged"), merge_lora=True)
    export_peft(res.checkpoint, str(tmp_path / "peft"))
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    # PEFT's adapters go on the dequantized base: the merged export with B = 0 is not at hand,
    # so put them on the merged model's base, i.e. the NF4 round trip of the original base.
    from safetensors.torch import load_file, save_file

    from elastic.model.quantize import nf4_roundtrip

    w = load_file(str(base / "model.safetensors"))
    w = {k: nf4_roundtrip(v) if k.endswith("proj.weight") else v for k, v in w.items()}
    save_file(w, str(base / "model.safetensors"), metadata={"format": "pt"})
    with_peft = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base),
                                               str(tmp_path / "peft")).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(with_peft(x).logits, want, atol=1e-5, rtol=1e-5)


def test_qlora_from_our_own_checkpoint_equals_the_path_via_its_hf_export(ray_local, tmp_path):
    """Issue 58: `model.quantize_base: nf4` with `model.init_from` one of our full checkpoints (a
    user's own SFT output, the first thing they fine-tune) stopped before Ray with "export it".
    Quantized from the DCP checkpoint directly, the NF4 codes and scalers are those quantized
    from its Hugging Face export, bit for bit, and a real first QLoRA step (2 FSDP workers) has
    the same loss on both. A LoRA checkpoint as the base is still refused, in one line."""
    from elastic.launch.pretrain import run_pretraining
    from elastic.model.hf import check_init_from, export_checkpoint
    from elastic.model.quantize import dequantize, is_nf4
    from elastic.train.loop import build_model, load_weights_from
    from tests.hf_helpers import make_hf_dir
    from tests.helpers import read_jsonl
    from tests.test_sft import _rows, _write

    base = tmp_path / "base"
    make_hf_dir(base, "llama")
    store = tmp_path / "runs"
    data = _write(tmp_path / "sft", _rows(16))
    o = {"run.storage_path": str(store), "data.source": str(data), "data.seq_len": 128, "train.steps": 1,
         "train.global_batch_size": 4, "train.micro_batch_size": 2, "train.lr": 1e-2, "train.warmup_steps": 0,
         "checkpoint.every_steps": 1, "wandb.mode": "disabled", "eval.every_steps": 0}

    def cfg_of(**kv):
        return load_config(None, [f"{k}={v}" for k, v in {**o, **kv}.items()])

    full = run_pretraining(cfg_of(**{"run.name": "full", "model.init_from": str(base)}), kind="sft", progress=False)
    exported = tmp_path / "exported"
    export_checkpoint(full.checkpoint, str(exported))
    sources = {"dcp": str(full.checkpoint), "hf": str(exported)}
    q = {"model.quantize_base": "nf4", **LORA}

    codes = {}
    for name, src in sources.items():
        cfg = cfg_of(**{"model.init_from": src}, **q)
        check_init_from(cfg)  # the driver's check: accepted
        model, _, _ = build_model(cfg, torch.device("cpu"))
        load_weights_from(model, src)
        codes[name] = {n: (p.quantized_data.clone(), dequantize(p)) for n, p in model.named_parameters() if is_nf4(p)}
    assert codes["dcp"].keys() == codes["hf"].keys() and len(codes["dcp"]) == 7 * 2
    for n, (data_dcp, w_dcp) in codes["dcp"].items():
        assert torch.equal(data_dcp, codes["hf"][n][0]) and torch.equal(w_dcp, codes["hf"][n][1]), n

    loss = {}
    for name, src in sources.items():
        run_pretraining(cfg_of(**{"run.name": f"q-{name}", "model.init_from": src}, **q), kind="sft", progress=False)
        loss[name] = read_jsonl(store / f"q-{name}" / "metrics.jsonl")[0]["loss"]
    print(f"first QLoRA step's loss: from our checkpoint {loss['dcp']!r}, from its HF export {loss['hf']!r}")
    assert np.isfinite(loss["dcp"]) and abs(loss["dcp"] - loss["hf"]) < 1e-6

    lora_ckpt = sorted((store / "q-dcp").glob("step_*"))[-1]
    with pytest.raises(ConfigError, match=r"^model\.quantize_base: nf4 quantizes a full base; .* holds LoRA adapters"):
        check_init_from(cfg_of(**{"model.init_from": str(lora_ckpt)}, **q))
