"""Bad Hugging Face / checkpoint input for `model.init_from`: one line naming the key or
tensor, on the driver, before any worker could start. config.json problems surface when the
config is loaded; weight problems in `check_init_from`, which reads safetensors headers and
DCP metadata only (no tensor data)."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from elastic.config import ConfigError, from_dict, load_config
from elastic.model.hf import check_init_from

pytest.importorskip("transformers")
from tests.hf_helpers import make_hf_dir  # noqa: E402


@pytest.fixture
def hf_dir(tmp_path):
    make_hf_dir(tmp_path / "m", "llama")
    return tmp_path / "m"


def _cfg(d):
    return from_dict({"model": {"init_from": str(d)}})


def _edit_config(d, **kv):
    p = d / "config.json"
    raw = json.loads(p.read_text())
    raw.update(kv)
    p.write_text(json.dumps(raw))


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_unsupported_architecture_at_config_load(hf_dir):
    _edit_config(hf_dir, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"model.init_from={hf_dir}"])
    assert _one_line(e).startswith("model.init_from: ") and "architectures ['GPT2LMHeadModel'] not supported" in str(e.value)


@pytest.mark.parametrize("edit,needle", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0}}, "rope_parameters.rope_type 'yarn' not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' not supported"),
    ({"head_dim": 15}, "head_dim must be a positive even integer (RoPE), got 15"),
    ({"attention_bias": True}, "attention_bias true not supported"),
    ({"hidden_size": None}, "hidden_size must be a positive integer, got None"),
])
def test_unsupported_config_fields_name_the_key(hf_dir, edit, needle):
    _edit_config(hf_dir, **edit)
    with pytest.raises(ConfigError) as e:
        _cfg(hf_dir)
    assert needle in _one_line(e) and "config.json" in str(e.value)


def test_missing_weight_names_the_tensor(hf_dir):
    f = hf_dir / "model.safetensors"
    sd = load_file(f)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, f)
    cfg = _cfg(hf_dir)  # config.json is fine
    with pytest.raises(ConfigError) as e:
        check_init_from(cfg)
    assert "missing tensor model.layers.1.mlp.up_proj.weight" in _one_line(e)


def test_shape_mismatch_names_the_tensor(hf_dir):
    _edit_config(hf_dir, intermediate_size=96)
    with pytest.raises(ConfigError) as e:
        check_init_from(_cfg(hf_dir))
    assert "tensor model.layers.0.mlp.gate_proj.weight has shape [128, 64], config.json implies [96, 64]" in _one_line(e)


def test_unexpected_tensor_is_refused(hf_dir):
    f = hf_dir / "model.safetensors"
    sd = load_file(f)
    sd["model.layers.0.self_attn.o_proj.bias"] = sd["model.norm.weight"].clone()
    save_file(sd, f)
    with pytest.raises(ConfigError) as e:
        check_init_from(_cfg(hf_dir))
    assert "unexpected tensor model.layers.0.self_attn.o_proj.bias" in _one_line(e)


def test_truncated_safetensors_file(hf_dir):
    f = hf_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ConfigError) as e:
        check_init_from(_cfg(hf_dir))
    assert "model.safetensors" in _one_line(e) and "truncated" in str(e.value)


def test_index_pointing_at_missing_shard(tmp_path):
    make_hf_dir(tmp_path / "m", "qwen2", max_shard_size="40KB")
    shard = sorted((tmp_path / "m").glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ConfigError) as e:
        check_init_from(_cfg(tmp_path / "m"))
    assert f"which does not exist" in _one_line(e) and shard.name in str(e.value)


def test_missing_tokenizer_and_missing_dir(hf_dir, tmp_path):
    (hf_dir / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"^model\.init_from: .*tokenizer\.json: not found"):
        _cfg(hf_dir)
    with pytest.raises(ConfigError, match=r"^model\.init_from: .*nope: no such directory"):
        _cfg(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="neither a Hugging Face directory"):
        _cfg(empty)


def test_config_json_not_json(hf_dir):
    (hf_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as e:
        _cfg(hf_dir)
    assert "config.json: not readable JSON" in _one_line(e)


def test_unsupported_dtype_names_the_tensor(hf_dir):
    import torch

    f = hf_dir / "model.safetensors"
    sd = load_file(f)
    sd["model.norm.weight"] = sd["model.norm.weight"].to(torch.float64)
    save_file(sd, f)
    with pytest.raises(ConfigError) as e:
        check_init_from(_cfg(hf_dir))
    assert "tensor model.norm.weight has dtype F64" in _one_line(e)


def test_copy_is_fine(hf_dir, tmp_path):
    """Control: an unmodified copy passes every check."""
    shutil.copytree(hf_dir, tmp_path / "copy")
    check_init_from(_cfg(tmp_path / "copy"))
