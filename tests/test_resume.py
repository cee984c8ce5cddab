"""Resume: a run stopped after N steps and relaunched continues exactly where it stopped.

The interrupted run's steps N+1.. must match an uninterrupted run of the same config: same
step counter, same LR, same global sample ids, and the same loss (fp32 on CPU with the same
reduction order on both sides, so we allow only 1e-6 relative for float noise).
"""

import numpy as np

from elastic.config import load_config
from elastic.launch.pretrain import run_pretraining
from tests.helpers import ledger_by_step, read_jsonl, small_run_overrides

STEPS, STOP = 6, 3




def test_stop_and_resume_matches_uninterrupted_run(small_run_6, tmp_path):
    corpus, a = small_run_6  # the uninterrupted run (tests/conftest.py), STEPS steps
    store = tmp_path / "runs"
    b1 = run_pretraining(load_config(None, small_run_overrides(store, "b", corpus, STEPS, **{"train.until_step": STOP})))
    assert b1.summary["last_step"] == STOP and b1.checkpoint.endswith("step_00000003")
    b2 = run_pretraining(load_config(None, small_run_overrides(store, "b", corpus, STEPS)))
    assert b2.checkpoint.endswith(f"step_{STEPS:08d}")

    ma, mb = read_jsonl(a / "metrics.jsonl"), read_jsonl(store / "b" / "metrics.jsonl")
    assert [r["step"] for r in mb] == list(range(1, STEPS + 1))  # counter continues, nothing redone
    events = read_jsonl(store / "b" / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "start"] == [0, STOP]
    np.testing.assert_allclose([r["lr"] for r in mb], [r["lr"] for r in ma], rtol=1e-12)
    np.testing.assert_allclose([r["loss"] for r in mb], [r["loss"] for r in ma], rtol=1e-6)
    assert ma[-1]["loss"] < ma[0]["loss"]
    la, lb = ledger_by_step(a / "ledger.jsonl"), ledger_by_step(store / "b" / "ledger.jsonl")
    assert lb == la  # the same samples, in the same steps, on the same ranks
    ids = [i for s in sorted(la) for i in la[s]]
    assert len(ids) == len(set(ids)) == STEPS * 8
