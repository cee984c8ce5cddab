"""Run one untrusted command under every isolation layer this machine offers.

Layers, outermost first (see :mod:`elastic.sandbox.isolation` for detection):

* its own session / process group (``setsid``), killed as a whole on the wall clock;
* a per-run cgroup with ``pids.max`` and a memory limit (when writable): the layer that
  stops fork bombs when running as root, since root ignores RLIMIT_NPROC;
* rlimits set in the child before exec: CPU seconds, address space, file size, process
  count, open files, no core dumps; plus pinning to one core for timing;
* bubblewrap (network, PID, mount, IPC, UTS namespaces; only /usr and the /lib links
  visible, read-only; a size-limited tmpfs as scratch and /tmp), else ``unshare``;
* a clean environment (nothing from the parent unless allow-listed);
* stdout captured up to a cap (exceeding it kills the run), stderr kept up to a smaller cap.

The scratch directory is fresh per run and removed afterwards (see :meth:`Sandbox.scratch`).

An evaluation under bubblewrap does not use this per-process path for its own compile and
runs: :mod:`elastic.sandbox.session` runs them all in one bubblewrap instance (same layers,
one set-up, per-job limits and a wipe between jobs). This path serves the reference
compile, the instruction-count timing mode and machines without bubblewrap.

Per-run cost (figures: bench/reward_profile.py). A run is *prepared*, then *started*
(:meth:`Sandbox.prepare`, :class:`PreparedRun`; :meth:`Sandbox.run` does both at once):

* the process is spawned with ``vfork`` as the trusted shim of :mod:`elastic.sandbox.launcher`,
  which attaches itself to the run's fresh cgroup, then applies the rlimits, CPU pin, stdin
  and command it receives as a message (``preexec_fn`` would force a full ``fork`` of a large
  actor process);
* a cgroup v1 attach waits for an RCU grace period unless another attach just happened, so a
  sandbox keeps one spare shim attached ahead (:meth:`Sandbox._take_launched`), and callers
  launch a program's runs before they need them (``programs.RunQueue``); with
  ``setup_ahead`` bubblewrap even builds the namespaces and mounts and waits on ``--block-fd``;
* at the end the wrapper is reaped first, the cgroup's final counters are read, and the
  emptied cgroup is removed by a background thread (:meth:`Sandbox.retire`);
* leftovers of dead owners are swept at construction, when a foreign owner seen alive has
  died, and at most every ``SWEEP_INTERVAL_S`` otherwise, not by listing /tmp on every run.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import resource
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from elastic.sandbox import launcher
from elastic.sandbox.cgroups import CgroupStats, RunCgroup, _pid_alive
from elastic.sandbox.isolation import (BWRAP_BASE, Isolation, SandboxUnavailable, detect, log, system_binds,
                                     unavailable_message, warn_weak)

SANDBOX_DIR = "/sandbox"
FILES_DIR = "/.files"  # read-only directories of the files a run is given (see Sandbox._wrap)
SWEEP_INTERVAL_S = 60.0  # backstop full sweep; owners seen alive are re-checked every run
USER_TASKS_TTL_S = 1.0  # non-root with a pids cgroup: how long a /proc task count is reused
USER_TASKS_SLACK = 64  # ...and the headroom added for tasks started since it was counted


@dataclass
class Limits:
    """Per-run limits. Memory is the program's budget; slack covers runtime/sandbox overhead."""

    wall_s: float = 2.0
    cpu_s: Optional[float] = None  # default: wall_s + 1
    memory_mb: int = 256
    address_space: bool = True  # False for valgrind, which reserves huge virtual ranges
    fsize_mb: int = 16
    pids: int = 64
    nofile: int = 64
    stdout_bytes: int = 8 << 20
    stderr_keep_bytes: int = 16 << 10
    stderr_max_bytes: int = 1 << 20
    scratch_mb: int = 64

    @property
    def cpu_limit(self) -> int:
        return int(self.cpu_s if self.cpu_s is not None else self.wall_s + 1) + 1


@dataclass
class RunOutcome:
    """What happened to one sandboxed command (raw facts; the evaluator classifies)."""

    exit_code: Optional[int] = None
    signal: Optional[int] = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    log: bytes = b""  # the extra `log_fd` channel (valgrind/perf output), never the program's
    timed_out: bool = False
    output_limit: bool = False
    sandbox_failed: bool = False  # the wrapper itself could not set up the sandbox
    sandbox_error: str = ""
    cgroup: CgroupStats = field(default_factory=CgroupStats)

    @property
    def ok(self) -> bool:
        return not (self.timed_out or self.output_limit or self.sandbox_failed) and self.exit_code == 0 and self.signal is None


