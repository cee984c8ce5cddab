"""QLoRA (`model.quantize_base: nf4`): the frozen base's block linears in NF4 (torchao), LoRA on top.

- NF4 against bitsandbytes (the reference QLoRA quantizer) with one level of quantization: the
  same per-block absmax (bit for bit) and the same 4-bit codes, packed the same way (bit for bit);
  the codebooks agree to 5e-5 (torchao rounds bitsandbytes' 16 values to 4 decimals). Our
  stored tensor is torchao's own `to_nf4` of the weight, bit for bit.
- A QLoRA step's loss and adapter gradients against PEFT on transformers with bitsandbytes'
  `Linear4bit` (nf4, double quantization) on the same weights, within 1e-4 (CPU, fp32 compute).
  The two libraries' double quantizations differ (torchao: int8 absmax after subtracting their
  mean; bnb: its dynamic 8-bit map), so both sides compute with the *same* dequantized base:
  bnb quantizes the HF base, its `dequantize_4bit` values are written into an HF directory, and
  our QLoRA model quantizes those with torchao. Since the values are already on bnb's grid, our
  round trip gives them back to ~1e-6 (the codebooks' last digits) and the losses agree.
- Through the trainer (2 FSDP workers over gloo, then resumed at 1): checkpoints hold the adapters
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
    assert load_config(None, ["model.quantize_base=nf4", "model.lora.rank=4"]).model.quantize_base == "nf4"
    from elastic.config.load import QUANTIZE_BASE
    from elastic.model import quantize

    assert QUANTIZE_BASE == quantize.QUANTIZE_BASE


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


def _peft_bnb_model(hf_dir, lora_rank, alpha):
    """transformers + bitsandbytes Linear4bit (nf4, double quant) on every block linear + PEFT LoRA."""
    import bitsandbytes as bnb
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    for name, mod in list(model.named_modules()):
        for attr in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            lin = getattr(mod, attr, None)
            if isinstance(lin, torch.nn.Linear):
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True)
                q.weight = bnb.nn.Params4bit(lin.weight.data.clone(), requires_grad=False, quant_type="nf4",
                                             compress_statistics=True, blocksize=64)
                q.weight = q.weight._quantize("cpu") if hasattr(q.weight, "_quantize") else q.weight
                if lin.bias is not None:
                    q.bias = lin.bias
                setattr(mod, attr, q)
    cfg = peft.LoraConfig(r=lora_rank, lora_alpha=alpha, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return peft.get_peft_model(model, cfg)


def _metadata_keys(step_dir):
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def test_qlora_sft_two_workers_resume_and_export(ray_local, tmp_path):
    """2 FSDP workers (gloo) for 2 steps, resumed at 1 worker for the 3rd; then both exports."""
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
         "data.seq_len": 128, "train.steps": 3, "train.global_batch_size": 4, "train.micro_batch_size": 2, "train.lr": 1e-2,
         "train.warmup_steps": 0, "checkpoint.every_steps": 1, "wandb.mode": "disabled", "eval.every_steps": 0,
         "model.quantize_base": "nf4", **LORA}
    run_pretraining(load_config(None, [f"{k}={v}" for k, v in {**o, "train.until_step": 2}.items()]), kind="sft",
                    progress=False)
    res = run_pretraining(load_config(None, [f"{k}={v}" for k, v in {**o, "scaling.min_workers": 1,
                                                                        "scaling.max_workers": 1}.items()]),
                          kind="sft", progress=False)
    m = read_jsonl(store / "qlora" / "metrics.jsonl")
    assert [r["world_size"] for r in m] == [2, 2, 1] and all(np.isfinite(r["loss"]) for r in m)
    assert all(k.endswith((".lora_A", ".lora_B")) for k in _metadata_keys(res.checkpoint) if k.startswith("model."))
    rec = json.loads((store / "qlora" / "step_00000003" / "train_state.json").read_text())["lora"]
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
