"""The run's JSON-lines records survive a crash: a last line cut short is skipped by every
reader (the run summary, recovery accounting, the live follower), and the next record
written after it is not lost."""

import json
import os
from pathlib import Path

import pytest

from elastic.launch.driver import RunPaths, summarize
from elastic.report.recovery import analyze
from elastic.records import EVENTS, METRICS, append_record, read_new_records, read_records


def _step(i: int, t: float) -> dict:
    return {"step": i, "loss": 5.0 - 0.1 * i, "tokens": 100, "tokens_per_s": 1000.0, "mfu": 0.1, "step_s": 0.1,
            "world_size": 2, "time": t, "bad_rows": 0}


def _cut(path, record: dict) -> None:
    """Append the first half of a record's line, as a crash mid-write leaves it."""
    line = json.dumps(record) + "\n"
    with open(path, "a") as f:
        f.write(line[: len(line) // 2])


def test_summary_reads_a_metrics_file_whose_last_line_is_cut(tmp_path):
    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 100.0, "world_size": 2, "step": 0})
    for i in range(1, 4):
        append_record(str(tmp_path / METRICS), _step(i, 100.0 + i))
    _cut(tmp_path / METRICS, _step(4, 104.0))
    _cut(tmp_path / EVENTS, {"event": "worker", "time": 104.5, "rank": 1})
    s = summarize(RunPaths(str(tmp_path), str(tmp_path), str(tmp_path)), job_s=5.0, checkpoint=None)
    assert s["steps_logged"] == 3 and s["last_step"] == 3
    assert s["first_loss"] == _step(1, 0)["loss"] and s["last_loss"] == _step(3, 0)["loss"]
    assert json.loads((tmp_path / "summary.json").read_text())["steps_logged"] == 3
    assert analyze(str(tmp_path))["steps_completed"] == 3


def test_a_record_appended_after_a_cut_line_is_kept(tmp_path):
    path = str(tmp_path / METRICS)
    append_record(path, _step(1, 1.0))
    _cut(path, _step(2, 2.0))
    append_record(path, _step(2, 3.0))  # the relaunched run redoes step 2
    assert [(r["step"], r["time"]) for r in read_records(path)] == [(1, 1.0), (2, 3.0)]


def test_following_a_live_file_waits_for_complete_lines(tmp_path):
    path = str(tmp_path / METRICS)
    recs, off = read_new_records(path, 0)
    assert recs == [] and off == 0  # not there yet
    append_record(path, _step(1, 1.0))
    line = json.dumps(_step(2, 2.0)) + "\n"
    with open(path, "a") as f:
        f.write(line[:10])  # being written
    recs, off = read_new_records(path, 0)
    assert [r["step"] for r in recs] == [1]
    with open(path, "a") as f:
        f.write(line[10:])
    recs, off2 = read_new_records(path, off)
    assert [r["step"] for r in recs] == [2] and off2 == os.path.getsize(path)
    assert read_new_records(path, off2) == ([], off2)


def test_one_definition_per_figure_in_summary_report_and_console(tmp_path):
    """tokens/s, MFU, job time and training time: the closing console line, summary.json and
    report.md show the same figure under the same name (issue: the console said 5455 tokens/s and
    'done in 157s', the report 5,948 tokens/s 'mean' and 'wall time 80 s')."""
    from elastic.launch.driver import JobResult
    from elastic.report import build_report

    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 100.0, "world_size": 2, "step": 0})
    t = 100.0
    # Unequal steps: over the steady steps 2..4 the mean of per-step rates (1000, 1000, 250 tok/s) is
    # 750, while Σ tokens / Σ step time is 300 / 0.6 = 500.
    for i, (tokens, step_s, mfu) in enumerate([(100, 0.1, 0.2), (100, 0.1, 0.2), (100, 0.1, 0.2), (100, 0.4, 0.05)], 1):
        t += step_s
        append_record(str(tmp_path / METRICS), dict(_step(i, t), tokens=tokens, step_s=step_s, mfu=mfu,
                                                  tokens_per_s=tokens / step_s))
    paths = RunPaths(str(tmp_path), str(tmp_path), str(tmp_path))
    path, run, _ = build_report(str(tmp_path), job_s=30.0)
    s = summarize(paths, job_s=30.0, checkpoint=None)
    # MFU weighted by step time: (0.2×0.1 + 0.2×0.1 + 0.05×0.4) / 0.6 = 0.1 (the plain mean would be 0.15)
    assert s["tokens_per_s"] == pytest.approx(500.0) and s["mfu"] == pytest.approx(0.1) and s["steady_steps"] == 3
    assert s["job_s"] == 30.0 and s["training_s"] == round(t - 100.0, 1) == 0.7 and "wall_s" not in s
    md = open(path).read()
    assert "500 tokens/s over 3 steady steps (Σ tokens / Σ step time)" in md
    assert "% (step-time-weighted over the steady steps)" in md and "| MFU | 10" in md
    assert "| job time | 30 s " in md and "| training time | 1 s " in md
    line = JobResult(str(tmp_path), str(tmp_path), 30.0, None, s).done()
    assert line == "[elastic] done in 30s job time (1s training)"
    # A report rendered later from the directory alone takes the job time from the summary.
    assert load_run_job_s(tmp_path) == 30.0


def test_start_up_figures_count_from_the_command_to_its_first_step(tmp_path):
    """summary.json `startup_s` / `first_step_s`: from the command's start to the beginning / end
    of the first step written after it (a resumed run's earlier steps are not it), and the same
    figures in the closing line."""
    from elastic.launch.driver import JobResult

    append_record(str(tmp_path / METRICS), dict(_step(1, 50.0), step_s=1.0))  # an earlier invocation's
    append_record(str(tmp_path / METRICS), dict(_step(2, 112.0), step_s=2.5))
    append_record(str(tmp_path / METRICS), dict(_step(3, 113.0), step_s=1.0))
    paths = RunPaths(str(tmp_path), str(tmp_path), str(tmp_path))
    s = summarize(paths, job_s=14.0, checkpoint=None, command_start=100.0)
    assert (s["startup_s"], s["first_step_s"]) == (9.5, 12.0)
    assert json.loads((tmp_path / "summary.json").read_text())["first_step_s"] == 12.0
    line = JobResult(str(tmp_path), str(tmp_path), 14.0, None, s).done()
    assert line.startswith("[elastic] done in 14s job time (") and line.endswith("start-up 9.5s, first step done at 12.0s)")
    # No step since the command started (a finished run relaunched): no figures.
    assert "startup_s" not in summarize(paths, job_s=1.0, checkpoint=None, command_start=200.0)


def test_the_command_start_is_the_process_start(tmp_path):
    """Measured from /proc, so Python's start-up and imports count; the first job of a command
    takes it, a job after it (chained in the same command) its own start."""
    import subprocess
    import sys
    import time

    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); time.sleep(0.5)\n"
            "from elastic.launch.runtime import startup\n"
            "startup.command_started(); a = startup.take_command_start(-1.0); b = startup.take_command_start(-1.0)\n"
            "print(a, b, time.time())")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parents[1])], capture_output=True,
                         text=True, check=True).stdout.split()
    start, chained, now = float(out[0]), float(out[1]), float(out[2])
    assert before - 0.1 <= start <= before + 0.4 < now, (before, start, now)
    assert chained == -1.0


def load_run_job_s(d) -> float:
    from elastic.report import load_run

    return load_run(str(d)).job_s
