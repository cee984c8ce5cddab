"""The driver's live progress follows a run's records as another process appends them: a bar
redrawn in place on a terminal, plain periodic lines otherwise, worker-group events as lines
of their own, extra fields when a job writes them, and nothing of a resumed run's history."""

import io
import threading
import time

from elastic.launch.runtime.progress import Progress, bar, fmt_duration, lines
from elastic.records import EVENTS, METRICS, append_record


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _rec(step: int, t: float, **extra) -> dict:
    return {"step": step, "loss": 6.0 - 0.01 * step, "tokens": 2000, "tokens_per_s": 4000.0, "mfu": 0.25, "step_s": 0.5,
            "world_size": 2, "time": t, **extra}


def _writer(d, steps, t0=1000.0, dt=0.5, pause=0.01, **extra):
    """Rank 0's side, in another thread: a start event, then one record per step."""
    def run():
        append_record(str(d / EVENTS), {"event": "start", "time": t0, "world_size": 2, "step": 0, "resumed_from": None,
                                        "attention_backend": "sdpa_mask", "device": "cpu", "param_dtype": "float32"})
        for s in range(1, steps + 1):
            append_record(str(d / METRICS), _rec(s, t0 + s * dt, **extra))
            time.sleep(pause)
    return threading.Thread(target=run)


def test_plain_lines_at_each_tenth_of_the_run_and_the_last_step(tmp_path):
    out = io.StringIO()
    p = Progress(str(tmp_path), total=100, stream=out, interval_s=3600, poll_s=0.02).start()
    w = _writer(tmp_path, 100)
    w.start()
    w.join()
    p.stop()
    shown = out.getvalue().splitlines()
    assert shown[0] == "[elastic] workers: 2 started at step 0 (attention sdpa_mask, cpu, float32)"
    steps = [int(ln.split()[2].split("/")[0]) for ln in shown if ln.startswith("[elastic] step ")]
    # the first step seen, then one line per tenth (the poll may see a tenth a little late), then 100
    assert 10 <= len(steps) <= 12 and steps[-1] == 100 and len({s // 10 for s in steps}) == len(steps), steps
    assert shown[-1].startswith("[elastic] step 100/100 (100%) loss 5.0000 | 4,000 tok/s | MFU 25.0%")
    assert "\r" not in out.getvalue()


def test_plain_lines_also_every_interval_on_a_long_run(tmp_path):
    out = io.StringIO()
    p = Progress(str(tmp_path), total=10_000, stream=out, interval_s=0, poll_s=0.02).start()
    w = _writer(tmp_path, 5, pause=0.1)
    w.start()
    w.join()
    p.stop()
    assert len([ln for ln in out.getvalue().splitlines() if ln.startswith("[elastic] step ")]) >= 3


def test_terminal_bar_redraws_in_place_with_eta(tmp_path):
    out = Tty()
    p = Progress(str(tmp_path), total=40, stream=out, poll_s=0.02).start()
    w = _writer(tmp_path, 20, pause=0.02)
    w.start()
    w.join()
    end = time.time() + 10
    while "20/40" not in out.getvalue() and time.time() < end:
        time.sleep(0.02)
    live = out.getvalue().split("\r")[-1].replace("\x1b[2K", "")
    # 20 of 40 steps done at 0.5 s of wall time per step: 10 s left
    assert "20/40" in live and "ETA 10s" in live and "2 workers" in live and "█" in live
    p.stop()
    text = out.getvalue()
    assert text.count("\r") > 3 and text.endswith("\n")
    assert lines(text)[0].startswith("[elastic] workers: 2 started")


def test_extra_fields_and_restarts_are_shown(tmp_path):
    out = io.StringIO()
    p = Progress(str(tmp_path), total=3, stream=out, interval_s=0, poll_s=0.02).start()
    w = _writer(tmp_path, 2, reward_mean=0.625)
    w.start()
    w.join()
    end = time.time() + 10
    while "step 2/3" not in out.getvalue() and time.time() < end:  # the follower has shown the first group
        time.sleep(0.02)
    append_record(str(tmp_path / EVENTS), {"event": "failure_decision", "time": 1002.0, "decision": "RETRY"})
    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 1003.0, "world_size": 1, "step": 2,
                                           "resumed_from": "/r/step_00000002", "attention_backend": "sdpa_mask",
                                           "device": "cpu", "param_dtype": "float32"})
    append_record(str(tmp_path / METRICS), _rec(3, 1004.0, world_size=1))
    p.stop()
    text = out.getvalue()
    assert "reward 0.625" in text
    assert "[elastic] worker group failed; Ray Train decided: RETRY" in text
    assert "[elastic] workers: 1 restarted, resuming at step 2" in text
    assert text.splitlines()[-1].startswith("[elastic] step 3/3 (100%)") and "1 workers" in text.splitlines()[-1]


