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


# ---- PPO against the reward model: a critic, GAE, KL in the reward; exact resume ----

def _ppo_overrides(tmp, base, rm, name, steps, **extra):
    tasks = tmp / "prompts.jsonl"
    if not tasks.exists():
        tasks.write_text("".join(json.dumps({"task_id": f"p{i}", "prompt": f"is {w} right?"}) + "\n"
                                 for i, w in enumerate(["alpha", "beta gamma", "ray", "torch delta", "gamma", "delta ray"])))
    o = {"run.storage_path": str(tmp / "runs"), "run.name": name, "model.init_from": str(base),
         "reward.kind": "model", "reward.model_path": rm, "rl.algorithm": "ppo", "rl.tasks": str(tasks), "rl.heldout": "[]",
         "rl.eval_every": 0, "rl.prompts_per_step": 4, "rl.group_size": 1, "rl.max_new_tokens": 8, "rl.micro_batch_size": 2,
         "rl.updates_per_rollout": 2, "rl.kl_coef": 0.05, "rl.kl_ctl": "adaptive", "rl.kl_target": 0.5,
         "rl.kl_horizon": 100, "rl.critic_lr": 1e-3, "rl.critic_warmup_steps": 1, "rl.temperature": 1.0,
         "data.seq_len": 64, "train.steps": steps, "train.lr": 1e-3, "train.warmup_steps": 0,
         "checkpoint.every_steps": 1, "wandb.mode": "disabled", "reward.num_actors": 1, "data.ledger": "true",
         "scaling.min_workers": 2, "scaling.max_workers": 2}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


PPO_KEYS = ("reward_mean", "rm_score_mean", "value_loss", "policy_loss", "kl_coef", "returns_mean", "values_mean", "loss")


def _per_step(run):
    last = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        if "step" in r:
            last[r["step"]] = r
    return last


@pytest.fixture(scope="module")
def ppo_ref(trained):
    from elastic.launch.grpo import run_grpo

    tmp, base, res = trained
    run = run_grpo(load_config(None, _ppo_overrides(tmp, base, res.checkpoint, "ppo-a", 4), job="grpo"), progress=False)
    return run


def test_ppo_runs_with_a_critic_and_the_kl_in_the_reward(trained, ppo_ref):
    tmp, base, res = trained
    assert ppo_ref.checkpoint.endswith("step_00000004")
    m = _per_step(tmp / "runs" / "ppo-a")
    assert sorted(m) == [1, 2, 3, 4]
    for s, r in m.items():
        assert r["algorithm"] == "ppo" and math.isfinite(r["value_loss"]) and "explained_variance" in r
        assert r["critic_warmup"] == (s == 1)  # rl.critic_warmup_steps 1: the policy is not trained at step 1
    assert m[1]["kl_coef"] == pytest.approx(0.05)  # the controller's first value; then it adapts
    assert m[4]["kl_coef"] != m[1]["kl_coef"]
    # the checkpoint holds the critic and its optimizer beside the policy, and the controller's state
    from elastic.model.dcp_io import model_tensor_specs  # noqa: F401
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(ppo_ref.checkpoint).read_metadata()
    keys = set(meta.state_dict_metadata)
    assert any(k.startswith("critic.output.weight") for k in keys) and any(k.startswith("critic_optim.") for k in keys)
    state = json.loads(open(f"{ppo_ref.checkpoint}/train_state.json").read())
    assert state["kl_ctl"]["kind"] == "adaptive" and state["kl_ctl"]["value"] == pytest.approx(m[4]["kl_coef"], rel=0.2)


