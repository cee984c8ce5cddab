"""The step-time breakdown, the stability guard and on-demand profiling, through the real job.

One small 2-worker run with a NaN injected into the loss of one step, a profiler trace of two
steps and communication sampled every other step; a run made input-bound on purpose; both on
the session's cluster, the faults set in the driver's environment (elastic/launch/driver.py
fault_env carries them to the train workers and the store's tasks). Then a run whose loss is
NaN for several consecutive steps, launched as a user runs it (jobs/pretrain.py), which must
stop cleanly on its own with its last good checkpoint intact, one line and exit code 5.
"""

import io
import json
import os
import subprocess
import sys

from tests.helpers import make_text_corpus, read_jsonl, small_run_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(overrides, env_extra, timeout=600):
    args = [sys.executable, os.path.join(REPO, "jobs", "pretrain.py")]
    for o in overrides:
        args += ["--set", o]
    env = {**os.environ, "RAY_ADDRESS": "local", **env_extra}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def _run_here(overrides, monkeypatch, faults):
    """The run in this process, on the session's cluster, with `faults` in the driver's
    environment; returns its console."""
    from elastic.config import load_config
    from elastic.launch.pretrain import run_pretraining

    for k, v in faults.items():
        monkeypatch.setenv(k, v)
    out = io.StringIO()
    run_pretraining(load_config(None, overrides), out=out, progress=False)
    return out.getvalue()


def test_breakdown_guard_and_profile(ray_local, tmp_path, monkeypatch):
    corpus = make_text_corpus(tmp_path / "corpus")
    store = tmp_path / "runs"
    ov = small_run_overrides(store, "bd", corpus, 8, **{"train.comm_sample_every": 2, "train.profile_steps": "5:6"})
    _run_here(ov, monkeypatch, {"ELASTIC_FAULT_NAN_STEPS": "3"})
    run = store / "bd"
    recs = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 9))
    for r in recs:
        for k in ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "step_s", "slowest_rank_step_s", "peak_rss_gib"):
            assert k in r, (k, r)
        parts = r["data_wait_s"] + r["forward_s"] + r["backward_s"] + r["optimizer_s"] + r["sync_s"] + r.get("checkpoint_s", 0.0) + r.get("eval_s", 0.0) + r.get("profile_s", 0.0)
        # The parts cover the step: what is left is bookkeeping (metrics, ledger lines).
        assert 0.9 * r["step_s"] <= parts <= r["step_s"] * 1.0001, r
        assert r["slowest_rank_step_s"] > 0 and r["peak_rss_gib"] > 0
    # Saves on even steps (async: the stall is the copy to host and waiting for the previous
    # save); `checkpoint_s` is every second a step was blocked by checkpointing, so it may also
    # be on the step that registered a save written in the background.
    assert all("checkpoint_stall_s" in r and r["checkpoint_s"] >= r["checkpoint_stall_s"] for r in recs if r["step"] % 2 == 0)
    assert not any("checkpoint_stall_s" in r for r in recs if r["step"] % 2 == 1)
    done = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "checkpoint_done"]
    assert [e["step"] for e in done] == [2, 4, 6, 8] and all(e["async"] and e["write_s"] > 0 for e in done)
    # Exposed communication is measured on sampled steps (2, 4, 8; 5-6 are traced instead).
    sampled = {r["step"]: r["comm_s"] for r in recs if "comm_s" in r}
    assert set(sampled) == {2, 4, 8}, sampled
    assert all(0 < v < recs[s - 1]["step_s"] for s, v in sampled.items())
    # The NaN step was skipped, counted, and training went on with finite losses.
    bad = [r for r in recs if r.get("skipped")]
    assert [r["step"] for r in bad] == [3] and bad[0]["bad_steps"] == 1
    assert all(r["loss"] == r["loss"] for r in recs if r["step"] != 3)
    events = read_jsonl(run / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "bad_step"] == [3]
    # Train workers run at the driver's niceness, not at Ray's worker default of 15
    # (elastic/launch/driver.py TRAIN_WORKER_ENV), with the configured thread count.
    start = [e for e in events if e["event"] == "start"][0]
    assert start["nice"] == os.nice(0) and start["torch_threads"] == 1, start
    state = json.loads((run / "step_00000008" / "train_state.json").read_text())
    assert state["counters"]["skipped_steps"] == 1
    # The trace of steps 5..6 is a Chrome trace JSON with events in it.
    trace = run / "profile" / "trace_rank0_steps_5-6.json"
    assert trace.exists()
    assert len(json.loads(trace.read_text())["traceEvents"]) > 100


def test_consecutive_nans_stop_the_run_with_its_checkpoint_intact(tmp_path):
    corpus = make_text_corpus(tmp_path / "corpus")
    store = tmp_path / "runs"
    # train.micro_batch_size 16 > each worker's share of the batch of 8 (issue 58: was a config
    # error): an upper bound, fitted to 4 and said once.
    ov = small_run_overrides(store, "nan", corpus, 12, **{"train.max_bad_steps": 3, "train.micro_batch_size": 16})
    p = _run(ov, {"ELASTIC_FAULT_NAN_STEPS": "5-12"})
    assert p.returncode == 5, p.stdout[-3000:] + p.stderr[-3000:]
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if "train.micro_batch_size=16 is an upper bound" in ln]
    assert len(said) == 1 and "4 rows per micro-batch" in said[0], said
    lines = [ln for ln in p.stderr.splitlines() if "stopped at its own request" in ln]
    assert len(lines) == 1 and "3 consecutive bad steps" in lines[0] and "train.max_bad_steps=3" in lines[0]
    run = store / "nan"
    # Steps 5, 6, 7 were bad: the run stopped after step 7; no checkpoint past step 4.
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    ckpts = sorted(d.name for d in run.iterdir() if d.name.startswith("step_"))
    assert ckpts == ["step_00000002", "step_00000004"]
    st = json.loads((run / "step_00000004" / "train_state.json").read_text())
    assert st["step"] == 4 and st["counters"]["skipped_steps"] == 0
    stops = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "stop"]
    assert len(stops) == 1 and stops[0]["step"] == 7
    starts = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert starts[0]["micro_batches"] == {"train.micro_batch_size": 4}


def test_an_input_bound_run_is_named_input(ray_local, tmp_path, monkeypatch):
    """A real run made input-bound on purpose (every batch arrives 1 s late, as from a slow
    filesystem): the report names the input pipeline, with the data-wait share as evidence."""
    corpus = make_text_corpus(tmp_path / "corpus")
    store = tmp_path / "runs"
    console = _run_here(small_run_overrides(store, "slow", corpus, 6), monkeypatch, {"ELASTIC_FAULT_DATA_DELAY_S": "1.0"})
    recs = read_jsonl(store / "slow" / "metrics.jsonl")
    assert all(r["data_wait_s"] > 0.3 * r["step_s"] for r in recs[1:]), [(r["data_wait_s"], r["step_s"]) for r in recs]
    verdict = json.loads((store / "slow" / "bottleneck.json").read_text())
    assert verdict["name"] == "input", verdict
    assert "[elastic] bottleneck: input" in console
