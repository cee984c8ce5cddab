"""The driver's live progress: one line (step/total, loss, tokens/s, MFU, ETA) followed from the
run's own records while `trainer.fit()` blocks.

Why from the records: rank 0 appends one line per step to `metrics.jsonl` and the workers and
the controller append worker-group starts, failures and restarts to `events.jsonl`. Tailing
those files (with the shared tolerant reader in elastic/records.py) needs no extra channel
from the workers, works for every job that writes the same records (pretraining, SFT, GRPO),
and lets worker stdout stay in the Ray logs.

On a terminal the line is a progress bar redrawn in place; otherwise (a log file, `ray job
submit`) it is a plain line at the first step, at every tenth of the run and at its last step,
and in between at least every `interval_s` seconds, so a short run's console stays the same
length however slow the machine is and a long run still shows it is alive.
Events print as their own lines. Fields that some jobs add (`reward_mean`, `kl`, ...) are
shown when present.

Until the first step, the line says what the job is waiting for when a start-up phase takes
longer than `wait_after_s` (5 s): `[elastic] waiting for: Ray Train workers, 2 starting (5 s)`.
The driver names its own phases (`waiting_for`: the job's plan, the cluster, resources, the
job's services); the rest come from the records (the controller's and workers' events: the
controller, the worker group, the workers' model and checkpoint, the first step). In a log each
phase that takes that long gets one line, printed once; on a terminal one line is redrawn in
place with the phase's seconds, and cleared when the first step is done. Later waits (a restart)
have their own event lines.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections import deque
from typing import IO, Deque, Dict, List, Optional

from elastic.records import EVENTS, METRICS, read_new_records

# Optional per-step fields: (record key, label, format).
EXTRA_FIELDS = (("reward_mean", "reward", "{:.3f}"), ("kl", "kl", "{:.4f}"))
BAR_WIDTH = 24
RATE_STEPS = 10  # tokens/s and MFU on the console: over this many recent steady steps


def fmt_duration(s: Optional[float]) -> str:
    if s is None or s != s or s < 0:
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def bar(frac: float, width: int = BAR_WIDTH) -> str:
    """A unicode bar with eighth-block resolution."""
    frac = min(1.0, max(0.0, frac))
    eighths = int(round(frac * width * 8))
    full, part = divmod(eighths, 8)
    return "█" * full + ("▏▎▍▌▋▊▉"[part - 1] if part else "") + " " * (width - full - (1 if part else 0))


class Progress:
    """Follow `<local_dir>/metrics.jsonl` and `events.jsonl` from a background thread.

    `total` is the run's step count (the denominator shown); `stop_step` the step this
    invocation ends at (for the ETA; `train.until_step` or `total`). Only records appended
    after `start()` are shown, so a resumed run does not replay its history.
    """

    def __init__(self, local_dir: str, total: int, stop_step: Optional[int] = None, stream: Optional[IO[str]] = None,
                 tty: Optional[bool] = None, interval_s: float = 300.0, milestones: int = 10, poll_s: float = 0.5,
                 prefix: str = "[elastic]", wait_after_s: float = 5.0):
        self.metrics = os.path.join(local_dir, METRICS)
        self.events = os.path.join(local_dir, EVENTS)
        self.total, self.stop_step = total, stop_step or total
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s, self.poll_s, self.prefix = interval_s, poll_s, prefix
        self.every = max(1, total // max(1, milestones))  # steps between milestone lines
        self.window: Deque[Dict] = deque(maxlen=20)  # recent step records of the current worker group (ETA)
        # The rate's window: the last RATE_STEPS steady steps. A worker group's first step
        # (`warmup`: compile, CUDA and data start-up) is left out: on the first H100 run it put
        # 16k tok/s on the console while the steps ran at 57k.
        self.rate_window: Deque[Dict] = deque(maxlen=RATE_STEPS)
        self.last: Optional[Dict] = None
        self.last_printed_step = 0
        self._last_line_t = 0.0
        self._bar_shown = False
        self._starts = 0
        self._offsets = {self.metrics: 0, self.events: 0}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.RLock()  # one writer at a time: the follower, the driver's lines
        self._stopped = False
        # Start-up: the phase waited for (what, since when, shown yet), until the first step.
        self.wait_after_s = wait_after_s
        self._phase: Optional[List] = None
        self._started_up = False
        self._waiting_shown = False  # a terminal's waiting line is drawn
        self._workers = 0            # the worker group's size (resize decision)
        self._ready = 0              # workers that have built their model (`worker` events)

    # -- formatting -----------------------------------------------------------------------
    def eta_s(self) -> Optional[float]:
        """Seconds to `stop_step` at the recent pace (wall time between step records, so
        checkpoints and data waits count)."""
        if not self.last:
            return None
        left = self.stop_step - self.last["step"]
        if left <= 0:
            return 0.0
        w = list(self.window)
        if len(w) < 2 or w[-1]["step"] <= w[0]["step"]:
            return None  # a worker group's first step (start-up, first data) says little of its pace
        return left * (w[-1]["time"] - w[0]["time"]) / (w[-1]["step"] - w[0]["step"])

    def rate(self) -> tuple[float, float]:
        """(tokens/s, MFU) over the recent steady steps: Σ real tokens / Σ (step_s − eval_s), and
        Σ(mfu·step_s) / Σ (step_s − eval_s) (= FLOPs done / training time / peak). Checkpoint
        stalls count; held-out evaluation does not (it has its own line): on the first H200 run
        an 11 s evaluation with its compiles put 3.5k tok/s on the console for the 7 steps after
        it, which ran at 56k. Only a warm-up step seen yet: that step's own."""
        w = list(self.rate_window) or [self.last]
        train_s = sum(max(0.0, x.get("step_s", 0.0) - x.get("eval_s", 0.0)) for x in w)
        if train_s <= 0:
            return self.last.get("tokens_per_s", 0.0), self.last.get("mfu", 0.0)
        return (sum(x.get("tokens", 0) for x in w) / train_s,
                sum(x.get("mfu", 0.0) * x.get("step_s", 0.0) for x in w) / train_s)

    def status(self) -> str:
        """Step, loss, tokens/s and MFU (over the recent steady steps), world size, extras, ETA."""
        r = self.last
        tps, mfu = self.rate()
        parts = [f"loss {r['loss']:.4f}" if "loss" in r else "", f"{tps:,.0f} tok/s", f"MFU {mfu:.1%}" if mfu >= 0.01 or mfu == 0 else f"MFU {mfu:.2%}"]
        parts += [f"{label} {fmt.format(r[k])}" for k, label, fmt in EXTRA_FIELDS if isinstance(r.get(k), (int, float))]
        if r.get("world_size"):
            parts.append(f"{r['world_size']} workers")
        if isinstance(r.get("rollout_fleet"), (int, float)):  # disaggregated RL: the fleet and who waited
            fleet = f"{r['rollout_fleet']} rollout actors"
            if isinstance(r.get("rollout_idle_frac"), (int, float)):
                fleet += f" ({r['rollout_idle_frac']:.0%} idle)"
            if isinstance(r.get("rollout_wait_s"), (int, float)):
                fleet += f", trainers waited {r['rollout_wait_s']:.2f}s"
            parts.append(fleet)
        eta = self.eta_s()
        if r["step"] < self.stop_step and eta is not None:
            parts.append(f"ETA {fmt_duration(eta)}")
        return " | ".join(p for p in parts if p)

    def plain_line(self) -> str:
        r = self.last
        return f"{self.prefix} step {r['step']}/{self.total} ({r['step'] / max(1, self.total):.0%}) {self.status()}"

    def bar_line(self) -> str:
        r = self.last
        line = f"{self.prefix} {bar(r['step'] / max(1, self.total))} {r['step']}/{self.total} {self.status()}"
        cols = shutil.get_terminal_size((120, 24)).columns
        return line[:max(20, cols - 1)]

    def _phase_from_event(self, e: Dict) -> None:
        """The start-up phase an event begins (the controller's and the workers' records)."""
        kind = e.get("event")
        if kind == "resize_decision":
            self._workers, self._ready = int(e.get("num_workers") or 0), 0
            self.waiting_for(f"Ray Train workers, {self._workers} starting")
        elif kind == "controller_state" and e.get("to") == "RunningState":
            self.waiting_for(f"the workers' model and checkpoint, {self._ready} of {self._workers or '?'} ready")
        elif kind == "worker":
            self._ready += 1
            if self._phase is not None and self._phase[0].startswith("the workers' "):
                self._phase[0] = f"the workers' model and checkpoint, {self._ready} of {self._workers or '?'} ready"
        elif kind == "start":
            self.waiting_for("the first step")

    def event_line(self, e: Dict) -> Optional[str]:
        kind = e.get("event")
        if kind == "start":
            self._starts += 1
            how = f"attention {e.get('attention_backend')}, {e.get('device')}, {e.get('param_dtype')}"
            if e.get("mesh") and e["mesh"] != f"FSDP {e.get('world_size')} shards":  # a layout a user asked for
                how += f", {e['mesh']}"
            for note in e.get("micro_batch_notes") or ():  # a micro-batch setting above a worker's share
                how += f"; {note}"
            if self._starts == 1 and not e.get("resumed_from"):
                return f"{self.prefix} workers: {e.get('world_size')} started at step {e.get('step')} ({how})"
            verb = "started" if self._starts == 1 else "restarted"
            return f"{self.prefix} workers: {e.get('world_size')} {verb}, resuming at step {e.get('step')} ({how})"
        if kind == "layout_wait":
            return (f"{self.prefix} workers: {e.get('possible')} could run, {e.get('used')} will: elastic sizes are whole "
                    f"groups of {e.get('unit')} (parallel.pp x parallel.tp; the rest wait for a full group)")
        if kind == "failure_decision":
            return f"{self.prefix} worker group failed; Ray Train decided: {e.get('decision')}"
        if kind == "controller_state" and e.get("error"):
            return f"{self.prefix} training failed: {e['error']}"
        return None

    # -- output ---------------------------------------------------------------------------
    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed console must not take the run down

    def _line(self, text: str) -> None:
        """A line of its own, above the bar (or a terminal's waiting line) when one is shown."""
        with self._lock:
            if self._bar_shown or self._waiting_shown:
                self._write("\r\x1b[2K")
            self._write(text + "\n")
            if self._bar_shown and self.last:
                self._write(self.bar_line())
            elif self._waiting_shown:
                self._write(self.waiting_line())

    def say(self, text: str) -> None:
        """A line of the driver's own (it keeps a terminal's waiting line below it)."""
        self._line(text)

    # -- start-up: what the job waits for ---------------------------------------------------
    def waiting_for(self, what: str) -> None:
        """A start-up phase begins now: `what` is shown if it lasts `wait_after_s`. Ignored once
        the first step is done."""
        with self._lock:
            if not self._started_up:
                self._phase = [what, time.monotonic(), False]

    def waiting_line(self) -> str:
        what, since, _ = self._phase
        return f"{self.prefix} waiting for: {what} ({time.monotonic() - since:.0f} s)"

    def _show_waiting(self) -> None:
        with self._lock:
            if self._phase is None or self._started_up:
                return
            if time.monotonic() - self._phase[1] < self.wait_after_s:
                return
            if self.tty:
                self._write("\r\x1b[2K" + self.waiting_line())
                self._waiting_shown = True
            elif not self._phase[2]:
                self._write(self.waiting_line() + "\n")
                self._phase[2] = True

    def _end_startup(self) -> None:
        with self._lock:
            self._started_up, self._phase = True, None
            if self._waiting_shown:
                self._write("\r\x1b[2K")
                self._waiting_shown = False

    def _show(self, final: bool = False) -> None:
        with self._lock:
            self._show_locked(final)

    def _show_locked(self, final: bool = False) -> None:
        if not self.last:
            return
        if self.tty:
            self._write("\r\x1b[2K" + self.bar_line())
            self._bar_shown = True
            return
        now = time.monotonic()
        step = self.last["step"]
        milestone = step // self.every > self.last_printed_step // self.every
        due = (self.last_printed_step == 0 or milestone or now - self._last_line_t >= self.interval_s
               or step >= self.stop_step or final)
        if due and step != self.last_printed_step:
            self._write(self.plain_line() + "\n")
            self.last_printed_step, self._last_line_t = step, now

    # -- following ------------------------------------------------------------------------
    def poll(self) -> None:
        """Read what was appended since the last poll and update the console."""
        events, self._offsets[self.events] = read_new_records(self.events, self._offsets[self.events])
        for e in events:
            if e.get("event") == "start":
                self.window.clear()  # a new worker group: its pace is what counts now
                self.rate_window.clear()
            if not self._started_up:
                self._phase_from_event(e)
            text = self.event_line(e)
            if text:
                self._line(text)
        recs, self._offsets[self.metrics] = read_new_records(self.metrics, self._offsets[self.metrics])
        for r in recs:
            if "step" in r:
                self.window.append(r)
                if not r.get("warmup"):
                    self.rate_window.append(r)
                self.last = r
        if self.last is not None and not self._started_up:
            self._end_startup()
        if recs:
            self._show()
        self._show_waiting()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # the console is best effort; training goes on
                continue

    def start(self) -> "Progress":
        for path in self._offsets:  # follow from here: a resumed run's history is not news
            try:
                self._offsets[path] = os.path.getsize(path)
            except OSError:
                self._offsets[path] = 0
        self._thread = threading.Thread(target=self._run, name="elastic-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Show what is left (the final step) and end the bar's line. Once: later calls, and
        lines said after it, just print."""
        if self._stopped or self._thread is None:  # (never started: nothing to show)
            self._stopped = True
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._end_startup()  # (a wait is not news once the job is over)
        try:
            self.poll()
        except Exception:
            pass
        with self._lock:
            if self.tty:
                if self._bar_shown:
                    self._write("\n")
                    self._bar_shown = False
            else:
                self._show_locked(final=True)

    def __enter__(self) -> "Progress":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def lines(text: str) -> List[str]:
    """Console text as the user sees it: carriage-return redraws collapsed (for tests and tools)."""
    return [seg.split("\r")[-1].replace("\x1b[2K", "") for seg in text.split("\n")]
