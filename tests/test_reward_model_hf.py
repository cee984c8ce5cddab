"""Reward models (`model.num_labels: 1`) in and out of Hugging Face *ForSequenceClassification.

* Out: random tiny scalar-head models of the three families (Llama untied; Qwen2 with q/k/v
  biases; Qwen3 with q/k norm and head_dim 32 != 64/4), norms and biases randomised so their
  mapping matters, written by `save_hf` and loaded by transformers'
  AutoModelForSequenceClassification with nothing missing or unexpected; its scores on a
  right-padded batch equal `sequence_scores` in fp32 within 1e-5 absolute (the causal-LM parity
  tests' tolerance; scores of magnitude ~1), and importing the directory back gives the same
  weights bit for bit.
* In: transformers' own *ForSequenceClassification (save_pretrained) imported by
  `from_pretrained` and by `model.init_from`, same scores.
* One of our checkpoints of a num_labels 1 run (a reward model started from a causal LM),
  written with DCP in one process as the trainer lays it out (no Ray), exported by
  jobs/export_hf.py unchanged, loads in transformers with equal scores.
* Config errors: one line naming the key.
"""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from elastic.config import ConfigError, from_dict, load_config, resolved_model_dims, to_dict
from elastic.config.init_from import resolve_init_from
from elastic.model import ModelArgs, Transformer
from elastic.model.hf import check_init_from, from_pretrained, hf_key_map, load_hf_state_dict, read_hf_dims, save_hf
from elastic.model.scores import last_token_index, sequence_scores

transformers = pytest.importorskip("transformers")

from elastic.data.tokenizer import EOS, PAD, train_bpe  # noqa: E402
from tests.hf_helpers import TEXT, make_hf_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ATOL = 1e-5
SIZES = dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=128)
FAMILY = {"llama": dict(rope_theta=5000.0),
          "qwen2": dict(qkv_bias=True, rope_theta=20000.0, norm_eps=1e-6),
          "qwen3": dict(qk_norm=True, head_dim=32, rope_theta=1e6, norm_eps=1e-6)}
ARCH = {"llama": "LlamaForSequenceClassification", "qwen2": "Qwen2ForSequenceClassification",
        "qwen3": "Qwen3ForSequenceClassification"}
