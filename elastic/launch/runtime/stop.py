"""Stopping a job from outside (Ctrl-C, `timeout`, a scheduler, `ray job stop`): one console
line, a clean end, and the command that resumes the run.

Without this, SIGTERM reaches the handler Ray's core worker installs (a C++ stack dump:
`logging.cc: *** SIGTERM received ...`, `PC: @ ...`, then Ray's own Python handler exits 1),
and Ctrl-C raises KeyboardInterrupt wherever the driver happens to be, often inside Ray with a
long traceback. Here both signals raise `JobStopped` in the driver's main thread instead: the
job driver's `finally` blocks then stop the progress line, disconnect from Ray (`disconnect`:
the job's actors end with the driver's connection, a private instance stops), write the run
report quietly and release the run's lease; the entry point prints one line and exits 128 + the
signal number (130 for SIGINT, 143 for SIGTERM). Checkpoints are the unit of recovery: the
relaunch resumes from the last one Ray Train registered.

Only entry points (jobs/*.py, through `run_or_exit_code`) ask for this with `install()`; a
notebook calling `run_pretraining` keeps its own Ctrl-C. `ray.init` installs its own SIGTERM
handler, so `connect` (cluster.py) calls `reinstall()` right after it. A second signal while the
job cleans up is noted and ignored, so cleanup is not cut short; a third ends the process.
"""

from __future__ import annotations

import io
import os
import shlex
import signal
import sys
import threading
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
FIT_THREAD = "elastic-fit"  # the helper thread of call_interruptibly


class JobStopped(KeyboardInterrupt):
    """Raised in the driver's main thread by SIGINT or SIGTERM. A KeyboardInterrupt, so no
    `except Exception` on the way swallows it, and so Ray's blocking calls (`ray.get` checks for
    signals and turns a KeyboardInterrupt into its own) give up instead of swallowing it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.checkpoint: Optional[str] = None  # the run's last complete checkpoint, filled in by the driver

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_received: list = []
_wanted = [False]


def _handler(signum: int, frame) -> None:
    _received.append(signum)
    if len(_received) == 1:
        raise JobStopped(signum)
    if len(_received) >= 3:  # the user insists: no more cleanup
        os._exit(128 + signum)


def install() -> None:
    """Route SIGINT and SIGTERM to `JobStopped` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _wanted[0] = True
    for s in SIGNALS:
        signal.signal(s, _handler)
    _fault_stacks()


def _fault_stacks() -> None:
    """A crash in native code leaves every thread's Python stack on stderr. While Ray is
    connected its core worker's own SIGSEGV handler prints a native trace instead; `disconnect`
    calls this again after `ray.shutdown`, which leaves no handler behind (a crash there, e.g. a
    thread still inside a Ray call, would otherwise end the driver with a bare -11)."""
    import faulthandler

    # sys.stderr may be a stream without a descriptor (pytest's capture, a notebook): the process's
    # own stderr then, and no handler where there is none at all.
    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.enable(file=stream, all_threads=True)
            return
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            continue


def reinstall() -> None:
    """After `ray.init` (which replaces the SIGTERM handler): again, if an entry point asked."""
    if _wanted[0]:
        install()


def stopped_by() -> Optional[int]:
    """The first stop signal received, if any: an exception Ray wraps around JobStopped (it can
    surface as a SystemError from inside a Cython call) still means the job was stopped."""
    return _received[0] if _received else None


def as_stop(e: BaseException) -> Optional[JobStopped]:
    """`e` if it is a JobStopped; any other exception raised after a stop signal (Ray raises its
    own around ours) as a new one; else None (a real error)."""
    if isinstance(e, JobStopped):
        return e
    signum = stopped_by()
    return JobStopped(signum) if signum is not None else None


def call_interruptibly(fn: Callable[[], T]) -> T:
    """`fn()` in a helper thread while the main thread waits in short joins, so a stop signal is
    handled at once (a blocking `ray.get` in the main thread runs handlers only now and then),
    and so Ray Train's `fit` does not install its own SIGINT handler (it does so only in the
    main thread). The thread's result is returned and its exception re-raised."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=target, name=FIT_THREAD, daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if "error" in box:
        raise box["error"]
    return box["result"]


def disconnect(abort: Optional[Callable[[], None]] = None, join_s: float = 15.0) -> None:
    """End this driver's part in Ray now that the job is stopped: every actor it owns (the Ray
    Train controller and workers, the store builder, the reward pool and services; none is
    detached) ends with its connection, and a private instance stops. Doing this before the
    job's own cleanup keeps workers from calling actors that cleanup has just killed (Ray would
    print each retried call on the console). `abort` (the driver passes Ray Train's controller
    abort) runs first and the `fit` thread is given `join_s` to return: `ray.shutdown` under a
    thread still inside a Ray call can crash the process. Never raises."""
    if abort is not None:  # first let the thread running `fit` leave Ray (see lean_train.RUNNING)
        try:
            abort()
        except Exception:
            pass
        for t in threading.enumerate():
            if t.name == FIT_THREAD and t.is_alive():
                t.join(join_s)
    try:
        import ray

        ray.shutdown()
    except Exception:
        pass
    if _wanted[0]:
        _fault_stacks()


def relaunch_command(argv: Optional[list] = None) -> str:
    """The command that ran this job, as a user would type it again (it resumes the run)."""
    exe = os.path.relpath(sys.executable)
    return shlex.join([exe if not exe.startswith("..") else "python", *(sys.argv if argv is None else argv)])