def test_a_resumed_run_does_not_replay_its_history(tmp_path):
    for s in range(1, 6):
        append_record(str(tmp_path / METRICS), _rec(s, 1000.0 + s))
    out = io.StringIO()
    p = Progress(str(tmp_path), total=10, stream=out, interval_s=0, poll_s=0.02).start()
    append_record(str(tmp_path / METRICS), _rec(6, 1006.0))
    p.stop()
    assert [ln.split()[2] for ln in out.getvalue().splitlines()] == ["6/10"]


def test_formatting_helpers():
    assert fmt_duration(59.6) == "1m00s" and fmt_duration(3725) == "1h02m" and fmt_duration(None) == "?"
    assert bar(0.0, 4) == "    " and bar(1.0, 4) == "████" and bar(0.5, 4) == "██  " and len(bar(0.3, 10)) == 10


def test_rate_leaves_out_each_worker_groups_warmup_step_and_uses_a_recent_window(tmp_path):
    """The first H100 run showed 16k tok/s at step 13 while steps ran at 57k: the first step
    (compile) was in the average. Tokens/s and MFU are over the last steady steps only."""
    p = Progress(str(tmp_path), total=100, stream=io.StringIO(), interval_s=3600, poll_s=0.02)
    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 1000.0, "world_size": 1, "step": 0})
    append_record(str(tmp_path / METRICS), _rec(1, 1060.0, step_s=60.0, mfu=0.004, warmup=True))
    p.poll()
    assert p.rate() == (2000 / 60.0, 0.004)  # only the warm-up step so far: its own figures
    for s in range(2, 30):  # slow steps, then fast ones: the window follows the recent pace
        append_record(str(tmp_path / METRICS), _rec(s, 1060.0 + s, step_s=1.0 if s < 20 else 0.05, mfu=0.02 if s < 20 else 0.4))
    p.poll()
    tps, mfu = p.rate()
    assert abs(tps - 2000 / 0.05) < 1e-6 and abs(mfu - 0.4) < 1e-12
    assert "40,000 tok/s | MFU 40.0%" in p.plain_line()
    # A new worker group: its own warm-up is left out again.
    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 1100.0, "world_size": 2, "step": 29})
    append_record(str(tmp_path / METRICS), _rec(30, 1130.0, step_s=30.0, warmup=True))
    append_record(str(tmp_path / METRICS), _rec(31, 1130.5, step_s=0.5, mfu=0.3))
    p.poll()
    assert p.rate() == (2000 / 0.5, 0.3)
    # A step that also evaluated: its evaluation is not training time (the first H200 run showed
    # 3.5k tok/s after an 11 s evaluation while the steps ran at 56k).
    append_record(str(tmp_path / METRICS), _rec(32, 1142.0, step_s=11.5, eval_s=11.0, mfu=0.3 * 0.5 / 11.5))
    p.poll()
    tps, mfu = p.rate()
    assert abs(tps - 4000 / 1.0) < 1e-6 and abs(mfu - 0.3) < 1e-12
    # A model far below the peak still shows a figure, not 0.0%.
    append_record(str(tmp_path / METRICS), _rec(33, 1142.5, step_s=0.5, mfu=0.0007))
    p.rate_window.clear()
    p.poll()
    assert "MFU 0.07%" in p.plain_line()


def _wait_for(out, text, timeout=10.0):
    end = time.time() + timeout
    while text not in out.getvalue() and time.time() < end:
        time.sleep(0.01)
    assert text in out.getvalue(), out.getvalue()


