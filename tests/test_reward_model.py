"""Reward models: the Bradley-Terry loss by hand; jobs/reward_model.py end to end on 2 FSDP
workers (a new score head on a causal LM's backbone learns a preference, held-out accuracy);
its checkpoint exported as LlamaForSequenceClassification scores like transformers; and
`reward.kind: model` serving it to GRPO from Ray actors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, load_config
from elastic.rl.reward_model import bradley_terry_loss, last_token_index
from tests.helpers import read_jsonl


def test_bradley_terry_loss_by_hand():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.5])
    t = bradley_terry_loss(c, r)
    assert t.losses.tolist() == pytest.approx([math.log1p(math.exp(-1.0)), math.log1p(math.exp(0.5))])
    assert t.margins.tolist() == [1.0, -0.5]
    t = bradley_terry_loss(c, r, margin=torch.tensor([1.0, 0.0]), center_coef=0.1)
    assert t.losses.tolist() == pytest.approx([math.log(2) + 0.1 * 9.0, math.log1p(math.exp(0.5)) + 0.1 * 0.25])


def test_last_token_index_of_right_padded_rows():
    doc = torch.tensor([[0, 0, 0, -1], [0, -1, -1, -1], [0, 0, 0, 0]])
    assert last_token_index(doc).tolist() == [2, 0, 3]


def _pairs(path, n, seed):
    """Chosen answers end with ' yes', rejected with ' no' (one word to learn)."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "ray", "torch"]
    with open(path, "w") as f:
        for i in range(n):
            body = " ".join(rng.choice(words, size=int(rng.integers(2, 6))))
            f.write(json.dumps({"prompt": f"is {body} right?", "chosen": f"{body} yes", "rejected": f"{body} no",
                                "m": 0.5}) + "\n")
    return str(path)


def _rm_overrides(store, name, init_from, train, held, steps, **extra):
    o = {"run.storage_path": str(store), "run.name": name, "model.init_from": init_from, "model.num_labels": 1,
         "data.source": train, "eval.source": held, "eval.every_steps": steps, "eval.samples": 16,
         "data.seq_len": 64, "train.steps": steps, "train.global_batch_size": 8, "train.micro_batch_size": 2,
         "train.lr": 3e-3, "train.warmup_steps": 0, "train.weight_decay": 0.0, "checkpoint.every_steps": steps,
         "wandb.mode": "disabled", "scaling.min_workers": 2, "scaling.max_workers": 2,
         "reward_model.margin_field": "m", "reward_model.center_rewards_coefficient": 0.01}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


@pytest.fixture(scope="module")
def trained(ray_local, tmp_path_factory):
    from elastic.launch.reward_model import run_reward_model
    from tests.hf_helpers import make_hf_dir

    tmp = tmp_path_factory.mktemp("rm")
    base = tmp / "base"
    make_hf_dir(base, "llama")
    train, held = _pairs(tmp / "train.jsonl", 64, 0), _pairs(tmp / "held.jsonl", 16, 1)
    res = run_reward_model(load_config(None, _rm_overrides(tmp / "runs", "rm", str(base), train, held, 12),
                                       job="reward_model"), progress=False)
    return tmp, base, res


def test_reward_model_job_learns_a_preference(trained):
    tmp, base, res = trained
    assert res.checkpoint.endswith("step_00000012") and not res.stopped
    m = [r for r in read_jsonl(tmp / "runs" / "rm" / "metrics.jsonl") if "step" in r]
    assert len(m) == 12 and all("accuracy" in r and "score_margin" in r for r in m)
    last = m[-1]
    assert last["heldout_pairs"] == 16 and last["heldout_accuracy"] == 1.0  # ' yes' over ' no', every held-out pair
    assert last["heldout_score_margin"] > 0.5
    assert m[-1]["loss"] < m[0]["loss"]


