"""Compile and run one program in the sandbox, and classify a raw run outcome.

The same functions serve candidates and references, every code verifier (code_opt, python_tests),
the pool and the CLI; `default_sandbox` is the one sandbox per process and settings that they share.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from elastic.sandbox.command import Limits, PreparedRun, RunOutcome, Sandbox

COMPILE = {
    "c": (["gcc", "-O2", "-std=c17", "-o", "prog", "src.c", "-lm"], "src.c"),
    "cpp": (["g++", "-O2", "-std=c++17", "-o", "prog", "src.cpp"], "src.cpp"),
}
_OOM_MARKERS = (b"std::bad_alloc", b"Cannot allocate memory", b"out of memory", b"memory exhausted")
PREPARE_AHEAD = 8  # runs launched ahead of their turn (each holds a waiting sandbox and a cgroup)


_SANDBOXES: dict = {}


def default_sandbox(env_allow=(), allow_weak_isolation: bool = False) -> Sandbox:
    """This process's sandbox for these settings (raises SandboxUnavailable without a working
    bubblewrap unless `allow_weak_isolation`, see Sandbox)."""
    key = (tuple(env_allow), bool(allow_weak_isolation))
    if key not in _SANDBOXES:
        _SANDBOXES[key] = Sandbox(env_allow=env_allow, allow_weak_isolation=allow_weak_isolation)
    return _SANDBOXES[key]


@dataclass
class Compiled:
    ok: bool
    binary: Optional[Path]
    outcome: RunOutcome
    reason: str = ""
    sandbox_error: bool = False


def compile_limits(wall_s: float, memory_mb: int) -> Limits:
    return Limits(wall_s=wall_s, cpu_s=wall_s, memory_mb=memory_mb, fsize_mb=64, pids=32, nofile=128,
                  stdout_bytes=256 << 10, stderr_max_bytes=8 << 20, scratch_mb=256)


@contextlib.contextmanager
def compiled(sandbox: Sandbox, source: str, language: str, limits: Limits) -> Iterator[Compiled]:
    """Compile in a fresh scratch dir; yields the binary (valid inside the `with` only)."""
    with sandbox.scratch() as d:
        yield compile_in(sandbox, d, source, language, limits)


def compile_in(sandbox: Sandbox, d: Path, source: str, language: str, limits: Limits) -> Compiled:
    """Compile `source` in scratch dir `d`; the binary, if any, is ``d / "prog"``."""
    return finish_compile(start_compile(sandbox, d, source, language, limits), d)


def start_compile(sandbox: Sandbox, d: Path, source: str, language: str, limits: Limits) -> PreparedRun:
    """Write the source into `d` and release the compiler; :func:`finish_compile` collects it."""
    argv, src_name = COMPILE[language]
    (d / src_name).write_text(source)
    run = sandbox.prepare(list(argv), d, limits, setup_ahead=False)
    run.release()
    return run


def finish_compile(run: PreparedRun, d: Path) -> Compiled:
    binary = d / "prog"
    o = run.finish()
    return compile_verdict(o, binary.is_file(), binary)


def compile_verdict(o: RunOutcome, produced: bool, binary: Optional[Path]) -> Compiled:
    """What a compiler run means; `produced`: whether it left the binary."""
    if o.sandbox_failed:
        return Compiled(False, None, o, o.sandbox_error, sandbox_error=True)
    if o.timed_out:
        return Compiled(False, None, o, "compiler timed out")
    if o.output_limit:
        return Compiled(False, None, o, "compiler output limit exceeded")
    if not o.ok or not produced:
        mem = o.cgroup.memory_limit_hit or any(m in o.stderr for m in _OOM_MARKERS)
        return Compiled(False, None, o, "compiler ran out of memory" if mem else "compilation failed")
    return Compiled(True, binary, o)


@contextlib.contextmanager
def run_dir(sandbox: Sandbox, binary: Path) -> Iterator[Path]:
    """A fresh scratch dir holding (a hard link to) the binary, removed afterwards."""
    with sandbox.scratch() as d:
        try:
            os.link(binary, d / "prog")
        except OSError:
            shutil.copy2(binary, d / "prog")
        yield d


def run_limits(time_limit_s: float, memory_mb: int) -> Limits:
    return Limits(wall_s=time_limit_s, cpu_s=time_limit_s, memory_mb=memory_mb)


def run_binary(sandbox: Sandbox, binary: Path, stdin: Path, limits: Limits, cpu: Optional[int],
               prefix: Optional[List[str]] = None, want_log: bool = False) -> RunOutcome:
    """Run the binary in a fresh working directory: under bwrap a tmpfs made for this run with
    the binary bound in read-only (no host directory needed), else a fresh scratch dir."""
    return prepare_binary(sandbox, binary, stdin, limits, cpu, prefix, want_log, setup_ahead=False).start()


def prepare_binary(sandbox: Sandbox, binary: Path, stdin: Path, limits: Limits, cpu: Optional[int],
                   prefix: Optional[List[str]] = None, want_log: bool = False,
                   setup_ahead: bool = True) -> "PreparedRun | _DeferredRun":
    """:func:`run_binary`, launched now and started later (see Sandbox.prepare); under bwrap
    the binary need not exist yet."""
    argv = [*(prefix or []), "./prog"]
    if sandbox.iso.wrapper == "bwrap":
        return sandbox.prepare(argv, binary.parent, limits, stdin_path=stdin, cpu=cpu, tmpfs_workdir=True,
                               want_log=want_log, files={"prog": binary}, setup_ahead=setup_ahead)

    def run_in_scratch() -> RunOutcome:
        with run_dir(sandbox, binary) as d:
            return sandbox.run(argv, d, limits, stdin_path=stdin, cpu=cpu, tmpfs_workdir=True, want_log=want_log)
    return _DeferredRun(run_in_scratch)


class RunQueue:
    """Runs of one binary on several inputs, each launched (Sandbox.prepare: spawn, cgroup
    attach, limits, and with `setup_ahead` bwrap's namespaces and mounts) up to `ahead` runs
    before its turn.

    Why: a cgroup v1 attach waits for an RCU grace period (~10 ms) unless another attach
    happened just before, and bwrap's set-up costs ~3 ms; launched together before the compile,
    a program's runs share one grace period, and their set-ups overlap the compile. Timed runs
    use ``setup_ahead=False``: attached early, but set up after start, so no set-up shares the
    pinned core with a timed run. Leaving the ``with`` block cancels what is left.
    """

    def __init__(self, sandbox: Sandbox, binary: Path, stdins: List[Path], limits: Limits, cpu: Optional[int],
                 ahead: int = PREPARE_AHEAD, setup_ahead: bool = True, prefix: Optional[List[str]] = None,
                 want_log: bool = False) -> None:
        self.sandbox, self.binary, self.stdins, self.limits, self.cpu = sandbox, binary, stdins, limits, cpu
        self.ahead, self.setup_ahead, self.prefix, self.want_log = ahead, setup_ahead, prefix, want_log
        self._queue: "collections.deque[PreparedRun | _DeferredRun]" = collections.deque()
        self._next = 0
        self._fill()

    def _fill(self) -> None:
        while self._next < len(self.stdins) and len(self._queue) < self.ahead:
            self._queue.append(prepare_binary(self.sandbox, self.binary, self.stdins[self._next], self.limits,
                                              self.cpu, self.prefix, self.want_log, self.setup_ahead))
            self._next += 1

    def next(self) -> RunOutcome:
        """Start the next run and return its outcome."""
        run = self._queue.popleft()
        try:
            return run.start()
        finally:
            self._fill()

    def close(self) -> None:
        while self._queue:
            self._queue.popleft().cancel()

    def __enter__(self) -> "RunQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _DeferredRun:
    """Without bwrap the program runs in a host scratch dir holding the binary: made at start."""

    def __init__(self, fn: Callable[[], RunOutcome]) -> None:
        self.fn = fn

    def start(self) -> RunOutcome:
        return self.fn()

    def cancel(self) -> None:
        pass

    def __enter__(self) -> "_DeferredRun":
        return self

    def __exit__(self, *exc) -> None:
        pass


def classify(o: RunOutcome, limits: Limits) -> Tuple[str, str]:
    """(status, detail) of one run, before output checking ("ok" = exited 0 in limits).

    Memory evidence relied on: the run cgroup's failcnt/OOM-kill counter, or a failing run
    whose stderr shows an allocation failure (bad_alloc, ENOMEM), or a failing run whose peak
    memory reached 90% of the limit (RLIMIT_AS makes allocation fail; a C program then usually
    dies on a NULL pointer). Peak memory is the run cgroup's max usage (the wrapper's rusage
    does not include the namespaced program); without a memory cgroup only the rusage and
    stderr evidence remain, so such a crash may be reported as runtime_error.
    SIGXFSZ (file size limit) is checked first. A failing run with no such evidence is a
    runtime_error.
    """
    if o.sandbox_failed:
        return "sandbox_error", o.sandbox_error
    if o.timed_out:
        return "timeout", f"exceeded {limits.wall_s:g}s wall / {limits.cpu_limit}s CPU"
    if o.output_limit:
        return "runtime_error", "output limit exceeded"
    if o.ok:
        return "ok", ""
    if o.signal == signal.SIGXFSZ:
        # A definite signal beats the memory heuristics below: cgroup v1 peak usage includes
        # the page cache of the file being written, so a disk filler can look "near the limit".
        return "runtime_error", "file size limit exceeded"
    # Evidence must be the program's own. The cgroup's counters (v1 failcnt and max usage)
    # include page cache (the binary, libc and files read are charged to the run), so they count
    # only for a process that died of a signal (OOM kill; SIGSEGV on a failed malloc). The
    # wrapper's ru_maxrss is no evidence at all: Linux keeps maxrss across exec, and the shim is
    # vforked from the evaluating process, so it reports that process's high-water mark (a
    # `return 125` was judged memory_limit once the test process had grown). It is used only
    # where no memory cgroup exists. A process that exited by itself needs an OOM kill or an
    # out-of-memory message.
    killed = o.signal is not None
    cg_peak = o.cgroup.max_memory_bytes
    peak = cg_peak if cg_peak is not None else o.max_rss_kb * 1024
    near_limit = killed and peak >= 0.9 * (limits.memory_mb << 20)
    hit = o.cgroup.oom_kills > 0 or (killed and o.cgroup.memory_limit_hit)
    if hit or any(m in o.stderr for m in _OOM_MARKERS) or near_limit:
        return "memory_limit", f"memory limit {limits.memory_mb} MB exceeded (peak {peak >> 20} MB)"
    if o.signal is not None:
        try:
            name = signal.Signals(o.signal).name
        except ValueError:
            name = str(o.signal)
        return "runtime_error", f"killed by {name}"
    return "runtime_error", f"exit code {o.exit_code}"
