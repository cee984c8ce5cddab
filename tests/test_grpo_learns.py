"""GRPO learns: a few real steps raise held-out pass@1 (issue 57), not a smoke test that only runs.

A trivially learnable family: "Greet Kavo." -> "Hello!", whatever the name. The starting policy
is SFT on rows whose answer is "Hello!" for half the names and "Goodbye!" for the other half, so
on names it has never seen it says either, about evenly: held-out pass@1 (exact match) starts
near 0.5 with room to climb, and every group of 8 carries signal. GRPO (exact_match reward on
the CPU pool, 2 FSDP workers) must lift the held-out share by more than 3 standard errors in a
few steps: what it has to learn is that the name does not matter. Held-out names are never train
names. Fixed seeds: the run is the same every time.
"""

from __future__ import annotations

import json
import random

from elastic.config import load_config
from elastic.launch.grpo import run_grpo
from elastic.launch.pretrain import run_pretraining
from tests.helpers import read_jsonl

MODEL = {"model.dim": 64, "model.n_layers": 2, "model.n_heads": 4, "model.n_kv_heads": 2, "model.ffn_hidden": 192}


def _ov(d):
    return [f"{k}={v}" for k, v in d.items()]


def names():
    rng = random.Random(57)
    out = sorted({rng.choice("BDGKLMNPRSTV") + rng.choice("aeiou") + rng.choice("bdgklmnprstv") + rng.choice("aeiou")
                  for _ in range(2000)})
    rng.shuffle(out)
    return out[:400], out[400:464]  # train, held-out: disjoint


def test_a_few_grpo_steps_raise_heldout_pass_at_1(ray_local, tmp_path):
    train, held = names()
    assert len(held) == 64 and not set(train) & set(held)
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Greet {n}."},
                                                    {"role": "assistant", "content": "Hello!" if i % 2 else "Goodbye!"}]}) + "\n"
                           for i, n in enumerate(train)))
    tasks, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    for path, rows, tag in ((tasks, train, "t"), (heldout, held, "h")):
        path.write_text("".join(json.dumps({"task_id": f"{tag}{i}", "prompt": f"Greet {n}.", "answer": "Hello!"}) + "\n"
                                for i, n in enumerate(rows)))
    store = tmp_path / "runs"
    o = {"run.storage_path": str(store), "run.name": "sft", "data.source": str(sft), "sft.messages_field": "messages",
         "data.seq_len": 64, "data.vocab_size": 300, "data.shard_mb": 0.002, **MODEL, "train.steps": 150,
         "train.global_batch_size": 8, "train.micro_batch_size": 4, "train.warmup_steps": 5, "train.lr": 0.01,
         "eval.every_steps": 0, "wandb.mode": "disabled", "checkpoint.every_steps": 150,
         "scaling.min_workers": 2, "scaling.max_workers": 2}
    policy = run_pretraining(load_config(None, _ov(o), job="sft"), kind="sft", progress=False).checkpoint
    g = {"run.storage_path": str(store), "run.name": "grpo", "model.init_from": policy, "reward.kind": "exact_match",
         "rl.tasks": str(tasks), "rl.heldout_tasks": str(heldout), "rl.heldout": "[]", "rl.prompts_per_step": 8,
         "rl.group_size": 8, "rl.max_new_tokens": 6, "rl.micro_batch_size": 32, "rl.eval_every": 6,
         "rl.eval_samples": 8, "rl.eval_k": "[1]", "train.steps": 6, "train.lr": 1e-3, "train.warmup_steps": 0,
         "train.min_lr_ratio": 1.0, "checkpoint.every_steps": 6, "wandb.mode": "disabled", "reward.num_actors": 2,
         "scaling.min_workers": 2, "scaling.max_workers": 2}
    res = run_grpo(load_config(None, _ov(g), job="grpo"), progress=False)
    assert res.checkpoint.endswith("step_00000006") and not res.stopped
    m = read_jsonl(store / "grpo" / "metrics.jsonl")
    before = next(r for r in m if "initial_heldout_pass_at_1" in r)
    after = next(r for r in m if r["step"] == 6 and "heldout_pass_at_1" in r)
    p0, se0 = before["initial_heldout_pass_at_1"], before["initial_heldout_se_pass_at_1"]
    p1, se1 = after["heldout_pass_at_1"], after["heldout_se_pass_at_1"]
    assert 0.2 < p0 < 0.8, f"the starting policy should say Hello about half the time, got {p0:.3f}"
    assert p1 - p0 > 3 * (se0 ** 2 + se1 ** 2) ** 0.5, (p0, se0, p1, se1)