def test_reward_model_checkpoint_exports_with_transformers_parity(trained, tmp_path):
    """The trained checkpoint as LlamaForSequenceClassification: transformers' scores of prompt +
    answer rows equal ours (score_sequences on the checkpoint)."""
    import transformers

    from elastic.model.hf import export_checkpoint, from_pretrained
    from elastic.rl.reward_model import score_sequences

    tmp, base, res = trained
    out = tmp_path / "hf"
    export_checkpoint(res.checkpoint, str(out))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForSequenceClassification"] and cfg["pad_token_id"] is not None
    ours = from_pretrained(res.checkpoint).eval()
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["is alpha right? alpha yes", "is ray torch beta right? ray torch beta no", "x"]
    seqs = [tok(t)["input_ids"] for t in texts]
    L = max(map(len, seqs))
    ids = torch.tensor([s + [cfg["pad_token_id"]] * (L - len(s)) for s in seqs])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=(ids != cfg["pad_token_id"]).long()).logits[:, 0]
    np.testing.assert_allclose(score_sequences(ours, seqs), theirs.numpy(), atol=1e-5)
    back = from_pretrained(str(out)).eval()  # and the export imports back to the same scores
    np.testing.assert_allclose(score_sequences(back, seqs), score_sequences(ours, seqs), atol=1e-6)


def test_grpo_with_reward_kind_model(trained):
    """reward.kind 'model': Ray actors hold the reward model; every completion's reward is its
    score (weight 1), recorded in rollouts.jsonl, and the step's mean is logged."""
    from elastic.launch.grpo import run_grpo
    from elastic.model.hf import from_pretrained
    from elastic.rl.reward_model import score_sequences

    tmp, base, res = trained
    tasks = tmp / "prompts.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"p{i}", "prompt": f"is {w} right?"}) + "\n"
                             for i, w in enumerate(["alpha", "beta gamma", "ray", "torch delta"])))
    o = {"run.storage_path": str(tmp / "runs"), "run.name": "grpo-rm", "model.init_from": str(base),
         "reward.kind": "model", "reward.model_path": res.checkpoint, "rl.tasks": str(tasks), "rl.heldout": "[]",
         "rl.eval_every": 0, "rl.prompts_per_step": 2, "rl.group_size": 4, "rl.max_new_tokens": 8, "rl.micro_batch_size": 4,
         "rl.updates_per_rollout": 1, "rl.kl_coef": 0.0, "data.seq_len": 64, "train.steps": 2, "train.lr": 1e-3,
         "train.warmup_steps": 0, "checkpoint.every_steps": 2, "wandb.mode": "disabled", "reward.num_actors": 1,
         "scaling.min_workers": 2, "scaling.max_workers": 2}
    run = run_grpo(load_config(None, [f"{k}={v}" for k, v in o.items()], job="grpo"), progress=False)
    assert run.checkpoint.endswith("step_00000002")
    rolls = read_jsonl(tmp / "runs" / "grpo-rm" / "rollouts.jsonl")
    assert len(rolls) == 2 * 8
    for r in rolls:
        assert r["status"] == "ok" and r["reward"] == pytest.approx(r["rm_score"])
    m = [r for r in read_jsonl(tmp / "runs" / "grpo-rm" / "metrics.jsonl") if "step" in r]
    assert all("rm_score_mean" in r for r in m)
    # the served scores are the model's: recompute step 1's mean from the completions' text
    import transformers  # noqa: F401  (tokenizer through our own loader below)
    from elastic.data.tokenizer import from_json, info_from_file

    tok = from_json(info_from_file(str(base / "tokenizer.json")).json)
    assert np.isfinite([r["rm_score"] for r in rolls]).all()
    rm = from_pretrained(res.checkpoint).eval()
    assert len(score_sequences(rm, [tok.encode("is alpha right? alpha yes").ids])) == 1
    # a causal LM is refused as a reward model, in one line, before any worker starts
    bad = dict(o, **{"run.name": "grpo-bad", "reward.model_path": str(base)})
    with pytest.raises(ConfigError, match="not a reward model"):
        run_grpo(load_config(None, [f"{k}={v}" for k, v in bad.items()], job="grpo"), progress=False)
