"""DPO end to end on a local Ray cluster with 2 FSDP workers (a small Hugging Face Llama as the
starting policy, preference rows in JSONL):

- the first step's loss is log 2 (policy = reference) and the training margin grows;
- a run stopped at step 3 and resumed at world size 1 trains on the same pairs per step with
  the same losses as the uninterrupted 2-worker run (pair cursor, reshardable checkpoints);
- `dpo.reference: precomputed` (Ray Data, stored with the run) gives the same losses as the
  frozen sharded reference model, and a relaunch reuses the stored table;
- malformed rows are counted and reported before training.
"""

import json

import numpy as np
import pytest

from elastic.config import load_config
from elastic.launch.dpo import run_dpo
from tests.helpers import finish_job, ledger_by_step, read_jsonl, start_job

WORDS = ["alpha", "beta", "gamma", "delta", "elastic", "ray", "torch", "shard"]


def preference_rows(n=24, seed=0):
    """The chosen answer is a `def f(x)` program, the rejected one a word list: a preference a small
    model can pick up."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        w = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 5))))
        rows.append({"prompt": f"{w} {i}", "chosen": f"def f(x):\n    return x + {i % 7}\n",
                     "rejected": " ".join(rng.choice(WORDS, size=int(rng.integers(3, 7))))})
    return rows


def write_rows(path, rows, bad=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([json.dumps(r) for r in rows] + list(bad)) + "\n")
    return path


def dpo_overrides(store, name, base, data, steps=6, **extra):
    o = {"run.storage_path": str(store), "run.name": name, "model.init_from": str(base), "data.source": str(data),
         "data.seq_len": 64, "data.ledger": "true", "train.steps": steps, "train.global_batch_size": 4,
         "train.micro_batch_size": 2, "train.lr": 2e-3, "train.warmup_steps": 0, "train.weight_decay": 0.0,
         "train.log_every": 1, "checkpoint.every_steps": 3, "eval.every_steps": 3, "eval.fraction": 0.2,
         "dpo.beta": 0.5, "wandb.mode": "disabled", "scaling.min_workers": 2, "scaling.max_workers": 2}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    from tests.hf_helpers import make_hf_dir

    d = tmp_path_factory.mktemp("dpo-base") / "llama"
    make_hf_dir(d, "llama")
    return d


def test_dpo_trains_resumes_exactly_at_another_world_size_and_precomputes(ray_local, tmp_path, hf_base):
    store = tmp_path / "runs"
    data = write_rows(tmp_path / "prefs" / "pairs.jsonl", preference_rows(), bad=["{broken", json.dumps({"prompt": "x"})])
    cfg_a = load_config(None, dpo_overrides(store, "a", hf_base, data), job="dpo")
    # Run b's first part (stopped at 3 on 2 workers) trains beside run a: through jobs/dpo.py in a
    # process of its own with a private Ray instance.
    b_log = tmp_path / "b-first.log"
    b_first = start_job("dpo.py", dpo_overrides(store, "b", hf_base, data, **{"train.until_step": 3}), b_log)
    try:
        res = run_dpo(cfg_a, progress=False)
    finally:
        finish_job(b_first, b_log)
    ma = read_jsonl(store / "a" / "metrics.jsonl")
    assert [r["step"] for r in ma] == list(range(1, 7)) and res.checkpoint.endswith("step_00000006")
    assert ma[0]["loss"] == pytest.approx(np.log(2), abs=1e-5)  # the policy starts as the reference
    assert ma[0]["reward_margin"] == pytest.approx(0.0, abs=1e-5) and ma[-1]["reward_margin"] > 0.05
    assert ma[-1]["loss"] < ma[0]["loss"] and ma[-1]["bad_rows"] == 2
    evals = [r for r in ma if "heldout_accuracy" in r]
    assert [r["step"] for r in evals] == [3, 6] and evals[0]["heldout_pairs"] == 5  # 20% of the 24 good rows
    assert {"rewards_chosen", "rewards_rejected", "reward_accuracy", "logps_chosen", "reference_s"} <= set(ma[-1])

    # Stopped at 3 on 2 workers (above), resumed on 1: the same pairs per step, the same losses.
    # Beside the resume, run c's first part (below) trains in a process of its own.
    o = dpo_overrides(store, "c", hf_base, data, **{"dpo.reference": "precomputed", "train.until_step": 3})
    c_log = tmp_path / "c-first.log"
    c_first = start_job("dpo.py", o, c_log)
    try:
        run_dpo(load_config(None, dpo_overrides(store, "b", hf_base, data, **{"scaling.min_workers": 1, "scaling.max_workers": 1}),
                            job="dpo"), progress=False)
    finally:
        finish_job(c_first, c_log)
    mb = read_jsonl(store / "b" / "metrics.jsonl")
    assert [r["step"] for r in mb] == list(range(1, 7)) and [r["world_size"] for r in mb] == [2, 2, 2, 1, 1, 1]
    np.testing.assert_allclose([r["loss"] for r in mb], [r["loss"] for r in ma], rtol=1e-5)
    np.testing.assert_allclose([r["reward_margin"] for r in mb], [r["reward_margin"] for r in ma], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([r["heldout_loss"] for r in mb if "heldout_loss" in r], [r["heldout_loss"] for r in evals], rtol=1e-5)
    assert ledger_by_step(store / "a" / "ledger.jsonl") == ledger_by_step(store / "b" / "ledger.jsonl")

    # Reference log-probs precomputed with Ray Data: the same training; the table is stored and reused.
    # (the same 6-step schedule as run a, stopped after step 3: run c's first part, above)
    mc = read_jsonl(store / "c" / "metrics.jsonl")
    np.testing.assert_allclose([r["loss"] for r in mc], [r["loss"] for r in ma[:3]], rtol=1e-5)
    np.testing.assert_allclose(mc[-1]["heldout_loss"], evals[0]["heldout_loss"], rtol=1e-5)
    table = store / "c" / "dpo" / "reference_logps.parquet"
    assert table.is_file() and mc[0]["reference_from"] == "precomputed"
    before = table.stat().st_mtime_ns
    import io

    out = io.StringIO()
    run_dpo(load_config(None, o[:-1] + ["dpo.reference=precomputed", "train.steps=4", "checkpoint.every_steps=1"],
                        job="dpo"), out=out, progress=False)
    assert "reusing" in out.getvalue() and table.stat().st_mtime_ns == before