def test_start_up_says_once_what_it_waits_for_when_a_phase_takes_a_while(tmp_path):
    """Until the first step: a phase that lasts `wait_after_s` gets one line (the driver's own
    phases, then those the controller's and workers' events begin), a short one none; after the
    first step nothing more, and no line twice."""
    out = io.StringIO()
    p = Progress(str(tmp_path), total=2, stream=out, interval_s=0, poll_s=0.02, wait_after_s=0.3).start()
    p.waiting_for("the job's plan: its data, tokenizer and inputs")
    p.waiting_for("a private Ray instance to start")  # short: never shown
    _wait_for(out, "[elastic] waiting for: a private Ray instance to start (")
    p.say("[elastic] ray: started a private local instance")
    p.waiting_for("the Ray Train controller")
    _wait_for(out, "waiting for: the Ray Train controller (")
    ev = str(tmp_path / EVENTS)
    append_record(ev, {"event": "controller_state", "time": 1.0, "from": "InitializingState", "to": "SchedulingState"})
    append_record(ev, {"event": "resize_decision", "time": 1.0, "num_workers": 2})
    _wait_for(out, "[elastic] waiting for: Ray Train workers, 2 starting (")
    append_record(ev, {"event": "controller_state", "time": 2.0, "from": "SchedulingState", "to": "RunningState"})
    append_record(ev, {"event": "worker", "time": 3.0, "rank": 1, "world_size": 2})
    _wait_for(out, "[elastic] waiting for: the workers' model and checkpoint, 1 of 2 ready (")
    append_record(ev, {"event": "start", "time": 3.0, "world_size": 2, "step": 0, "resumed_from": None,
                       "attention_backend": "sdpa_mask", "device": "cpu", "param_dtype": "float32"})
    _wait_for(out, "[elastic] waiting for: the first step (")
    append_record(str(tmp_path / METRICS), _rec(1, 1001.0))
    _wait_for(out, "step 1/2")
    p.waiting_for("the Ray Train controller again")  # after the first step: not start-up any more
    append_record(ev, {"event": "resize_decision", "time": 5.0, "num_workers": 1})
    time.sleep(0.5)
    p.stop()
    shown = out.getvalue().splitlines()
    waits = [ln for ln in shown if ln.startswith("[elastic] waiting for: ")]
    assert [w.split(": ", 1)[1].rsplit(" (", 1)[0] for w in waits] == [
        "a private Ray instance to start", "the Ray Train controller", "Ray Train workers, 2 starting",
        "the workers' model and checkpoint, 1 of 2 ready", "the first step"], shown
    assert all(w.endswith(" s)") for w in waits)
    assert shown.index("[elastic] ray: started a private local instance") == 1
    assert len(set(shown)) == len(shown) and "\r" not in out.getvalue()


def test_start_up_wait_on_a_terminal_is_one_line_redrawn_and_cleared_at_the_first_step(tmp_path):
    out = Tty()
    p = Progress(str(tmp_path), total=2, stream=out, poll_s=0.02, wait_after_s=0.1).start()
    p.waiting_for("a private Ray instance to start")
    _wait_for(out, "waiting for: a private Ray instance to start (")
    p.say("[elastic] ray: started")  # above the waiting line, which stays
    time.sleep(0.2)
    assert lines(out.getvalue())[0] == "[elastic] ray: started"
    assert lines(out.getvalue())[-1].startswith("[elastic] waiting for: a private Ray instance to start (")
    append_record(str(tmp_path / EVENTS), {"event": "start", "time": 3.0, "world_size": 2, "step": 0})
    append_record(str(tmp_path / METRICS), _rec(1, 1001.0))
    _wait_for(out, "1/2")
    p.stop()
    final = lines(out.getvalue())
    assert not any("waiting for" in ln for ln in final), final
    assert final[0] == "[elastic] ray: started" and final[-2].startswith("[elastic] ") and "1/2" in final[-2]


def test_layout_lines_name_a_chosen_layout_and_a_left_out_worker(tmp_path):
    p = Progress(str(tmp_path), total=10, stream=io.StringIO(), interval_s=3600)
    line = p.event_line({"event": "start", "world_size": 4, "step": 0, "attention_backend": "sdpa_docs", "device": "cpu",
                         "param_dtype": "float32", "mesh": "FSDP 2 shards x TP 2"})
    assert line.endswith("(attention sdpa_docs, cpu, float32, FSDP 2 shards x TP 2)")
    plain = p.event_line({"event": "start", "world_size": 2, "step": 3, "resumed_from": "x", "attention_backend": "sdpa_docs",
                          "device": "cpu", "param_dtype": "float32", "mesh": "FSDP 2 shards"})
    assert "FSDP" not in plain  # the default layout is not worth a word
    wait = p.event_line({"event": "layout_wait", "possible": 5, "used": 4, "unit": 2})
    assert wait == "[elastic] workers: 5 could run, 4 will: elastic sizes are whole groups of 2 (parallel.pp x parallel.tp; the rest wait for a full group)"
