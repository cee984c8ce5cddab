"""The report renders for a finished run, a run in progress, a crashed run and a GRPO run:
report.md states the named bottleneck at its top, and every PNG is a valid image with data
drawn on it. Also the command line, through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from elastic.report import build_report, load_run, write_report
from tests.report_synth import Profile, Sim, write_run

REPO = Path(__file__).resolve().parents[1]


def colored_pixels(path: str) -> int:
    """Pixels with clear colour (data: lines, fills, markers); frames, ticks and text are grey."""
    a = np.asarray(Image.open(path).convert("RGB")).astype(int)
    return int(((a.max(axis=2) - a.min(axis=2)) > 60).sum())


def check_pngs(out_dir: Path, expected: set) -> None:
    pngs = {p.stem: p for p in (out_dir / "plots").glob("*.png")}
    assert set(pngs) == expected
    for name, p in pngs.items():
        with Image.open(p) as im:
            im.verify()  # a valid PNG, not truncated
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 500 and im.size[1] > 300
        assert colored_pixels(str(p)) > 500, f"{name}.png has no data drawn"


def summary_table(md: str) -> dict:
    rows = {}
    for line in md.split("## ")[0].splitlines():
        if line.startswith("| ") and not line.startswith("|  |"):
            k, v = [c.strip() for c in line.strip("|").split(" | ", 1)]
            rows[k] = v
    return rows


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("runs") / "finished"
    write_run(str(d), Sim(steps=1000, restarts=[(305, "resize", 1), (627, "failure", 2)], skipped={400},
                          profile=Profile(data_wait=0.4)), state="finished", name="demo")
    return d


def test_finished_run(finished):
    path = write_report(str(finished))
    assert path == str(finished / "report.md")
    md = Path(path).read_text()
    assert md.startswith("# Run report: demo")
    rows = summary_table(md)
    assert rows["**bottleneck**"].startswith("**input**")  # stated at the top
    assert "data.tokenize_cpus" in rows["lever"]
    assert rows["status"].startswith("finished")
    assert rows["steps"] == "1000 / 1000"
    assert rows["restarts"] == "2 (1 failure, 1 resize)"
    assert rows["world size"] == "1–2"
    assert "nominal on cpu" in rows["MFU"]
    assert rows["checkpoints"] == "50 kept, latest step_00001000"
    # recovery accounting from elastic.report.recovery: steps redone after the non-checkpoint stops
    assert "| 1 | resize | 2 → 1 | 300 | 5 |" in md and "| 2 | failure | 1 → 2 | 620 | 7 |" in md
    for name in ("loss", "throughput", "step_time", "memory", "timeline"):
        assert f"](plots/{name}.png)" in md
    check_pngs(finished, {"loss", "throughput", "step_time", "memory", "timeline"})
    saved = json.loads((finished / "bottleneck.json").read_text())
    assert saved["name"] == "input" and saved["status"]["state"] == "finished"


def test_in_progress_run(tmp_path):
    d = tmp_path / "live"
    sim = Sim(steps=120, total=500, t0=time.time() - 200, profile=Profile(comm_frac=0.5))
    write_run(str(d), sim, state="in_progress")
    # the last metrics line is still being written: skipped, not an error
    assert not (d / "metrics.jsonl").read_text().endswith("\n")
    run = load_run(str(d), now=sim.t0 + 200)
    assert run.status.state == "in progress" and len(run.steps) == 120
    path, run, diag = build_report(str(d), now=sim.t0 + 200)
    rows = summary_table(Path(path).read_text())
    assert rows["status"].startswith("in progress: step 120/500")
    assert rows["steps"] == "120 / 500"
    assert rows["**bottleneck**"].startswith("**communication**")
    check_pngs(d, {"loss", "throughput", "step_time", "memory", "timeline"})
    # the same run an hour later with nothing new is no longer in progress
    assert load_run(str(d), now=sim.t0 + 3600 + 200).status.state == "crashed"


def test_crashed_run(tmp_path):
    d = tmp_path / "crashed"
    write_run(str(d), Sim(steps=230, total=400, device="cuda:0", mfu=0.31, device_mem_gib=80.0, mem_frac=0.93,
                          restarts=[(90, "failure", 2), (150, "failure", 1), (201, "failure", 1)]), state="crashed")
    path = write_report(str(d), out_dir=str(tmp_path / "out"))  # a report elsewhere than the run dir
    md = Path(path).read_text()
    rows = summary_table(md)
    assert rows["status"].startswith("crashed: Ray Train controller errored after step 230/400")
    assert "node was killed" in rows["status"]
    assert rows["**bottleneck**"].startswith("**restarts**")  # time lost beats memory headroom
    assert "- **memory** (93.0%)" in md  # listed as also over threshold
    assert "| 3 | failure | 1 → 1 | 200 | 1 |" in md
    assert "nominal" not in rows["MFU"]  # on CUDA MFU is a real figure
    check_pngs(tmp_path / "out", {"loss", "throughput", "step_time", "memory", "timeline"})
    assert not (d / "report.md").exists()


def test_grpo_run(tmp_path):
    d = tmp_path / "grpo"
    write_run(str(d), Sim(steps=150, grpo=True, eval_every=25, profile=Profile(generate=3.0, reward_wait=1.5)), name="grpo")
    path = write_report(str(d))
    md = Path(path).read_text()
    assert summary_table(md)["**bottleneck**"].startswith("**generation**")
    assert "## GRPO" in md and "| pass rate |" in md and "| held-out pass@1 |" in md and "| KL |" in md
    assert "| generate |" in md and "| reward wait |" in md
    assert "reward_wait" in md.split("## Bottleneck")[1].split("## ")[0]  # also over threshold, listed
    check_pngs(d, {"loss", "throughput", "step_time", "memory", "timeline", "grpo"})


def test_checkpoint_stall_per_save(tmp_path, finished):
    """Asynchronous saves: the summary states the stall per save and the background write, and a
    table lists each save. An older (synchronous) run still reads: its stall is checkpoint_s."""
    d = tmp_path / "async"
    write_run(str(d), Sim(steps=200, every=10, profile=Profile(checkpoint=0.02, checkpoint_wait=0.005, checkpoint_write=4.0)))
    md = Path(write_report(str(d))).read_text()
    row = summary_table(md)["checkpoint stall"]
    assert row.startswith("0.02") and " s per save (max " in row and "over 20 steady saves; write 3.9" in row
    assert row.endswith("s per save in the background (asynchronous)")
    section = md.split("## Checkpoints")[1].split("\n## ")[0]
    assert "The last 10 of 20 saves:" in section
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [int(ln.split("|")[1]) for ln in lines] == list(range(110, 201, 10))
    assert all(ln.rstrip().endswith("| async |") for ln in lines)
    old = summary_table(Path(write_report(str(finished))).read_text())["checkpoint stall"]
    assert old.startswith("0.0") and "steady saves" in old and "asynchronous" not in old


def test_empty_and_half_written_run_dirs(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    md = Path(write_report(str(d))).read_text()
    assert summary_table(md)["**bottleneck**"].startswith("**unknown**")
    assert "not started" in md
    assert list((d / "plots").glob("*.png")) == []
    (d / "config.json").write_text('{"train": {"steps": ')  # cut mid-write
    md = Path(write_report(str(d))).read_text()
    assert "config.json: unreadable" in md


def test_cli(finished, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "elastic.report", str(finished), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "bottleneck: input:" in out.stdout and "data.tokenize_cpus" in out.stdout
    assert (tmp_path / "r" / "report.md").exists()
    bad = subprocess.run([sys.executable, "-m", "elastic.report", str(tmp_path / "nope")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "does not exist" in bad.stderr


def test_stopped_then_relaunched_run(tmp_path):
    """train.until_step stops an invocation (stop event + summary); a relaunch of the same run
    appends to the same records and is in progress again, not 'stopped'."""
    from elastic.records import append_record

    d = tmp_path / "sliced"
    sim = Sim(steps=50, total=100, every=10, t0=time.time() - 300)
    write_run(str(d), sim, state="stopped")
    last = load_run(str(d)).metrics[-1]
    (d / "summary.json").write_text(json.dumps({"last_step": 50, "wall_s": 80.0}))
    now = last["time"] + 30
    run = load_run(str(d), now=now)
    assert (run.status.state, run.status.detail) == ("stopped", "at step 50/100: until_step")
    t = last["time"] + 20
    append_record(str(d / "events.jsonl"), {"event": "start", "time": t, "world_size": 2, "step": 50, "device": "cpu"})
    for s in range(51, 56):
        t += 1.0
        append_record(str(d / "metrics.jsonl"), dict(last, step=s, time=t))
    run = load_run(str(d), now=t + 5)
    assert run.status.state == "in progress" and run.status.detail.startswith("step 55/100")
    assert len(run.steps) == 55


def _loss_wall_time_markers(run_dir: Path, monkeypatch) -> list:
    """x (minutes) of the dashed failure/resize lines on the loss plot's wall-time panel."""
    from elastic.report import plots
    from elastic.report.bottleneck import diagnose

    figs = {}
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: figs.setdefault(name, fig) and name)
    run = load_run(str(run_dir))
    diag = diagnose(run.metrics, run.events, run.recovery, run.config)
    assert plots.plot_loss(run, str(run_dir), diag) == "loss.png"
    wall = figs["loss.png"].axes[1]
    assert wall.get_xlabel() == "wall time (min)"
    return [ln.get_xdata()[0] for ln in wall.lines if ln.get_linestyle() == "--"]


