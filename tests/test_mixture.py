"""Weighted mixtures of sources: the per-step allocation (hand-computed values), and a real
run over three sources stopped and resumed at another world size, compared with an
uninterrupted one: the same samples in the same steps, and every step's mix exact."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from elastic.config import load_config
from elastic.data import DataError
from elastic.data.cursor import split_sample_id
from elastic.data.mixture import MixCursor, cumulative_counts, exact_weights, step_counts
from elastic.launch.data_plans import plan_job_data
from elastic.launch.pretrain import run_pretraining
from tests.helpers import finish_job, ledger_by_step, make_text_corpus, read_jsonl, small_run_overrides, start_job


def test_exact_weights_are_the_decimal_fractions():
    assert exact_weights([0.7, 0.2, 0.1]) == [Fraction(7, 10), Fraction(1, 5), Fraction(1, 10)]
    assert exact_weights([2, 1, 1]) == [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)]
    with pytest.raises(ValueError, match="positive"):
        exact_weights([1.0, 0.0])


def test_step_counts_by_hand():
    w = exact_weights([0.7, 0.2, 0.1])
    # B = 8: cumulative F = 7/10, 9/10, 1. n=8: floor(5.6)=5, floor(7.2)=7 -> [5, 2, 1]
    assert cumulative_counts(w, 8) == [5, 2, 1]
    # n=16: floor(11.2)=11, floor(14.4)=14 -> [11, 3, 2]; step 1 = [11-5, 3-2, 2-1]
    assert step_counts(w, 8, 0) == [5, 2, 1]
    assert step_counts(w, 8, 1) == [6, 1, 1]
    # n=24: floor(16.8)=16, floor(21.6)=21 -> [16, 5, 3]; step 2 = [5, 2, 1]
    assert step_counts(w, 8, 2) == [5, 2, 1]
    for s in range(200):  # every step sums to the batch; the running total never drifts a sample
        c = step_counts(w, 8, s)
        assert sum(c) == 8 and min(c) >= 0
        n = (s + 1) * 8
        assert all(abs(a - n * float(x)) < 1 for a, x in zip(cumulative_counts(w, n), w))


def test_mix_cursor_round_trip_and_mismatch():
    c = MixCursor.start(3)
    assert MixCursor.from_dict(c.to_dict(), 3) == c
    with pytest.raises(ValueError, match="data.mixture changed"):
        MixCursor.from_dict(c.to_dict(), 2)


STEPS, STOP = 6, 3
WEIGHTS = (0.5, 0.3, 0.2)


def _mixture_overrides(store, name, corpora, **extra):
    # three sources + the held-out plan: one packer each, half a CPU apiece on the 4-CPU test cluster
    o = small_run_overrides(store, name, corpora[0], STEPS, **{"checkpoint.every_steps": 1, "data.tokenize_cpus": 0.5, **extra})
    o = [x for x in o if not x.startswith("data.source=")]
    mix = "{" + ", ".join(f'"{c}": {w}' for c, w in zip(corpora, WEIGHTS)) + "}"
    return o + [f"data.mixture={mix}"]




def test_mixture_run_resumes_exactly_at_another_world_size(ray_local, tmp_path):
    corpora = [make_text_corpus(tmp_path / f"src{k}", n_docs=30 + 10 * k, seed=k) for k in range(3)]
    store = tmp_path / "runs"
    cfg = load_config(None, _mixture_overrides(store, "plan", corpora))
    plans = plan_job_data(cfg, str(tmp_path / "plan"), "pretrain").train
    # which source each shard id belongs to (ids are offset per source)
    owner = {s.shard_id: k for k, p in enumerate(plans.plans) for s in p.shards}
    assert len(owner) == sum(p.num_shards for p in plans.plans)  # no id shared by two sources

    # Run b's first part (stopped at STOP, 2 workers) goes beside the uninterrupted run a: through
    # jobs/pretrain.py in a process of its own with a private Ray instance.
    b_log = tmp_path / "b-first.log"
    b_first = start_job("pretrain.py", _mixture_overrides(store, "b", corpora, **{"train.until_step": STOP}), b_log)
    try:
        run_pretraining(load_config(None, _mixture_overrides(store, "a", corpora)), progress=False)
    finally:
        finish_job(b_first, b_log)
    b = run_pretraining(load_config(None, _mixture_overrides(store, "b", corpora, **{
        "scaling.min_workers": 1, "scaling.max_workers": 1})), progress=False)  # resumed on one worker
    assert b.summary["last_step"] == STEPS

    la, lb = ledger_by_step(store / "a" / "ledger.jsonl"), ledger_by_step(store / "b" / "ledger.jsonl")
    assert sorted(la) == list(range(1, STEPS + 1))
    for s in la:  # the same samples in every step (rank split differs: 2 workers, then 1)
        assert sorted(la[s]) == sorted(lb[s]), s
        got = np.bincount([owner[split_sample_id(i)[0]] for i in la[s]], minlength=3).tolist()
        assert got == step_counts(exact_weights(WEIGHTS), 8, s - 1), (s, got)
    ma = {r["step"]: r["loss"] for r in read_jsonl(store / "a" / "metrics.jsonl")}
    mb = {r["step"]: r["loss"] for r in read_jsonl(store / "b" / "metrics.jsonl")}
    np.testing.assert_allclose([mb[s] for s in range(1, STEPS + 1)], [ma[s] for s in range(1, STEPS + 1)], rtol=1e-5)


def test_a_mixture_of_one_source_is_one_line(tmp_path):
    c = make_text_corpus(tmp_path / "c")
    cfg = load_config(None, [f'data.mixture={{"{c}": 1.0}}'])
    with pytest.raises(DataError, match="at least two sources"):
        plan_job_data(cfg, str(tmp_path / "run"), "pretrain")
