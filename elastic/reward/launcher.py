"""A tiny trusted exec shim that applies a run's cgroups, rlimits and CPU pinning.

Why it exists: ``subprocess.Popen(preexec_fn=...)`` forces a real ``fork()`` of the calling
process, and a Ray actor is a large, multi-threaded Python process: copying its page tables
and running Python in the child cost 3-6 ms per sandboxed run (measured in a pool actor;
see bench/reward_throughput.py --profile). Without ``preexec_fn`` CPython spawns with
``vfork()`` (~0.8 ms). The shim then does, in its own process and before ``execvp``, exactly
what the ``preexec_fn`` did: write its pid into the run's ``cgroup.procs`` files, set every
rlimit, pin itself to one core. Its successor (bwrap, unshare, or the program) inherits all
of it, so no untrusted instruction ever runs outside the limits, and nothing is racy: the
parent never has to attach a process that is already running.

Failure is reported on a dedicated pipe (``-e FD``), never by exit code or stderr, which a
program could forge: the shim writes one line there and exits 125; on success the fd is
close-on-exec, so the program never sees it and the parent reads EOF.

With ``-w FD`` the shim, once attached and limited, writes ``+`` on the report pipe (so a
timed run's clock can start after the attach), then waits for one byte on FD before it
execs, and exits (never execs) on EOF. The sandbox uses this to launch a run ahead of time
(:meth:`elastic.reward.sandbox.Sandbox.prepare`): in cgroup v1 a ``cgroup.procs`` write waits
for an RCU grace period (~12 ms here) unless another attach happened just before, so the
evaluator launches all of a program's test runs back to back before compiling, and starts
each when its turn comes. Since the wait is in our own code, a parent that dies releases
nothing: EOF aborts.

The source is compiled once per process into a private (0700) temporary directory; if gcc
is missing the sandbox falls back to ``preexec_fn`` (same layers, slower spawn).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from typing import List, Optional, Sequence, Tuple

log = logging.getLogger("elastic.reward")

SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int errfd = -1;
static int waitfd = -1;

static void fail(const char *what, const char *arg) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "launcher: %s %s: %s\n", what, arg, strerror(errno));
    if (errfd >= 0 && n > 0) { ssize_t w = write(errfd, buf, (size_t)n); (void)w; }
    _exit(125);
}

int main(int argc, char **argv) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *opt = argv[i];
        if (i + 1 >= argc) { errno = EINVAL; fail("missing value for", opt); }
        const char *val = argv[++i];
        if (!strcmp(opt, "-e")) {
            errfd = atoi(val);
            if (fcntl(errfd, F_SETFD, FD_CLOEXEC) != 0) fail("fcntl", val);
        } else if (!strcmp(opt, "-g")) {
            int fd = open(val, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, pid, (size_t)n) != n) fail("cgroup attach", val);
            close(fd);
        } else if (!strcmp(opt, "-r")) {
            int res; unsigned long long soft, hard;
            if (sscanf(val, "%d:%llu:%llu", &res, &soft, &hard) != 3) { errno = EINVAL; fail("rlimit", val); }
            struct rlimit rl = { (rlim_t)soft, (rlim_t)hard };
            if (setrlimit(res, &rl) != 0) {
                /* hard limit lower than ours: keep the lower one */
                struct rlimit cur;
                if (getrlimit(res, &cur) != 0) fail("getrlimit", val);
                rl.rlim_max = cur.rlim_max;
                rl.rlim_cur = (rlim_t)soft < cur.rlim_max ? (rlim_t)soft : cur.rlim_max;
                if (setrlimit(res, &rl) != 0) fail("setrlimit", val);
            }
        } else if (!strcmp(opt, "-w")) {
            waitfd = atoi(val);
            if (fcntl(waitfd, F_SETFD, FD_CLOEXEC) != 0) fail("fcntl", val);
        } else if (!strcmp(opt, "-c")) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(atoi(val), &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0) fail("sched_setaffinity", val);
        } else {
            errno = EINVAL; fail("unknown option", opt);
        }
    }
    if (i + 1 >= argc) { errno = EINVAL; fail("no command after", "--"); }
    if (waitfd >= 0) {
        char go;
        ssize_t r;
        if (errfd >= 0 && write(errfd, "+", 1) != 1) fail("write", "ready mark");  /* attached and limited */
        do { r = read(waitfd, &go, 1); } while (r < 0 && errno == EINTR);
        if (r != 1) { errno = ECANCELED; fail("start", "not signalled"); }
    }
    execvp(argv[i + 1], argv + i + 1);
    fail("exec", argv[i + 1]);
    return 125;
}
"""

EXIT_LAUNCHER_FAILED = 125
READY_MARK = b"+"
_BUILT: Optional[str] = None
_TRIED = False


def _sweep_dead_builds(root: str) -> None:
    """Remove launcher builds of processes that died without running atexit (killed actors)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if name.startswith("elastic-launcher-"):
            owner = name.split("-")[2]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def build(scratch_root: Optional[str] = None) -> Optional[str]:
    """Path of this process's compiled shim, building it on first use; None if gcc fails."""
    global _BUILT, _TRIED
    if _TRIED:
        return _BUILT
    _TRIED = True
    root = scratch_root or tempfile.gettempdir()
    _sweep_dead_builds(root)
    tag = hashlib.sha256(SOURCE.encode()).hexdigest()[:8]
    d = tempfile.mkdtemp(prefix=f"elastic-launcher-{os.getpid()}-{tag}-", dir=root)  # 0700, ours
    atexit.register(shutil.rmtree, d, True)
    src, exe = os.path.join(d, "launcher.c"), os.path.join(d, "launcher")
    with open(src, "w") as f:
        f.write(SOURCE)
    try:
        r = subprocess.run(["gcc", "-O2", "-o", exe, src], capture_output=True, timeout=60,
                           env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"})
        ok = r.returncode == 0 and os.path.isfile(exe)
        why = r.stderr.decode(errors="replace").strip()[-300:]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    if not ok:
        log.warning("sandbox launcher could not be built (%s); spawning with preexec_fn (same limits, "
                    "slower fork)", why)
        return None
    _BUILT = exe
    return exe


def argv(exe: str, err_fd: int, cgroup_procs: Sequence[str], rlimits: Sequence[Tuple[int, int, int]],
         cpu: Optional[int], wait_fd: Optional[int] = None) -> List[str]:
    """The shim's command-line prefix; append the command to run."""
    out = [exe, "-e", str(err_fd)]
    if wait_fd is not None:
        out += ["-w", str(wait_fd)]
    for f in cgroup_procs:
        out += ["-g", f]
    for res, soft, hard in rlimits:
        out += ["-r", f"{res}:{_unsigned(soft)}:{_unsigned(hard)}"]
    if cpu is not None:
        out += ["-c", str(cpu)]
    return out + ["--"]


def _unsigned(v: int) -> int:
    """RLIM_INFINITY is -1 in Python's resource module and all-ones in C."""
    return (1 << 64) - 1 if v < 0 else v