LENGTHS = (40, 23, 1, 31, 40)  # right-padded to 40; one row of a single token, two unpadded


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """Our BPE (EOS and PAD distinct): (tokenizer.json path, pad id)."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    bpe = train_bpe(TEXT, 300)
    bpe.save(str(path))
    return path, bpe.token_to_id(PAD)


def _randomise(model, seed: int, norms: bool = True) -> None:
    """Biases ~ N(0, 0.1), norm weights ~ N(1, 0.2), the score head ~ N(0, 1/8): the mappings
    matter and scores are of magnitude ~1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif norms and name.endswith("norm.weight"):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.2)
            elif name in ("output.weight", "score.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / 8)


def _ours(kind: str, seed: int = 0) -> Transformer:
    model = Transformer(ModelArgs(**SIZES, num_labels=1, **FAMILY[kind]))
    model.init_weights(seed=seed)
    _randomise(model, seed + 100)
    return model.eval()


def _batch(pad: int, seed: int = 0, lengths=LENGTHS, T: int = 40) -> torch.Tensor:
    """Right-padded rows of random ids (no real token equals `pad`)."""
    x = torch.randint(0, 300, (len(lengths), T), generator=torch.Generator().manual_seed(seed))
    x[x == pad] = (pad + 7) % 300
    for i, n in enumerate(lengths):
        x[i, n:] = pad
    return x


def _hf_scores(hf, x: torch.Tensor, pad: int) -> torch.Tensor:
    out = hf(input_ids=x, attention_mask=(x != pad).long()).logits
    assert out.shape == (x.shape[0], 1)
    return out[:, 0]


def _maxdiff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def _load_seq_cls(path):
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


# -------------------------------------------------------------------------------- pooling

def test_last_token_index_is_transformers_rule():
    pad = 1
    x = _batch(pad, lengths=(5, 1, 0, 8, 3), T=8)
    x[3, 2] = pad  # a pad id inside a row (pad == EOS) is context, never the pooled token
    x[4, 1] = pad
    ours = last_token_index(x, pad)
    ref = (torch.arange(8, dtype=torch.int32) * (x != pad).to(torch.int32)).argmax(-1)  # GenericForSequenceClassification
    assert ours.dtype == torch.int64 and torch.equal(ours, ref.long())
    assert ours.tolist() == [4, 0, 0, 7, 2]  # row 2 is all pad: index 0, like a one-token row


def test_sequence_scores_need_a_scalar_head():
    with pytest.raises(ValueError, match="num_labels 1"):
        sequence_scores(Transformer(ModelArgs(**SIZES)), torch.zeros(1, 4, dtype=torch.long), 0)


# ------------------------------------------------------------------------------------ out

@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_export_loads_as_sequence_classification_with_equal_scores(tmp_path, tok, kind):
    tok_json, pad = tok
    ours = _ours(kind)
    out = tmp_path / "hf"
    files = save_hf(ours.state_dict(), ours.args, str(out), str(tok_json))
    assert "generation_config.json" not in files and not (out / "generation_config.json").exists()
    assert hf_key_map(ours.args)["output.weight"] == "score.weight"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [ARCH[kind]] and cfg["num_labels"] == 1
    assert cfg["id2label"] == {"0": "LABEL_0"} and cfg["label2id"] == {"LABEL_0": 0}
    assert cfg["tie_word_embeddings"] is False and cfg["pad_token_id"] == pad
    hf = _load_seq_cls(out)
    assert type(hf).__name__ == ARCH[kind] and hf.config.num_labels == 1 and hf.config.pad_token_id == pad
    ref_cfg = json.loads(type(hf.config)(num_labels=1).to_json_string())  # the maps as transformers writes them
    assert (ref_cfg["id2label"], ref_cfg["label2id"]) == (cfg["id2label"], cfg["label2id"])
    assert torch.equal(hf.score.weight, ours.output.weight)
    x = _batch(pad)
    with torch.no_grad():
        ref, got = _hf_scores(hf, x, pad), sequence_scores(ours, x, pad)
        no_mask = hf(input_ids=x).logits[:, 0]  # right padding: the mask changes nothing that is pooled
        last_col = ours(x)[:, -1, 0]
    assert got.dtype == torch.float32 and got.shape == (len(LENGTHS),)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(no_mask, ref, atol=ATOL, rtol=0)
    assert _maxdiff(last_col, ref) > 100 * ATOL  # not vacuous: the padded rows pool earlier tokens
    # Import back: the same ModelArgs, the same tensors bit for bit, the same scores.
    args = ModelArgs(**read_hf_dims(str(out)))
    assert args == ours.args
    back = load_hf_state_dict(str(out), args)
    assert set(back) == set(ours.state_dict()) and all(torch.equal(v, ours.state_dict()[k]) for k, v in back.items())
    with torch.no_grad():
        assert torch.equal(sequence_scores(from_pretrained(str(out)), x, pad), got)


def test_export_pads_with_eos_when_the_tokenizer_has_no_pad_token(tmp_path):
    """An HF tokenizer without a pad token: config.json's pad_token_id is its EOS (training
    pads with EOS then, elastic/data/tokenizer.py), so transformers can batch."""
    src = tmp_path / "src"
    src.mkdir()
    train_bpe(TEXT, 300).save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS}))
    ours = _ours("llama")
    save_hf(ours.state_dict(), ours.args, str(tmp_path / "hf"), str(src / "tokenizer.json"))
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["pad_token_id"] == cfg["eos_token_id"] is not None


# ------------------------------------------------------------------------------------- in

