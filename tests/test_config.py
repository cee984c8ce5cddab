"""Bad configs stop with one line naming the key, before any Ray work starts."""

import subprocess
import sys

import pytest

from elastic.config import ConfigError, load_config
from tests.conftest import REPO


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.stepz=1", "train.stepz"),
        ("train.steps=abc", "train.steps"),
        ("train.lr=-1", "train.lr"),
        ("train.global_batch_size=6", "train.global_batch_size"),
        ("scaling.max_workers=3", "train.global_batch_size"),
        ("model.preset=2b", "model.preset"),
        ("model.n_heads=3", "model.n_heads"),
        ("data.format=csv", "data.format"),
        ("wandb=3", "wandb"),
        ("nosuchsection.x=1", "nosuchsection"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as ei:
        load_config(None, [override])
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(key + ":"), msg


def test_yaml_and_overrides_compose(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  steps: 7\n  lr: 0.01\nmodel:\n  preset: tiny\n  dim: 64\n")
    cfg = load_config(str(p), ["train.lr=0.02", "scaling.resources_per_worker={trainer: 1}"])
    assert cfg.train.steps == 7 and cfg.train.lr == 0.02 and cfg.model.dim == 64
    assert cfg.scaling.resources_per_worker == {"trainer": 1.0}


def test_invalid_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  steps: [1,\n")
    with pytest.raises(ConfigError) as ei:
        load_config(str(p))
    assert str(p) in str(ei.value) and "line" in str(ei.value)


def test_entry_point_rejects_bad_key_before_ray_starts(tmp_path):
    """The job exits non-zero with the one-line error and never starts Ray."""
    r = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "pretrain.py"), "--set", "train.stepz=3",
         "--set", f"run.storage_path={tmp_path}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert "train.stepz: unknown key" in r.stderr
    assert "Started a local Ray instance" not in r.stderr + r.stdout
    assert not (tmp_path / "tiny-demo").exists()


def test_shipped_configs_load_and_tiny_is_the_embedded_default():
    from elastic.config import to_dict

    assert to_dict(load_config(str(REPO / "jobs" / "configs" / "tiny.yaml"))) == to_dict(load_config(None))
    for p in sorted((REPO / "jobs" / "configs").glob("*.yaml")):
        load_config(str(p))  # every shipped config is valid
