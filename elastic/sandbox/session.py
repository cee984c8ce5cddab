"""One sandbox per evaluation: the parent side of the in-sandbox runner.

Each compile and each run used to get its own bubblewrap instance and cgroup; that set-up cost
more than the short test runs it wrapped, and scaled badly across parallel evaluators (the
kernel's mount and cgroup paths). A :class:`RunSession` starts one bubblewrap instance per
evaluation, with the runner of :mod:`elastic.sandbox.runner_source` as its PID 1, in one cgroup,
launched by the same trusted shim as single runs (cgroup attach and rlimits before bwrap; the
next session's shim is attached ahead, see ``_take_launched``). Every job (the compile, a test, a
warm-up or a timed run) still has its own rlimits, CPU pin (runs), fresh working directory,
stdin, output caps and wall clock, is killed with everything it started when it ends, and gets
its own cgroup limits and memory evidence: the limits are rewritten and the peak and failure
counters reset before each job, and read after it.

Layers are the ones :class:`elastic.sandbox.command.Sandbox` reports; the difference is that
the jobs of one evaluation (one program) share the namespaces, never two programs; the runner
wipes what a job could leave for the next (runner_source.py). Only under bubblewrap with the
launcher and the runner built; otherwise callers use the per-process path
(:class:`elastic.reward.verifiers.programs.RunQueue`, one sandbox per process).
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from elastic.sandbox import launcher
from elastic.sandbox.cgroups import CgroupStats
from elastic.sandbox.isolation import BWRAP_BASE, log
from elastic.sandbox.command import SANDBOX_DIR, Limits, RunOutcome, Sandbox, _clean_env, _discard, _Launched

RUNNER_DIR = "/.runner"
BINARY_DIR = "/.binary"
BUILD_DIR = "/build"
INPUTS_DIR = "/.in"
ANSWER_GRACE_S = 5.0  # beyond a job's wall limit, how long the parent waits for the runner's answer


def sessions_available(sandbox: Sandbox) -> bool:
    """Whether :class:`RunSession` can run here (bwrap, the launcher and the runner built)."""
    return (sandbox.iso.wrapper == "bwrap" and sandbox.launcher is not None
            and launcher.build_runner(sandbox.scratch_root) is not None)


def envelope(*limits: Limits) -> Limits:
    """The smallest limits that hold every one of `limits` (the session's own rlimits and
    tmpfs sizes: a job can only lower the rlimits it inherits)."""
    return Limits(wall_s=max(l.wall_s for l in limits), memory_mb=max(l.memory_mb for l in limits),
                  fsize_mb=max(l.fsize_mb for l in limits), pids=max(l.pids for l in limits),
                  nofile=max(l.nofile for l in limits), scratch_mb=max(l.scratch_mb for l in limits),
                  address_space=all(l.address_space for l in limits))


def _cgroup_memory(limits: Limits) -> int:
    return (limits.memory_mb + limits.scratch_mb * 2 + 64) << 20  # as Sandbox does per run


def _take_launched(sandbox: Sandbox) -> _Launched:
    """The sandbox's spare session launcher (attached during the previous evaluation, so the
    attach's RCU grace period is off this one's critical path) if alive, else a new one."""
    spare, sandbox._session_spare = sandbox._session_spare, None
    if spare is not None and spare.proc is not None and spare.proc.poll() is None and not spare.spawn_error:
        return spare
    if spare is not None:
        _discard(spare)
    return _new_launched(sandbox)


def _new_launched(sandbox: Sandbox) -> _Launched:
    return _Launched(sandbox, _clean_env(SANDBOX_DIR, "/tmp", sandbox.env_allow), "/", False, session=True)


def _restock(sandbox: Sandbox) -> None:
    if sandbox._session_spare is None:
        sandbox._session_spare = _new_launched(sandbox)


class RunSession:
    """One sandbox for an evaluation: with `build_dir` (holding the source) a :meth:`compile`
    job first, else runs of `binary` (which need exist only when the first job starts); the
    jobs read stdin from the files in `inputs` (exposed read-only, nothing else of their
    directories). `limits` are every limit any job will ask for (see :func:`envelope`)."""

    def __init__(self, sandbox: Sandbox, inputs: List[Path], limits: Limits, cpu: Optional[int],
                 binary: Optional[Path] = None, build_dir: Optional[Path] = None) -> None:
        assert (binary is None) != (build_dir is None), "a binary to run, or a directory to build one in"
        self.sb, self.cpu = sandbox, cpu
        self.error = ""
        self._ready = False
        self._closed = False
        self._in_paths: Dict[Path, str] = {}
        self._buf = bytearray()  # the runner's answers, read ahead
        self._cg_limits: Optional[tuple] = None
        self.compiled = False
        runner = launcher.build_runner(sandbox.scratch_root)
        assert runner is not None and sandbox.launcher is not None, "check sessions_available() first"
        argv = ["bwrap", *BWRAP_BASE, *sandbox._system_binds, "--proc", "/proc",
                "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",  # the host's sysctls: see command.py _wrap
                "--remount-ro", "/dev", "--size", str(limits.scratch_mb << 20), "--tmpfs", "/tmp",
                "--size", str(limits.scratch_mb << 20), "--tmpfs", SANDBOX_DIR,
                "--ro-bind", str(Path(runner).parent), RUNNER_DIR]
        if build_dir is not None:
            argv += ["--bind", str(build_dir), BUILD_DIR]
            target = "-"
        else:
            assert binary is not None
            argv += ["--ro-bind", str(binary.parent), BINARY_DIR]
            target = f"{BINARY_DIR}/{binary.name}"
        for i, p in enumerate(inputs):
            inner = f"{INPUTS_DIR}/{i}"
            argv += ["--ro-bind", str(p), inner]
            self._in_paths[Path(p)] = inner
        argv += ["--chdir", SANDBOX_DIR, "--as-pid-1", "--", f"{RUNNER_DIR}/{Path(runner).name}", target]
        # The session's own rlimits: the envelope's, minus CPU time (cumulative over the jobs;
        # each job gets its own); jobs can only lower them. No CPU pin: each run is pinned.
        self._nproc = sandbox._nproc(limits)
        rl = [r for r in sandbox._rlimits(limits, self._nproc) if r[0] != resource.RLIMIT_CPU]
        self._launched = L = _take_launched(sandbox)
        self.cg, self.proc, self._launch_r, self.error = L.cg, L.proc, L.launch_r, L.spawn_error
        L.send(launcher.message(argv, rl, None))
        _restock(sandbox)  # the next evaluation's launcher attaches while this one works

    # -- protocol ------------------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        """Read what the runner has written so far (at least one byte) into the buffer."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the sandbox runner did not answer in time")
            if select.select([fd], [], [], left)[0]:
                break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise EOFError("the sandbox runner exited")
        self._buf += chunk

    def _read(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_line(self, deadline: float) -> str:
        while b"\n" not in self._buf:
            if len(self._buf) > 4096:
                raise ValueError("the sandbox runner's answer is malformed")
            self._fill(deadline)
        i = self._buf.index(b"\n") + 1
        return self._read(i, deadline).decode()

    def _fail_text(self) -> str:
        """Why the session is unusable: the launcher's report, else bwrap's stderr."""
        report = b""
        try:
            while select.select([self._launch_r], [], [], 0)[0]:
                chunk = os.read(self._launch_r, 512)
                if not chunk:
                    break
                report += chunk
        except OSError:
            pass
        report = report.lstrip(launcher.READY_MARK).strip()
        if report:
            return report.decode(errors="replace")
        err = b""
        if self.proc is not None and self.proc.stderr is not None:
            self._kill()
            try:
                err = self.proc.stderr.read() or b""
            except OSError:
                pass
        return "sandbox session failed: " + (err.decode(errors="replace").strip()[-500:] or "runner exited")

    def compile(self, argv: List[str], limits: Limits) -> RunOutcome:
        """Run the compiler in ``/build`` (the session's `build_dir`); on success its
        ``prog`` becomes the binary of every later :meth:`run` (see :attr:`compiled`)."""
        return self._job("C", argv, "/dev/null", limits, None)

    def run(self, stdin: Path, limits: Limits, argv: Optional[List[str]] = None) -> RunOutcome:
        """Run the binary on `stdin` (one of the session's inputs) under `limits`, pinned to
        the session's CPU."""
        return self._job("J", argv or ["./prog"], self._in_paths[Path(stdin)], limits, self.cpu)

    def _job(self, kind: str, argv: List[str], stdin: str, limits: Limits, cpu: Optional[int]) -> RunOutcome:
        out = RunOutcome()
        if self.error or self.proc is None or self._closed:
            out.sandbox_failed, out.sandbox_error = True, self.error or "sandbox session closed"
            return out
        rl = [*self.sb._rlimits(limits, self._nproc), (resource.RLIMIT_MSGQUEUE, 0, 0)]  # see runner_source
        rl_tok = [f"{r}:{launcher._unsigned(s)}:{launcher._unsigned(h)}" for r, s, h in rl]
        line = [kind, str(int(limits.wall_s * 1000)), str(limits.stdout_bytes), str(limits.stderr_keep_bytes),
                str(limits.stderr_max_bytes), str(-1 if cpu is None else cpu), str(len(rl_tok)), *rl_tok, stdin,
                str(len(argv)), *argv]
        assert all(t and not any(c.isspace() for c in t) for t in line), line
        try:
            before = self._job_start(limits)
            if not self._ready:
                if self._read(1, time.monotonic() + 30.0) != b"+":
                    raise ValueError("the sandbox runner did not start")
                self._ready = True
            assert self.proc.stdin is not None
            self.proc.stdin.write((" ".join(line) + "\n").encode())
            deadline = time.monotonic() + limits.wall_s + ANSWER_GRACE_S
            head = self._read_line(deadline).split()
            if len(head) != 12 or head[0] != "R":
                raise ValueError(f"the sandbox runner's answer is malformed: {head[:3]}")
            code, sig, wall_ns, cpu_us, rss, timed_out, out_limit, exec_errno, binary_ok, olen, elen = map(
                int, head[1:])
            out.stdout = self._read(olen, deadline)
            out.stderr = self._read(elen, deadline)
        except (OSError, EOFError, TimeoutError, ValueError) as e:
            self.error = self._fail_text() if isinstance(e, EOFError) or not self._ready else f"sandbox session: {e}"
            self._kill()
            out.sandbox_failed, out.sandbox_error = True, self.error
            return out
        if kind == "C":
            self.compiled = bool(binary_ok)
        out.wall_s, out.cpu_s, out.max_rss_kb = wall_ns / 1e9, cpu_us / 1e6, rss
        out.timed_out, out.output_limit = bool(timed_out), bool(out_limit)
        if exec_errno:
            out.sandbox_failed, out.sandbox_error = True, f"exec {argv[0]}: {os.strerror(exec_errno)}"
        elif sig:
            out.signal = sig
        else:
            out.exit_code = code
        if out.signal == signal.SIGXCPU or (out.signal == signal.SIGKILL and out.cpu_s >= limits.cpu_limit - 0.05):
            out.timed_out = True
        out.cgroup = self._job_stats(before)
        return out

    # -- per-job cgroup evidence ---------------------------------------------------------
    def _job_start(self, limits: Limits) -> CgroupStats:
        """This job's cgroup limits, and its counters reset (peak and failures: v1, and v2
        where the kernel allows); the cumulative OOM-kill count is returned to subtract."""
        if self.cg is None:
            return CgroupStats()
        want = (limits.pids + 4, _cgroup_memory(limits))  # + bwrap, its monitor, the runner
        if want != self._cg_limits:
            try:
                self.cg.set_limits(*want)
                self._cg_limits = want
            except OSError as e:  # v1 refuses a memory limit below usage it cannot reclaim
                log.warning("SANDBOX WARNING: cgroup limits %s not applied (%s); rlimits still bound the run",
                            want, e)
        self.cg.reset_peaks()
        return self.cg.stats()

    def _job_stats(self, before: CgroupStats) -> CgroupStats:
        if self.cg is None:
            return CgroupStats()
        s = self.cg.stats()
        s.oom_kills = max(0, s.oom_kills - before.oom_kills)
        s.memory_limit_hit = (s.memory_limit_hit and not before.memory_limit_hit) or s.oom_kills > 0
        s.pids_limit_hit = s.pids_limit_hit and not before.pids_limit_hit
        return s

    # -- end -----------------------------------------------------------------------------
    def _kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """EOF to the runner (it kills what is left and exits), reap, remove the cgroup."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.proc is not None:
                if self.proc.stdin is not None:
                    try:
                        self.proc.stdin.close()
                    except OSError:
                        pass
                try:
                    self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    self._kill()
                    self.proc.wait()
                self._kill()  # anything bwrap left behind (it is --die-with-parent, so nothing)
                for f in (self.proc.stdout, self.proc.stderr):
                    if f is not None:
                        f.close()
        finally:
            for fd in self._launched.fds:
                os.close(fd)
            self._launched.fds.clear()
            self._launch_r = None
            if self.cg is not None:
                self.sb.retire(self.cg)

    def __enter__(self) -> "RunSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SessionQueue:
    """:class:`elastic.reward.verifiers.programs.RunQueue`'s interface over a session: ``next()`` runs
    the binary on the next input, ``close()`` ends the session if this queue owns it."""

    def __init__(self, session: RunSession, stdins: List[Path], limits: Limits, owns: bool = False) -> None:
        self.session, self.stdins, self.limits, self.owns = session, list(stdins), limits, owns
        self._next = 0

    def next(self) -> RunOutcome:
        stdin = self.stdins[self._next]
        self._next += 1
        return self.session.run(stdin, self.limits)

    def close(self) -> None:
        if self.owns:
            self.session.close()

    def __enter__(self) -> "SessionQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