def test_ppo_killed_mid_run_resumes_at_another_world_size_with_the_same_values(trained, ppo_ref, tmp_path):
    """Run B is SIGKILLed (the whole process tree) once checkpoint 2 is registered, then resumed
    with 1 worker instead of 2 and its rollouts generated by a rollout actor (disaggregated,
    max_staleness 0): every step's values equal the uninterrupted colocated run A's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from elastic.launch.grpo import run_grpo
    from tests.conftest import REPO

    tmp, base, res = trained
    name = "ppo-b"
    run = tmp / "runs" / name
    base_cfg = tmp_path / "defaults.yaml"  # the schema's defaults, as run A's load_config(None, ...)
    base_cfg.write_text("{}\n")
    args = [sys.executable, str(REPO / "jobs" / "grpo.py"), "--config", str(base_cfg)]
    for o in _ppo_overrides(tmp, base, res.checkpoint, name, 4):
        args += ["--set", o]
    log = open(tmp_path / "b.log", "w")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_ADDRESS": "local"},
                         start_new_session=True)

    def registered():
        try:
            snap = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
            return (snap.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
        except (OSError, ValueError):
            return None

    t0 = time.time()
    while time.time() < t0 + 600:
        assert p.poll() is None, (tmp_path / "b.log").read_text()[-3000:]
        if registered() in ("step_00000002", "step_00000003"):
            break
        time.sleep(0.3)
    else:
        raise AssertionError("checkpoint 2 never registered\n" + (tmp_path / "b.log").read_text()[-3000:])
    for pid in [p.pid] + [c.pid for c in psutil.Process(p.pid).children(recursive=True)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=60)
    resumed_from = registered()
    # Resumed with 1 worker, and its rollouts now generated by a rollout actor apart from the
    # trainer (rl.rollout.placement disaggregated at rl.max_staleness 0, which must reproduce the
    # colocated run: PPO runs in either placement).
    run_grpo(load_config(None, _ppo_overrides(tmp, base, res.checkpoint, name, 4,
                                              **{"scaling.min_workers": 1, "scaling.max_workers": 1,
                                                 "scaling.cpus_per_worker": 0.5, "rl.rollout.placement": "disaggregated",
                                                 "rl.max_staleness": 0, "rl.rollout.workers": 1,
                                                 "rl.rollout.cpus_per_worker": 0.5}), job="grpo"),
             progress=False)
    starts = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert starts[-1]["world_size"] == 1 and starts[-1]["resumed_from"].endswith(resumed_from)
    a, b = _per_step(tmp / "runs" / "ppo-a"), _per_step(run)
    assert sorted(b) == [1, 2, 3, 4]
    for s in range(1, 5):
        for k in PPO_KEYS:
            assert b[s][k] == pytest.approx(a[s][k], rel=1e-4, abs=1e-6), (s, k, a[s][k], b[s][k])
    ra = {(r["step"], r["k"]): r["completion"] for r in read_jsonl(tmp / "runs" / "ppo-a" / "rollouts.jsonl")}
    rb = {(r["step"], r["k"]): r["completion"] for r in read_jsonl(run / "rollouts.jsonl")}
    assert rb == ra  # the same completions, every step, before and after the resize
    assert [b[s].get("staleness") for s in range(1, 5)][-1] == 0 and "rollout_fleet" in b[4]  # the fleet generated them


def test_rlhf_config_errors_are_one_line():
    for over, msg in ((["rl.algorithm=ppx"], "rl.algorithm: must be grpo|ppo"),
                      (["rl.group_size=1"], "rl.group_size: must be >= 2 for GRPO"),
                      (["rl.algorithm=ppo", "rl.group_size=1", "rl.lam=1.5"], "rl.lam: must be in"),
                      (["rl.algorithm=ppo", "rl.kl_ctl=pid"], "rl.kl_ctl: must be fixed|adaptive"),
                      (["model.num_labels=2"], "model.num_labels"),
                      (["reward.model_actors=0"], "reward.model_actors: must be >= 1")):
        with pytest.raises(ConfigError, match=msg) as e:
            load_config(None, over, job="grpo")
        assert "\n" not in str(e.value)
    cfg = load_config(None, ["rl.algorithm=ppo", "rl.group_size=1", "rl.prompts_per_step=8"], job="grpo")  # PPO needs no group
    assert cfg.rl.group_size == 1


def test_rlhf_command_trains_a_missing_reward_model_first_and_stops_on_a_missing_one_before_work(trained, tmp_path, capsys):
    """README's RLHF line on a fresh clone: jobs/grpo.py with a `model` reward term trains the
    reward model of `reward.model_config` first when its run is not finished (as the SFT policy is
    chained), and a `reward.model_path` that is not there, or no reward model at all, is one line
    naming the command that makes it, before any work (no SFT chain, no run directory)."""
    import yaml

    from jobs.grpo import main as grpo_main
    from jobs.post_training import reward_model_checkpoint

    tmp, base, _ = trained
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("{}\n")

    def args(name, *extra):
        over = [o for o in _ppo_overrides(tmp, base, "", name, 1) if not o.startswith("reward.model_path=")]
        out = ["--config", str(defaults)]
        for o in over + list(extra):
            out += ["--set", o]
        return out

    for extra, msg in (((), "reward.model_path: reward.kind has a 'model' term but neither reward.model_path nor "
                                "reward.model_config is set; train one with: python jobs/reward_model.py"),
                       ((f"reward.model_path={tmp_path / 'nope'}",), f"reward.model_path {tmp_path / 'nope'}: not found; "
                                                                     "make it with: python jobs/reward_model.py"),
                       ((f"reward.model_config={tmp_path / 'none.yaml'}",), "reward.model_config")):
        assert grpo_main(args("ppo-none", *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("config error: " + msg), err
    assert not (tmp / "runs" / "ppo-none").exists()

    rm_cfg = tmp_path / "rm.yaml"
    rm_cfg.write_text(yaml.safe_dump({
        "run": {"name": "rm-chain", "storage_path": str(tmp / "runs")},
        "model": {"init_from": str(base), "num_labels": 1},
        "data": {"source": str(tmp / "train.jsonl"), "seq_len": 64},
        "eval": {"source": str(tmp / "held.jsonl"), "every_steps": 2, "samples": 16},
        "train": {"steps": 2, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3, "warmup_steps": 0},
        "checkpoint": {"every_steps": 2}, "wandb": {"mode": "disabled"},
        "scaling": {"min_workers": 2, "max_workers": 2}}))
    assert grpo_main(args("ppo-chain", f"reward.model_config={rm_cfg}")) == 0
    out = capsys.readouterr().out
    made = str(tmp / "runs" / "rm-chain" / "step_00000002")
    assert f"no finished reward model at {tmp / 'runs' / 'rm-chain'}: running jobs/reward_model.py" in out
    assert f"[elastic] reward model: {made}" in out
    steps = _per_step(tmp / "runs" / "ppo-chain")
    assert sorted(steps) == [1] and "rm_score_mean" in steps[1]
    # A finished reward-model run is used as it is, not trained again.
    assert reward_model_checkpoint([], str(rm_cfg)) == made
    assert "no finished reward model" not in capsys.readouterr().out