def _hf_rm(kind: str, pad: int, seed: int = 0):
    """A random-init transformers *ForSequenceClassification (num_labels 1)."""
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, num_labels=1, pad_token_id=pad)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                                       rms_norm_eps=1e-5, tie_word_embeddings=False)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
    else:  # Qwen3 reward models keep their base's tie_word_embeddings true: it does not apply to `score`
        cfg = transformers.Qwen3Config(**common, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    torch.manual_seed(seed)
    model = getattr(transformers, ARCH[kind])(cfg).eval()
    _randomise(model, seed + 200)
    return model


def _save(model, path: Path) -> Path:
    model.save_pretrained(path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=train_bpe(TEXT, 300), eos_token=EOS, pad_token=PAD).save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_transformers_reward_model_imports_with_equal_scores(tmp_path, tok, kind):
    _, pad = tok
    hf = _hf_rm(kind, pad)
    path = _save(hf, tmp_path / kind)
    dims = read_hf_dims(str(path))
    assert dims["num_labels"] == 1 and dims["tie_embeddings"] is False
    assert dims.get("qk_norm", False) == (kind == "qwen3") and dims["qkv_bias"] == (kind == "qwen2")
    cfg = from_dict({"model": {"init_from": str(path), "num_labels": 1}, "data": {"seq_len": 64}})
    assert resolved_model_dims(cfg) == dict(dims, max_seq_len=64)
    check_init_from(cfg)
    ours = from_pretrained(str(path)).eval()
    assert ours.output.weight.shape == (1, 64) and ours.output.weight is not ours.tok_embeddings.weight
    x = _batch(pad, seed=1)
    with torch.no_grad():
        ref, got = _hf_scores(hf, x, pad), sequence_scores(ours, x, pad)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    # A causal-LM run cannot start from it: one line naming the key.
    with pytest.raises(ConfigError) as e:
        from_dict({"model": {"init_from": str(path)}})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.num_labels: 0 (a causal LM) conflicts with 1 from "), msg


def test_new_score_head_on_a_causal_lm(tmp_path):
    """model.num_labels 1 on a causal LM (tied Qwen2): the backbone's sizes, a new untied head;
    the source is checked as the causal LM it is."""
    make_hf_dir(tmp_path / "lm", "qwen2")
    assert "num_labels" not in resolve_init_from(str(tmp_path / "lm")).dims
    cfg = from_dict({"model": {"init_from": str(tmp_path / "lm"), "num_labels": 1}, "data": {"seq_len": 64}})
    dims = resolved_model_dims(cfg)
    assert dims["num_labels"] == 1 and dims["tie_embeddings"] is False and dims["qkv_bias"] is True
    check_init_from(cfg)
    assert "num_labels" not in resolved_model_dims(from_dict({"model": {"init_from": str(tmp_path / "lm")}}))


# ----------------------------------------------------------------------- our checkpoints

def test_checkpoint_of_a_reward_model_run_exports(tmp_path, tok):
    """A reward-model run that started from a causal LM (HF Llama): its checkpoint resolves to
    num_labels 1 and exports through jobs/export_hf.py as LlamaForSequenceClassification."""
    import torch.distributed.checkpoint as dcp

    _, pad = tok
    make_hf_dir(tmp_path / "sft", "llama")
    run = tmp_path / "rm"
    run.mkdir()
    cfg = from_dict({"model": {"init_from": str(tmp_path / "sft"), "num_labels": 1}, "data": {"seq_len": 64},
                     "run": {"name": "rm", "seed": 5}})
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))  # as the launcher writes it
    model = Transformer(ModelArgs(**resolved_model_dims(cfg)))
    model.init_weights(seed=5)
    _randomise(model, 5)
    step = run / "step_00000001"
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)  # the trainer's "model.*" layout
    (step / "train_state.json").write_text(json.dumps({"step": 1, "world_size": 1}))

    src = resolve_init_from(str(step))
    assert src.dims["num_labels"] == 1 and src.dims["tie_embeddings"] is False
    assert src.tokenizer == str(tmp_path / "sft" / "tokenizer.json")
    check_init_from(from_dict({"model": {"init_from": str(step), "num_labels": 1}}))  # a run continuing from it
    with pytest.raises(ConfigError, match=r"^model\.num_labels: 0 \(a causal LM\) conflicts with 1 from .*rm/config\.json"):
        from_dict({"model": {"init_from": str(step)}})

    out = tmp_path / "hf"
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "export_hf.py"), "--checkpoint", str(step), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    hf = _load_seq_cls(out)
    assert type(hf).__name__ == "LlamaForSequenceClassification" and hf.config.pad_token_id == pad
    ours = from_pretrained(str(step)).eval()
    x = _batch(pad, seed=2, T=48, lengths=(48, 17, 30))
    with torch.no_grad():
        ref, got = _hf_scores(hf, x, pad), sequence_scores(ours, x, pad)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------- config errors

@pytest.mark.parametrize("overrides,key", [
    (["model.num_labels=2"], "model.num_labels"),
    (["model.num_labels=-1"], "model.num_labels"),
    (["model.num_labels=one"], "model.num_labels"),
    (["model.num_labels=1", "model.tie_embeddings=true"], "model.tie_embeddings"),
])
def test_bad_num_labels_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(key + ":"), msg


def test_defaults_are_a_causal_lm_and_a_scalar_head_resolves():
    assert "num_labels" not in resolved_model_dims(load_config(None))
    dims = resolved_model_dims(load_config(None, ["model.num_labels=1"]))
    assert dims["num_labels"] == 1 and dims["tie_embeddings"] is False
    assert Transformer(ModelArgs(**dims)).output.weight.shape == (1, dims["dim"])


@pytest.mark.parametrize("edit,needle", [
    ({"id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}},
     "id2label gives 2 labels for LlamaForSequenceClassification; only 1 is supported"),
    ({"id2label": None, "label2id": None}, "num_labels gives 2 labels"),  # transformers' default: 2
    ({"num_labels": 3}, "num_labels 3 disagrees with id2label's 1 labels"),
])
def test_hf_classifier_with_other_label_counts_is_one_line(tmp_path, tok, edit, needle):
    path = _save(_hf_rm("llama", tok[1]), tmp_path / "m")
    raw = json.loads((path / "config.json").read_text())
    raw.update(edit)
    (path / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    with pytest.raises(ConfigError) as e:
        from_dict({"model": {"init_from": str(path), "num_labels": 1}})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.init_from: ") and needle in msg and "config.json" in msg, msg
