"""LoRA through the trainer on a local Ray cluster with 2 FSDP workers: SFT with adapters on a
Hugging Face base, then DPO with adapters starting from that LoRA checkpoint.

- checkpoints hold the adapters (and their optimizer state) only, and record the base by path
  and content hash; a changed base is refused before Ray starts;
- under LoRA the DPO reference is the policy with its adapters off: the first loss is log 2;
- a LoRA run stopped at step 2 and resumed at world size 1 has the same per-step losses as the
  uninterrupted 2-worker run;
- `jobs/export_hf.py --merge-lora` gives a transformers model whose logits equal our unmerged
  model's, and `--peft` gives an adapter directory that `peft` loads on the (exported) base with
  the same logits; without either flag the export refuses in one line.
"""

import json

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, load_config
from elastic.launch.dpo import run_dpo
from elastic.launch.pretrain import run_pretraining
from tests.helpers import read_jsonl
from tests.test_dpo import dpo_overrides, preference_rows, write_rows
from tests.test_sft import _rows, _write

LORA = {"model.lora.rank": 4, "model.lora.alpha": 8.0}


def _metadata_keys(step_dir):
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def test_lora_sft_then_lora_dpo_resume_export_and_peft(ray_local, tmp_path):
    import transformers
    from safetensors.torch import load_file, save_file

    from elastic.launch.lora_base import check_lora_base
    from elastic.model.hf import export_checkpoint, export_peft, from_pretrained
    from jobs.export_hf import main as export_main
    from tests.hf_helpers import make_hf_dir

    peft = pytest.importorskip("peft")
    base = tmp_path / "base"
    make_hf_dir(base, "llama")
    store = tmp_path / "runs"

    # SFT with adapters on the Hugging Face base.
    sft_data = _write(tmp_path / "sft", _rows(16))
    o = {"run.storage_path": str(store), "run.name": "sft-lora", "model.init_from": str(base), "data.source": str(sft_data),
         "data.seq_len": 128, "train.steps": 3, "train.global_batch_size": 4, "train.micro_batch_size": 2, "train.lr": 1e-2,
         "train.warmup_steps": 0, "checkpoint.every_steps": 3, "wandb.mode": "disabled", **LORA}
    sft_cfg = load_config(None, [f"{k}={v}" for k, v in o.items()])
    sft = run_pretraining(sft_cfg, kind="sft", progress=False)
    keys = _metadata_keys(sft.checkpoint)
    model_keys = {k for k in keys if k.startswith("model.")}
    assert model_keys and all(k.endswith((".lora_A", ".lora_B")) for k in model_keys)  # no base tensor saved
    assert not any(k.startswith("optim.") and not (".lora_A" in k or ".lora_B" in k) for k in keys if "state" in k)
    rec = json.loads((tmp_path / "runs" / "sft-lora" / "step_00000003" / "train_state.json").read_text())["lora"]
    assert rec["base"] == str(base) and len(rec["base_sha256"]) == 64 and rec["rank"] == 4
    sm = read_jsonl(store / "sft-lora" / "metrics.jsonl")
    assert sm[-1]["loss"] < sm[0]["loss"]

    # DPO with fresh adapters from the LoRA SFT checkpoint (its adapters merged into its base).
    data = write_rows(tmp_path / "prefs" / "pairs.jsonl", preference_rows(16))
    extra = {**LORA, "eval.every_steps": 0, "train.steps": 4, "checkpoint.every_steps": 2}
    cfg_a = load_config(None, dpo_overrides(store, "dpo-a", sft.checkpoint, data, **extra), job="dpo")
    a = run_dpo(cfg_a, progress=False)
    ma = read_jsonl(store / "dpo-a" / "metrics.jsonl")
    assert ma[0]["loss"] == pytest.approx(np.log(2), abs=1e-5) and ma[0]["reference_from"] == "adapters_off"
    assert ma[-1]["reward_margin"] > ma[0]["reward_margin"]
    assert all(k.endswith((".lora_A", ".lora_B")) for k in _metadata_keys(a.checkpoint) if k.startswith("model."))
    run_dpo(load_config(None, dpo_overrides(store, "dpo-b", sft.checkpoint, data, **extra, **{"train.until_step": 2}),
                        job="dpo"), progress=False)
    run_dpo(load_config(None, dpo_overrides(store, "dpo-b", sft.checkpoint, data, **extra,
                                            **{"scaling.min_workers": 1, "scaling.max_workers": 1}), job="dpo"), progress=False)
    mb = read_jsonl(store / "dpo-b" / "metrics.jsonl")
    assert [r["world_size"] for r in mb] == [2, 2, 1, 1]
    np.testing.assert_allclose([r["loss"] for r in mb], [r["loss"] for r in ma], rtol=1e-5)

    # Export: merged (transformers) and PEFT (on the merged SFT base) against our unmerged model.
    ours = from_pretrained(a.checkpoint, merge_lora=False).eval()
    assert any(n.endswith("lora_B") and float(p.detach().abs().max()) > 0 for n, p in ours.named_parameters())
    x = torch.from_numpy(np.random.default_rng(0).integers(2, 300, size=(2, 24)))
    with torch.no_grad():
        want = ours(x)
    with pytest.raises(ConfigError, match="LoRA adapters only"):
        export_checkpoint(a.checkpoint, str(tmp_path / "nope"))
    assert export_main(["--checkpoint", a.checkpoint, "--out", str(tmp_path / "merged"), "--merge-lora"]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    export_checkpoint(sft.checkpoint, str(tmp_path / "sft-merged"), merge_lora=True)
    export_peft(a.checkpoint, str(tmp_path / "peft"))
    with_peft = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sft-merged"),
                                               str(tmp_path / "peft")).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(with_peft(x).logits, want, atol=1e-5, rtol=1e-5)

    # The adapters only fit their base: a changed base is refused before any work.
    assert check_lora_base(sft_cfg, str(store / "sft-lora"))["base_sha256"] == rec["base_sha256"]
    w = load_file(str(base / "model.safetensors"))
    name = next(k for k in w if k.endswith("q_proj.weight"))
    w[name] = w[name] + 1e-3
    save_file(w, str(base / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="is not the one the run's adapters were trained on"):
        check_lora_base(sft_cfg, str(store / "sft-lora"))

