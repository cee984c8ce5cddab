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
        ("train.global_batch_size=7", "train.global_batch_size"),  # 7 does not split over 2 workers
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

    from jobs.pretrain import EMBEDDED_EVAL

    assert to_dict(load_config(str(REPO / "jobs" / "configs" / "tiny.yaml"))) == to_dict(load_config(None, EMBEDDED_EVAL))
    for p in sorted((REPO / "jobs" / "configs").glob("*.yaml")):
        load_config(str(p))  # every shipped config is valid


# ---- the rl section (GRPO): every bad value is one line naming its key, before any work ----

GRPO_3_WORKERS = ["scaling.max_workers=3", "train.global_batch_size=24", "train.micro_batch_size=4"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rl.nope=1"], "rl.nope"),
        (["rl=3"], "rl"),
        (["rl.group_size=1"], "rl.group_size"),
        (["rl.group_size=four"], "rl.group_size"),
        (["rl.prompts_per_step=0"], "rl.prompts_per_step"),
        (["rl.max_new_tokens=0"], "rl.max_new_tokens"),
        (["rl.temperature=0"], "rl.temperature"),
        (["rl.temperature=hot"], "rl.temperature"),
        (["rl.top_p=0"], "rl.top_p"),
        (["rl.top_p=1.5"], "rl.top_p"),
        (["rl.top_k=-1"], "rl.top_k"),
        (["rl.clip_low=0"], "rl.clip_low"),
        (["rl.clip_low=1.0"], "rl.clip_low"),
        (["rl.clip_high=0"], "rl.clip_high"),
        (["reward.kind=python_tests"], "rl.tasks"),  # bring-your-own verifiers read a task file
        (["rl.tasks=t.jsonl"], "rl.tasks"),  # ...and code_opt reads rl.problems
        (["reward.kind=math_answer", "rl.tasks=t.jsonl", "rl.prompt_format=plain"], "rl.prompt_format"),
        (["rl.eval_samples=0"], "rl.eval_samples"),
        (["rl.eval_samples=2", "rl.eval_k=[1, 4]"], "rl.eval_k[1]"),  # pass@4 needs 4 samples
        (["reward.function_timeout_s=0"], "reward.function_timeout_s"),
        (["rl.clip_ratio_c=1"], "rl.clip_ratio_c"),  # dual clip needs a bound > 1 (0 = off)
        (["rl.clip_ratio_c=0.5"], "rl.clip_ratio_c"),
        (["rl.clip_ratio_c=-3"], "rl.clip_ratio_c"),
        (["rl.kl_coef=-0.1"], "rl.kl_coef"),
        (["rl.kl_estimator=k4"], "rl.kl_estimator"),
        (["rl.loss_agg=mean"], "rl.loss_agg"),
        (["rl.adv_norm=std"], "rl.adv_norm"),
        (["rl.negative_weight=-0.1"], "rl.negative_weight"),
        (["rl.negative_weight=2"], "rl.negative_weight"),
        (["rl.filter_zero_variance=maybe"], "rl.filter_zero_variance"),
        (["rl.updates_per_rollout=0"], "rl.updates_per_rollout"),
        (["rl.minibatches_per_update=0"], "rl.minibatches_per_update"),
        (["rl.micro_batch_size=0"], "rl.micro_batch_size"),
        (["rl.overlong_penalty=-1"], "rl.overlong_penalty"),
        (["rl.truncation_penalty=-0.5"], "rl.truncation_penalty"),
        (["rl.overlong_buffer=-1"], "rl.overlong_buffer"),
        (["rl.overlong_penalty=1", "rl.overlong_buffer=0"], "rl.overlong_buffer"),
        (["rl.overlong_penalty=1", "rl.overlong_buffer=300"], "rl.overlong_buffer"),  # > max_new_tokens 256
        (["rl.eval_every=-1"], "rl.eval_every"),
        (["rl.heldout=[]"], "rl.eval_every"),  # evaluation on (default 10) with nothing held out
        (["rl.heldout=[a, a]"], "rl.heldout"),
        (["rl.heldout=[ok, a/b]"], "rl.heldout[1]"),
        (["rl.heldout=column-hashes"], "rl.heldout"),  # a string, not a list
        (["rl.problems=''"], "rl.problems"),
        # the rollout batch must split over every world size in min..max (grpo job only)
        (GRPO_3_WORKERS, "rl.prompts_per_step"),  # 4 x 4 = 16 completions over 3 workers
        (["rl.minibatches_per_update=3"], "rl.minibatches_per_update"),  # 16 into 3 minibatches
    ],
)
def test_bad_rl_config_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as ei:
        load_config(None, overrides, job="grpo")
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(key + ":"), msg


def test_rl_defaults_are_valid_and_the_batch_split_is_checked_only_for_grpo():
    cfg = load_config(None, job="grpo")
    rl = cfg.rl
    assert (rl.group_size, rl.prompts_per_step, rl.max_new_tokens, rl.temperature) == (4, 4, 256, 1.0)
    assert (rl.clip_low, rl.clip_high, rl.loss_agg, rl.adv_norm) == (0.2, 0.28, "token_mean", "group_std")
    assert rl.overlong_penalty == 0 and rl.truncation_penalty == 0  # length shaping is off by default
    # A pretraining run over 2..3 workers does not train on the rl batch: not refused over it.
    assert load_config(None, GRPO_3_WORKERS).scaling.max_workers == 3
    # A GRPO run whose batch does split over 2..4 workers is accepted: 8 x 3 = 24 = 2*12 = 3*8 = 4*6.
    ok = load_config(None, ["scaling.max_workers=4", "train.global_batch_size=24", "train.micro_batch_size=2",
                            "rl.prompts_per_step=8", "rl.group_size=3", "rl.micro_batch_size=2"], job="grpo")
    assert ok.rl.prompts_per_step * ok.rl.group_size == 24
    # minibatches split the step first: 24 / 3 = 8 per optimizer step, which 3 workers cannot share
    with pytest.raises(ConfigError, match=r"^rl\.prompts_per_step: .* over 3 workers"):
        load_config(None, ["scaling.max_workers=4", "train.global_batch_size=24", "train.micro_batch_size=2",
                           "rl.prompts_per_step=8", "rl.group_size=3", "rl.micro_batch_size=2",
                           "rl.minibatches_per_update=3"], job="grpo")