def _with_initial_scheduling(run_dir: Path) -> None:
    """Prepend what Ray Train's controller writes before the first worker group starts: its
    state changes and the initial resize decision (the default run's -0.1 min marker)."""
    ev = run_dir / "events.jsonl"
    first = json.loads(ev.read_text().splitlines()[0])["time"]
    head = [{"time": first - 6.0, "event": "controller_state", "from": "InitializingState", "to": "SchedulingState"},
            {"time": first - 6.0, "event": "resize_decision", "num_workers": 2},
            {"time": first - 1.0, "event": "controller_state", "from": "SchedulingState", "to": "RunningState"}]
    ev.write_text("".join(json.dumps(e) + "\n" for e in head) + ev.read_text())


def test_loss_plot_marks_only_real_failures_and_resizes(tmp_path, monkeypatch):
    from elastic.report.plots import restart_marks

    quiet = tmp_path / "quiet"
    write_run(str(quiet), Sim(steps=60), state="finished")
    _with_initial_scheduling(quiet)
    assert restart_marks(load_run(str(quiet))) == []
    assert _loss_wall_time_markers(quiet, monkeypatch) == []  # no marker at -0.1 min

    eventful = tmp_path / "eventful"
    write_run(str(eventful), Sim(steps=60, restarts=[(30, "failure", 1)]), state="finished")
    _with_initial_scheduling(eventful)
    run = load_run(str(eventful))
    failure = [e["time"] for e in run.events if e.get("event") == "failure_decision"]
    resize = [e["time"] for e in run.events if e.get("event") == "resize_decision"][1:]  # after the initial one
    expected = sorted((t - run.t0) / 60.0 for t in failure + resize)
    assert len(failure) == 1 and len(resize) == 1 and expected[0] > 0
    marks = restart_marks(run)
    assert [k for _, k in marks] == ["failure", "resize"]
    assert [t for t, _ in marks] == pytest.approx(expected)
    assert sorted(_loss_wall_time_markers(eventful, monkeypatch)) == pytest.approx(expected)