def _user_tasks(uid: int) -> int:
    """Tasks (threads) the kernel counts against RLIMIT_NPROC for `uid` right now.

    Reads /proc/<pid>/status of every process on the host (~1 ms per 100 processes), so
    :meth:`Sandbox._nproc` calls it per run only when it is the sole bound on processes.
    """
    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                owner = threads = None
                for line in f:
                    if line.startswith("Uid:"):
                        owner = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
                        break
            if owner == uid and threads:
                n += threads
        except (OSError, ValueError):
            pass
    return n


def _clean_env(home: str, tmp: str, allow: Sequence[str]) -> Dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LC_ALL": "C", "LANG": "C"}
    for k in allow:
        if k in os.environ:
            env[k] = os.environ[k]
    return env


class Sandbox:
    """Runs commands in fresh scratch directories under the detected isolation layers.

    Fails closed: without a working bubblewrap the constructor raises
    :class:`SandboxUnavailable` (a one-line error saying how to install it) unless
    `allow_weak_isolation` is set (config ``reward.allow_weak_isolation``), which runs programs
    under ``unshare`` or with no namespaces at all, with a loud WARNING."""

    def __init__(self, isolation: Optional[Isolation] = None, env_allow: Sequence[str] = (),
                 scratch_root: Optional[str] = None, use_launcher: bool = True,
                 allow_weak_isolation: bool = False) -> None:
        self.iso = isolation or detect()
        if self.iso.wrapper != "bwrap":
            if not allow_weak_isolation:
                raise SandboxUnavailable(unavailable_message(self.iso))
            warn_weak(self.iso)
        self.allow_weak_isolation = allow_weak_isolation
        self.env_allow = list(env_allow)
        self.scratch_root = scratch_root
        self._system_binds = system_binds() if self.iso.wrapper == "bwrap" else []
        self.launcher = launcher.build(scratch_root) if use_launcher else None
        self._watched: Set[str] = set()  # foreign owners of leftovers that were alive at the last sweep
        self._last_sweep = 0.0
        self._tasks: Tuple[float, int] = (-1e9, 0)  # (monotonic time, count) of the last /proc scan
        self._retiring: List[RunCgroup] = []  # finished runs' cgroups whose last processes are exiting
        self._retire_cv = threading.Condition()
        self._retirer: Optional[threading.Thread] = None
        self._spare: Optional[_Launched] = None  # bwrap only: a launcher already attached, for the next run
        self._want_spare = self.launcher is not None and self.iso.wrapper == "bwrap"
        self._session_spare: Optional[_Launched] = None  # session.py: the next session's launcher
        self._python_ahead = None  # the python_tests verifier: the next harness run, set up and waiting in bwrap
        atexit.register(self.close)
        self.sweep_stale()
        self._restock()

    def sweep_stale(self) -> None:
        """Remove scratch dirs and cgroups of sandbox owners that died mid-run (a killed actor
        cannot clean up after itself; its replacement on the same node does).

        A replacement may start before its killed predecessor has exited; owners found alive
        are remembered and :meth:`_maybe_sweep` sweeps again as soon as one of them is gone.
        """
        root = Path(self.scratch_root or tempfile.gettempdir())
        me = str(os.getpid())
        alive: Set[str] = set()
        for d in root.glob("elastic-sbx-*"):
            owner = d.name.split("-")[2]
            if _pid_alive(owner):
                if owner != me:
                    alive.add(owner)
            else:
                shutil.rmtree(d, ignore_errors=True)
        if self.iso.cgroups is not None:
            alive |= self.iso.cgroups.sweep_stale() - {me}
        self._watched = alive
        self._last_sweep = time.monotonic()

    def retire(self, cg: RunCgroup) -> None:
        """Remove a finished run's cgroup now if it is empty, else from a background thread.

        After the wrapper is reaped, bwrap's init is often still exiting; waiting for it here
        would put a sleep on every run's critical path. Leftovers are SIGKILLed at once either way.
        """
        if cg.try_remove():
            return
        with self._retire_cv:
            self._retiring.append(cg)
            if self._retirer is None:
                self._retirer = threading.Thread(target=self._retire_loop, name="sandbox-cgroup-retirer", daemon=True)
                self._retirer.start()
            self._retire_cv.notify()

    def _retire_loop(self) -> None:
        pause = 0.0005
        while True:
            with self._retire_cv:
                while not self._retiring:
                    self._retire_cv.wait()
                    pause = 0.0005
                todo = list(self._retiring)
            done = [cg for cg in todo if cg.try_remove()]
            with self._retire_cv:
                self._retiring = [cg for cg in self._retiring if cg not in done]
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every finished run's cgroup is gone (tests, shutdown); True if so."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._retire_cv:
                if not self._retiring:
                    return True
            time.sleep(0.002)
        return False

    def _take_launched(self, env: Dict[str, str], cwd: str, want_log: bool) -> "_Launched":
        """A launcher for a new run: the spare (attached long ago, so no grace period to wait
        for) when it fits, else a fresh one. The spare is replaced at the next prepare."""
        if self.iso.wrapper == "bwrap" and not want_log:
            spare, self._spare = self._spare, None
            self._want_spare = True
            if spare is not None and spare.proc is not None and spare.proc.poll() is None and not spare.spawn_error:
                return spare
            if spare is not None:
                _discard(spare)
            return _Launched(self, env, "/", False)
        return _Launched(self, env, cwd, want_log)

    def _restock(self) -> None:
        """Spawn the next spare (after a run was released: off that run's critical path)."""
        if self._want_spare and self._spare is None:
            self._want_spare = False
            self._spare = _Launched(self, _clean_env(SANDBOX_DIR, "/tmp", self.env_allow), "/", False)

    def close(self) -> None:
        """Drop the spare launchers and wait for finished runs' cgroups to go (at exit)."""
        self._want_spare = False
        spare, self._spare = self._spare, None
        if spare is not None:
            _discard(spare)
        session_spare, self._session_spare = self._session_spare, None
        if session_spare is not None:
            _discard(session_spare)
        python_ahead, self._python_ahead = self._python_ahead, None
        if python_ahead is not None:
            python_ahead.cancel()
        self.flush(2.0)

    def _maybe_sweep(self) -> None:
        """Per run: a stat per remembered owner instead of listing /tmp and the cgroup dirs."""
        if (time.monotonic() - self._last_sweep > SWEEP_INTERVAL_S
                or any(not _pid_alive(p) for p in self._watched)):
            self.sweep_stale()

    @property
    def layers(self) -> Dict[str, object]:
        return self.iso.report()

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A fresh private (0700) scratch directory, removed afterwards whatever happened."""
        d = Path(tempfile.mkdtemp(prefix=f"elastic-sbx-{os.getpid()}-", dir=self.scratch_root))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    # -- command construction ------------------------------------------------------------
    def _wrap(self, argv: List[str], workdir: Path, limits: Limits, tmpfs_workdir: bool,
              status_fd: Optional[int], files: Optional[Dict[str, Path]] = None,
              block_fd: Optional[int] = None, as_pid_1: bool = False, readonly_root: bool = False) -> List[str]:
        """The wrapper command line. Under bwrap, `files` are exposed read-only through their
        directories (bound at /.files/<i>) and a symlink in the working dir, so they need to
        exist only when the program starts, not when bwrap sets up; with `block_fd` bwrap sets
        everything up, then waits for a byte on it before exec'ing the program.

        With `as_pid_1` the command is the PID namespace's init (``--as-pid-1``) instead of
        bwrap's own init, which keeps the command's stdin and stdout open and is dumpable (a
        program can open /proc/1/fd/0 and /proc/1/fd/1). With `readonly_root` nothing outside
        the tmpfs mounts /tmp, the working directory (`tmpfs_workdir`) and a fresh /dev/shm is
        writable: / and /dev are remounted read-only. /proc/sys is bound read-only in every run
        (bwrap's --proc leaves it writable, and the sandbox's uid 0 is the host's: without it a
        program can write the host's global sysctls, and the namespace's own ones)."""
        if self.iso.wrapper == "bwrap":
            size = str(limits.scratch_mb << 20)
            # /proc/sys read-only in every run: bwrap's --proc leaves it writable, and the
            # sandbox's uid 0 is the host's (a program could set the host's sysctls).
            w = ["bwrap", *BWRAP_BASE, *self._system_binds, "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
            w += ["--dev", "/dev"]
            if readonly_root:
                w += ["--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
            w += ["--size", size, "--tmpfs", "/tmp"]
            if tmpfs_workdir:
                w += ["--size", size, "--tmpfs", SANDBOX_DIR]
                if files is not None:
                    dirs: Dict[Path, str] = {}
                    links: List[str] = []
                    for name, path in sorted(files.items()):
                        mount = dirs.setdefault(path.parent, f"{FILES_DIR}/{len(dirs)}")
                        links += ["--symlink", f"{mount}/{path.name}", f"{SANDBOX_DIR}/{name}"]
                    for d, mount in dirs.items():
                        w += ["--ro-bind", str(d), mount]
                    w += links
                else:
                    for p in sorted(workdir.iterdir()):
                        w += ["--ro-bind", str(p), f"{SANDBOX_DIR}/{p.name}"]
            else:
                w += ["--bind", str(workdir), SANDBOX_DIR]
            if readonly_root:
                w += ["--remount-ro", "/"]  # last: the mount points above are made on the root tmpfs
            if as_pid_1:
                w.append("--as-pid-1")
            w += ["--chdir", SANDBOX_DIR]
            if status_fd is not None:
                w += ["--json-status-fd", str(status_fd)]
            if block_fd is not None:
                w += ["--block-fd", str(block_fd)]
            return w + ["--", *argv]
        if self.iso.wrapper == "unshare":
            return [*self.iso.unshare_prefix, "--", *argv]
        return list(argv)

    def _nproc(self, limits: Limits) -> int:
        """RLIMIT_NPROC: counted per real user, so a non-root limit is "tasks now + budget".

        Root ignores it (the pids cgroup is the bound). For a non-root user with a pids cgroup,
        a count at most USER_TASKS_TTL_S old plus USER_TASKS_SLACK is used (the cgroup enforces
        the exact budget); without one it is the only bound, so /proc is counted every run.
        """
        uid = os.getuid()
        if uid == 0:
            return limits.pids
        cg = self.iso.cgroups
        if cg is None or not cg.pids:
            return _user_tasks(uid) + limits.pids
        now = time.monotonic()
        if now - self._tasks[0] > USER_TASKS_TTL_S:
            self._tasks = (now, _user_tasks(uid))
        return self._tasks[1] + limits.pids + USER_TASKS_SLACK

    @staticmethod
    def _rlimits(limits: Limits, nproc: int) -> List[Tuple[int, int, int]]:
        """(resource, soft, hard) applied in the child before exec."""
        mem = (limits.memory_mb + 64) << 20  # slack: libc/libstdc++ mappings, the wrapper itself
        rl = [
            (resource.RLIMIT_CPU, limits.cpu_limit, limits.cpu_limit + 1),
            (resource.RLIMIT_FSIZE, limits.fsize_mb << 20, limits.fsize_mb << 20),
            (resource.RLIMIT_NPROC, nproc, nproc),
            (resource.RLIMIT_NOFILE, limits.nofile, limits.nofile),
            (resource.RLIMIT_CORE, 0, 0),
        ]
        if limits.address_space:
            rl.append((resource.RLIMIT_AS, mem, mem))
        return rl

    @staticmethod
    def _preexec(rlimits: List[Tuple[int, int, int]], cgroup: Optional[RunCgroup], cpu: Optional[int]):
        """The launcher's work done in Python (fallback when the launcher could not be built)."""
        procs_files = cgroup.procs_files() if cgroup is not None else []

        def fn() -> None:  # runs in the child between fork and exec: only syscalls here
            pid = str(os.getpid())
            for f in procs_files:
                with open(f, "w") as fh:
                    fh.write(pid)
            for res, soft, hard in rlimits:
                try:
                    resource.setrlimit(res, (soft, hard))
                except (ValueError, OSError):  # hard limit lower than ours: keep the lower one
                    _, cur_hard = resource.getrlimit(res)
                    resource.setrlimit(res, (min(soft, cur_hard) if cur_hard >= 0 else soft, cur_hard))
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
        return fn

    # -- running -------------------------------------------------------------------------
    def run(self, argv: List[str], workdir: Path, limits: Limits, stdin_path: Optional[Path] = None,
            cpu: Optional[int] = None, tmpfs_workdir: bool = False, want_log: bool = False,
            files: Optional[Dict[str, Path]] = None, as_pid_1: bool = False,
            readonly_root: bool = False) -> RunOutcome:
        """Run `argv` (relative paths resolve in the scratch dir) and return the raw outcome.

        With `tmpfs_workdir` under bwrap the program's working directory is a fresh size-limited
        tmpfs holding read-only binds of `files` (name -> host path), or of `workdir`'s entries.
        `as_pid_1` and `readonly_root` (bwrap only): see :meth:`_wrap`.

        With `want_log`, the literal ``{LOG_FD}`` in `argv` is replaced by the number of a pipe
        whose content is returned as ``RunOutcome.log`` (for valgrind/perf reports: valgrind
        moves its log fd out of the program's reach, so the program cannot forge the count).
        """
        return self.prepare(argv, workdir, limits, stdin_path, cpu, tmpfs_workdir, want_log, files,
                            setup_ahead=False, as_pid_1=as_pid_1, readonly_root=readonly_root).start()

    def prepare(self, argv: List[str], workdir: Path, limits: Limits, stdin_path: Optional[Path] = None,
                cpu: Optional[int] = None, tmpfs_workdir: bool = False, want_log: bool = False,
                files: Optional[Dict[str, Path]] = None, setup_ahead: bool = True, as_pid_1: bool = False,
                readonly_root: bool = False) -> "PreparedRun":
        """Launch a run now and start it later (arguments as for :meth:`run`).

        With the launcher, the process exists after this call: in its cgroup, limited, pinned.
        With `setup_ahead` under bwrap it goes on to set up its namespaces and mounts and waits
        in bwrap just before exec'ing the program; otherwise it waits in the launcher and
        bwrap's set-up happens after :meth:`PreparedRun.start`, inside the run's wall clock
        (what timed runs want: no set-up ever shares the core with a timed run). Files named
        in `files` need only exist at start. Without the launcher the spawn waits for start().
        """
        return PreparedRun(self, argv, workdir, limits, stdin_path, cpu, tmpfs_workdir, want_log, files, setup_ahead,
                           as_pid_1=as_pid_1, readonly_root=readonly_root)

    def _pump(self, proc: subprocess.Popen, out: RunOutcome, limits: Limits, t0: float,
              status_r: Optional[int], log_r: Optional[int], launch_r: Optional[int] = None) -> Tuple[str, str]:
        """Read all channels until the process exits and its pipes close, or a limit is hit.

        Returns (bwrap JSON status, launcher error line or "")."""
        sel = selectors.DefaultSelector()
        stdout_buf, stderr_buf, log_buf, status_buf = bytearray(), bytearray(), bytearray(), bytearray()
        launch_buf = bytearray()
        stderr_total = 0
        chans = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err"}  # type: ignore[union-attr]
        if status_r is not None:
            chans[status_r] = "status"
        if log_r is not None:
            chans[log_r] = "log"
        if launch_r is not None:
            chans[launch_r] = "launch"
        for fd in chans:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        pidfd = None
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):
            pass
        deadline = t0 + limits.wall_s
        exited_at: Optional[float] = None
        try:
            while True:
                now = time.perf_counter()
                if exited_at is None and pidfd is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and not any(c in ("out", "err") for c in chans.values()):
                    break
                if exited_at is not None and now > exited_at + 1.0:
                    break  # an escaped descendant holds the pipes: stop listening
                if now >= deadline:
                    if exited_at is None:
                        out.timed_out = True
                    break
                timeout = min(deadline - now, 0.05 if pidfd is None else 1.0)
                for key, _ in sel.select(timeout):
                    fd = key.fd
                    if fd == pidfd:
                        exited_at = time.perf_counter()
                        out.wall_s = exited_at - t0
                        sel.unregister(fd)
                        continue
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        if e.errno != errno.EIO:
                            raise
                        chunk = b""
                    kind = chans[fd]
                    if not chunk:
                        sel.unregister(fd)
                        del chans[fd]
                        continue
                    if kind == "out":
                        stdout_buf += chunk
                        if len(stdout_buf) > limits.stdout_bytes:
                            out.output_limit = True
                    elif kind == "err":
                        stderr_total += len(chunk)
                        if len(stderr_buf) < limits.stderr_keep_bytes:
                            stderr_buf += chunk[: limits.stderr_keep_bytes - len(stderr_buf)]
                        if stderr_total > limits.stderr_max_bytes:
                            out.output_limit = True
                    elif kind == "log":
                        if len(log_buf) < (1 << 20):
                            log_buf += chunk
                    elif kind == "launch":
                        launch_buf += chunk[:512]
                    else:
                        status_buf += chunk
                if out.output_limit:
                    break
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)
        # drain what is already buffered in status/log pipes (short, non-blocking)
        bufs = {"status": status_buf, "log": log_buf, "launch": launch_buf}
        for fd, kind in list(chans.items()):
            if kind in bufs:
                try:
                    while True:
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            break
                        bufs[kind].extend(chunk)
                except (BlockingIOError, OSError):
                    pass
        out.stdout = bytes(stdout_buf[: limits.stdout_bytes])
        out.stderr = bytes(stderr_buf)
        out.log = bytes(log_buf)
        return status_buf.decode(errors="replace"), launch_buf[:512].decode(errors="replace").strip()

    @staticmethod
    def _kill_group(pgid: int) -> None:
        """SIGKILL the whole session/process group (the cgroup is emptied after the reap)."""
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _discard(L: "_Launched") -> None:
    """Cancel an unused launcher: EOF on its message pipe, it exits without exec'ing."""
    for fd in L.fds:
        try:
            os.close(fd)
        except OSError:
            pass
    L.fds.clear()
    if L.proc is not None:
        reap_cancelled(L.proc)
    if L.cg is not None:
        L.cg.remove()


def reap_cancelled(proc: subprocess.Popen) -> None:
    """Reap a launcher whose message pipe was closed (it exits at once) and close its pipes."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


class _Launched:
    """A launcher process: attached to its fresh cgroup, waiting for its message (launcher.py).

    With `session` it is the launcher of a sandbox session (session.py): its stdin is a pipe
    (the runner's job channel) and bwrap gets no status or block fd."""

    def __init__(self, sb: Sandbox, env: Dict[str, str], cwd: str, want_log: bool, session: bool = False) -> None:
        self.cg: Optional[RunCgroup] = None
        self.proc: Optional[subprocess.Popen] = None
        self.fds: List[int] = []  # parent-side ends, closed by the owner
        self.spawn_error = ""
        child: List[int] = []

        def pipe() -> Tuple[int, int]:
            r, w = os.pipe()
            self.fds.append(r)
            child.append(w)
            return r, w
        factory = sb.iso.cgroups
        if factory is not None and (factory.pids or factory.memory):
            try:
                self.cg = factory.create(64, 256 << 20)  # real limits are written when the run is known
            except OSError as e:
                log.warning("SANDBOX WARNING: could not create a run cgroup (%s); running without one", e)
        self.status_r = self.status_w = self.log_r = self.log_w = self.block_w = None
        self.block_r: Optional[int] = None
        self.launch_r: Optional[int] = None
        self.msg_w: Optional[int] = None
        try:
            self.launch_r, launch_w = pipe()
            msg_r, self.msg_w = os.pipe()
            self.fds.append(self.msg_w)
            child.append(msg_r)
            if sb.iso.wrapper == "bwrap" and not session:
                self.status_r, self.status_w = pipe()
                self.block_r, self.block_w = os.pipe()
                self.fds.append(self.block_w)
                child.append(self.block_r)
            if want_log:
                self.log_r, self.log_w = pipe()
            procs = self.cg.procs_files() if self.cg is not None else []
            assert sb.launcher is not None
            try:
                self.proc = subprocess.Popen(
                    launcher.argv(sb.launcher, launch_w, msg_r, procs, self.block_r),
                    stdin=subprocess.PIPE if session else subprocess.DEVNULL, bufsize=0 if session else -1,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True,
                    pass_fds=tuple(child), close_fds=True)
            except OSError as e:
                self.spawn_error = f"spawn failed: {e}"
        finally:
            for fd in child:
                os.close(fd)

    def send(self, msg: bytes) -> None:
        """Hand the launcher its command (it execs once the pipe closes)."""
        if self.msg_w is None:
            return
        try:
            os.write(self.msg_w, msg)  # one page or two: the pipe buffer holds it
        except OSError:  # the launcher already failed; its report is on the launch pipe
            pass
        self._close_msg()

    def _close_msg(self) -> None:
        if self.msg_w is not None:
            os.close(self.msg_w)
            self.fds.remove(self.msg_w)
            self.msg_w = None


class PreparedRun:
    """One sandboxed command, launched by :meth:`Sandbox.prepare` and run by :meth:`start`.

    Call exactly one of :meth:`start` (returns the RunOutcome) or :meth:`cancel` (the program
    never runs); as a context manager, leaving the block cancels a run that was never started.
    Either way pipes, processes and the run's cgroup are cleaned up.
    """

    def __init__(self, sb: Sandbox, argv: List[str], workdir: Path, limits: Limits, stdin_path: Optional[Path],
                 cpu: Optional[int], tmpfs_workdir: bool, want_log: bool, files: Optional[Dict[str, Path]],
                 setup_ahead: bool = True, as_pid_1: bool = False, readonly_root: bool = False) -> None:
        self.sb, self.limits = sb, limits
        self._wrap_opts = {"as_pid_1": as_pid_1, "readonly_root": readonly_root}
        self.out = RunOutcome()
        self.cg: Optional[RunCgroup] = None
        self.proc: Optional[subprocess.Popen] = None
        self.pipes: List[int] = []  # parent-side fds to close at the end
        self.status_r = self.log_r = self.launch_r = None
        self.launched: Optional[_Launched] = None
        self.blocked_in_bwrap = False
        self._message = b""
        self._early_report = ""
        self._child_fds: List[int] = []  # preexec fallback: the child's ends until it is spawned
        self.done = False
        sb._maybe_sweep()
        rlimits = sb._rlimits(limits, sb._nproc(limits))
        in_ns = sb.iso.wrapper == "bwrap"
        env = _clean_env(SANDBOX_DIR if in_ns else str(workdir), "/tmp" if in_ns else str(workdir), sb.env_allow)
        memory = (limits.memory_mb + limits.scratch_mb * 2 + 64) << 20
        try:
            if sb.launcher is None:  # fallback: fork + preexec_fn, spawned at start()
                self._prepare_preexec(argv, workdir, limits, stdin_path, cpu, tmpfs_workdir, want_log, files,
                                      rlimits, env, memory)
                return
            L = sb._take_launched(env, str(workdir), want_log)
            self.launched, self.proc, self.cg = L, L.proc, L.cg
            self.pipes = L.fds  # one list: whoever closes an fd removes it
            self.status_r, self.log_r, self.launch_r = L.status_r, L.log_r, L.launch_r
            if L.spawn_error:
                self.out.sandbox_failed, self.out.sandbox_error = True, L.spawn_error
                return
            if self.cg is not None:
                try:
                    self.cg.set_limits(limits.pids, memory)
                except OSError as e:
                    self.out.sandbox_failed, self.out.sandbox_error = True, f"cgroup limits: {e}"
                    return
            # Under bwrap with `setup_ahead` the start byte goes to bwrap itself (--block-fd):
            # namespaces and mounts are set up now. Safe because the launcher applies cgroup,
            # rlimits and pinning before bwrap: an early EOF (a dying parent) could only start a
            # fully confined program, which --die-with-parent then kills.
            self.blocked_in_bwrap = in_ns and setup_ahead
            wrapped = sb._wrap(argv, workdir, limits, tmpfs_workdir, L.status_w, files,
                               block_fd=L.block_r if self.blocked_in_bwrap else None, **self._wrap_opts)
            wrapped = [a.replace("{LOG_FD}", str(L.log_w)) for a in wrapped]
            self._message = launcher.message(wrapped, rlimits, cpu, str(stdin_path) if stdin_path else None,
                                             keep_block_fd=self.blocked_in_bwrap)
            if self.blocked_in_bwrap:
                L.send(self._message)
        except BaseException:
            self._cleanup()
            raise

    def _prepare_preexec(self, argv, workdir, limits, stdin_path, cpu, tmpfs_workdir, want_log, files, rlimits, env,
                         memory) -> None:
        sb = self.sb
        factory = sb.iso.cgroups
        if factory is not None and (factory.pids or factory.memory):
            try:
                self.cg = factory.create(limits.pids, memory)
            except OSError as e:
                log.warning("SANDBOX WARNING: could not create a run cgroup (%s); running without one", e)
        child: List[int] = []
        status_w = log_w = None
        if sb.iso.wrapper == "bwrap":
            self.status_r, status_w = os.pipe()
            self.pipes.append(self.status_r)
            child.append(status_w)
        if want_log:
            self.log_r, log_w = os.pipe()
            self.pipes.append(self.log_r)
            child.append(log_w)
        wrapped = sb._wrap(argv, workdir, limits, tmpfs_workdir, status_w, files, **self._wrap_opts)
        wrapped = [a.replace("{LOG_FD}", str(log_w)) for a in wrapped]

        def spawn() -> None:
            stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL
            try:
                self.proc = subprocess.Popen(
                    wrapped, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(workdir), env=env,
                    start_new_session=True, pass_fds=tuple(child), close_fds=True,
                    preexec_fn=Sandbox._preexec(rlimits, self.cg, cpu))
            except OSError as e:
                self.out.sandbox_failed, self.out.sandbox_error = True, f"spawn failed: {e}"
            finally:
                if stdin is not subprocess.DEVNULL:
                    stdin.close()
                for fd in child:
                    os.close(fd)
                child.clear()
        self._spawn_later = spawn
        self._child_fds = child  # closed by spawn(), or by _cleanup() if it never runs

    def start(self) -> RunOutcome:
        """Run to completion (or to a limit) and return the raw outcome."""
        self.release()
        return self.finish()

    def release(self) -> None:
        """Let the program start (its wall clock starts here); :meth:`finish` collects it.
        Between the two, output waits in the pipes (a program blocks once they are full)."""
        assert not self.done and not hasattr(self, "_t0"), "a prepared run starts once"
        try:
            L = self.launched
            if L is not None and not self.out.sandbox_failed:
                if self.blocked_in_bwrap:
                    self._t0 = time.perf_counter()
                    try:
                        os.write(L.block_w, b"g")
                    except OSError:  # bwrap already failed; its report is on the status pipe and stderr
                        pass
                else:
                    self._await_ready()  # the clock starts after the launcher's cgroup attach
                    self._t0 = time.perf_counter()
                    L.send(self._message)
            else:
                self._t0 = time.perf_counter()
                if self.proc is None and not self.out.sandbox_failed:
                    self._spawn_later()
            self.sb._restock()
        except BaseException:
            self.cancel()
            raise

    def finish(self) -> RunOutcome:
        """Wait for the released program (limits enforced from its release) and clean up."""
        assert hasattr(self, "_t0") and not self.done, "finish() follows release()"
        out, limits, t0 = self.out, self.limits, self._t0
        try:
            proc = self.proc
            if proc is None or out.sandbox_failed:
                return out
            status, report = self.sb._pump(proc, out, limits, t0, self.status_r, self.log_r, self.launch_r)
            report = self._early_report + report
            if report.startswith(launcher.READY_MARK.decode()):
                report = report[len(launcher.READY_MARK):]
            report = report.strip()
            Sandbox._kill_group(proc.pid)
            # Reap first: a cgroup emptied before this would still hold the exiting wrapper.
            _, wstatus, ru = os.wait4(proc.pid, 0)
            proc.returncode = 0  # reaped here; keep Popen from waiting again
            if not out.wall_s:
                out.wall_s = time.perf_counter() - t0
            out.cpu_s = ru.ru_utime + ru.ru_stime
            out.max_rss_kb = ru.ru_maxrss
            code = None if os.WIFSIGNALED(wstatus) else os.WEXITSTATUS(wstatus)
            if report:
                out.sandbox_failed, out.sandbox_error = True, report
            elif code is None:
                out.signal = os.WTERMSIG(wstatus)
            elif self.sb.iso.wrapper == "bwrap" and "child-pid" not in status:
                out.sandbox_failed = True
                out.sandbox_error = "bwrap setup failed: " + out.stderr.decode(errors="replace").strip()[-500:]
            elif self.sb.iso.wrapper and 128 < code <= 128 + 64:  # wrappers report a signal death as 128+n
                out.signal = code - 128
            else:
                out.exit_code = code
            if out.signal in (signal.SIGXCPU,) or (out.signal == signal.SIGKILL and out.cpu_s >= limits.cpu_limit - 0.05):
                out.timed_out = True
            return out
        finally:
            self._cleanup()

    def _await_ready(self, timeout_s: float = 30.0) -> None:
        """Consume the launcher's ready mark (or whatever it reported instead, kept for later)."""
        fd = self.launch_r
        if fd is None:
            return
        deadline = time.monotonic() + timeout_s
        got = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 512)
            if not chunk:
                break
            got += chunk
            if got.startswith(launcher.READY_MARK):
                got = got[len(launcher.READY_MARK):]
                break
        self._early_report = got.decode(errors="replace")

    def cancel(self) -> None:
        """Abort a run that was never started; its program never runs.

        A launcher still waiting for its message just gets EOF (it then exits). Once bwrap
        waits on its block fd, EOF there means "go": so everything is killed and the wrapper
        reaped *before* any pipe closes."""
        if self.done:
            return
        try:
            if self.proc is not None:
                Sandbox._kill_group(self.proc.pid)
                if self.cg is not None:
                    self.cg.kill_all()
                os.wait4(self.proc.pid, 0)  # its exit SIGKILLs bwrap's child (--die-with-parent)
                self.proc.returncode = 0
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self.done:
            return
        self.done = True
        for fd in self.pipes + self._child_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pipes.clear()
        if self.launched is not None:
            self.launched.msg_w = None
        if self.proc is not None:
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()
        if self.cg is not None:
            self.out.cgroup = self.cg.stats()  # final: the program is dead, or killed and unable to run
            self.sb.retire(self.cg)  # anything left (escapees without a PID namespace) is SIGKILLed

    def __enter__(self) -> "PreparedRun":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()
