"""A tiny trusted exec shim that applies a run's cgroups, rlimits and CPU pinning.

Why it exists: ``subprocess.Popen(preexec_fn=...)`` forces a real ``fork()`` of the calling
process, and a Ray actor is a large, multi-threaded Python process: copying its page tables
and running Python in the child cost 3-6 ms per sandboxed run (bench/reward_profile.py).
Without ``preexec_fn`` CPython spawns with ``vfork()``. The shim then does, in its own
process and before ``execvp``, what the ``preexec_fn`` did; its successor (bwrap, unshare or
the program) inherits all of it, so no untrusted instruction runs outside the limits.

Two steps. Spawned as ``launcher -e REPORT -m MSG [-B BLOCK] -g <cgroup.procs>...``, it
writes its pid into the run's cgroups, writes ``+`` on REPORT, then reads a message from
MSG until EOF: NUL-separated ``-r RES:SOFT:HARD``, ``-c CPU``, ``-i STDIN``, ``-b`` (let bwrap
inherit BLOCK for ``--block-fd``), ``--`` and the command. It applies them and execs. An
empty message (EOF: cancelled, or the parent died) runs nothing.

Why two steps: in cgroup v1 a ``cgroup.procs`` write waits for an RCU grace period (~10 ms
here, more under load) unless another attach happened just before. The sandbox keeps a
spare shim, already attached to a fresh cgroup, for the next run (the compile), and launches
a program's other runs before compiling, so no run waits for a grace period when it starts;
a timed run's clock starts after ``+``.

Failure is reported on REPORT, never by exit code or stderr, which a program could forge:
the shim writes one line there and exits 125; on exec REPORT closes (close-on-exec).

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
from typing import Dict, List, Optional, Sequence, Tuple

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

#define MAX_MESSAGE (1 << 20)
#define MAX_TOKENS 4096

static int errfd = -1, msgfd = -1, blockfd = -1;

static void fail(const char *what, const char *arg) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "launcher: %s %s: %s\n", what, arg, strerror(errno));
    if (errfd >= 0 && n > 0) { ssize_t w = write(errfd, buf, (size_t)n); (void)w; }
    _exit(125);
}

static void cloexec(int fd, const char *val) {
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) fail("fcntl", val);
}

/* Options; returns the index of "--" (or argc). Spawn-time: -e -m -B -g. Message: -r -c -i -b. */
static int parse(int argc, char **argv, int message) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *opt = argv[i];
        if (message && !strcmp(opt, "-b")) {  /* bwrap will wait on the block fd: let it inherit it */
            if (blockfd < 0 || fcntl(blockfd, F_SETFD, 0) != 0) fail("keep block fd", "");
            continue;
        }
        if (i + 1 >= argc) { errno = EINVAL; fail("missing value for", opt); }
        const char *val = argv[++i];
        if (!message && !strcmp(opt, "-e")) {
            errfd = atoi(val); cloexec(errfd, val);
        } else if (!message && !strcmp(opt, "-m")) {
            msgfd = atoi(val); cloexec(msgfd, val);
        } else if (!message && !strcmp(opt, "-B")) {
            blockfd = atoi(val); cloexec(blockfd, val);
        } else if (!message && !strcmp(opt, "-g")) {
            int fd = open(val, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, pid, (size_t)n) != n) fail("cgroup attach", val);
            close(fd);
        } else if (message && !strcmp(opt, "-r")) {
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
        } else if (message && !strcmp(opt, "-c")) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(atoi(val), &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0) fail("sched_setaffinity", val);
        } else if (message && !strcmp(opt, "-i")) {
            int fd = open(val, O_RDONLY | O_CLOEXEC);
            if (fd < 0 || dup2(fd, 0) != 0) fail("stdin", val);
            close(fd);
        } else {
            errno = EINVAL; fail("unknown option", opt);
        }
    }
    return i;
}

int main(int argc, char **argv) {
    parse(argc - 1, argv + 1, 0);
    if (msgfd < 0) { errno = EINVAL; fail("no message fd", "(-m)"); }
    if (errfd >= 0 && write(errfd, "+", 1) != 1) fail("write", "ready mark");  /* attached */
    char *buf = malloc(MAX_MESSAGE + 1);
    size_t len = 0;
    if (!buf) fail("malloc", "");
    for (;;) {
        ssize_t r = read(msgfd, buf + len, MAX_MESSAGE - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("read", "message");
        if (r == 0) break;
        len += (size_t)r;
        if (len == MAX_MESSAGE) { errno = E2BIG; fail("message", "too long"); }
    }
    if (len == 0) _exit(125);  /* cancelled: nothing is run */
    buf[len] = 0;
    static char *tok[MAX_TOKENS + 1];
    int ntok = 0;
    for (size_t at = 0; at < len; at += strlen(buf + at) + 1) {
        if (ntok == MAX_TOKENS) { errno = E2BIG; fail("message", "too many arguments"); }
        tok[ntok++] = buf + at;
    }
    tok[ntok] = NULL;
    int dash = parse(ntok, tok, 1);
    if (dash + 1 >= ntok) { errno = EINVAL; fail("no command after", "--"); }
    execvp(tok[dash + 1], tok + dash + 1);
    fail("exec", tok[dash + 1]);
    return 125;
}
"""

EXIT_LAUNCHER_FAILED = 125
READY_MARK = b"+"


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


_BUILDS: Dict[str, Optional[str]] = {}  # helper name -> its path in this process (None: gcc failed)


def build(scratch_root: Optional[str] = None) -> Optional[str]:
    """Path of this process's compiled shim, building it on first use; None if gcc fails
    (the sandbox then spawns with preexec_fn: same limits, slower fork)."""
    return _build_once("launcher", SOURCE, scratch_root)


def build_runner(scratch_root: Optional[str] = None) -> Optional[str]:
    """Path of this process's compiled in-sandbox runner (:mod:`elastic.sandbox.runner_source`),
    built on first use; None if gcc fails (each process then gets its own sandbox, slower)."""
    from elastic.sandbox.runner_source import SOURCE as RUNNER_SOURCE

    return _build_once("runner", RUNNER_SOURCE, scratch_root)


def _build_once(name: str, source: str, scratch_root: Optional[str]) -> Optional[str]:
    if name not in _BUILDS:
        _BUILDS[name] = _compile(name, source, scratch_root)
        if _BUILDS[name] is None:
            log.warning("sandbox %s could not be built: the sandbox falls back to a slower path", name)
    return _BUILDS[name]


def _compile(name: str, source: str, scratch_root: Optional[str]) -> Optional[str]:
    """Compile a trusted helper into a private (0700) directory removed at exit."""
    root = scratch_root or tempfile.gettempdir()
    _sweep_dead_builds(root)
    tag = hashlib.sha256(source.encode()).hexdigest()[:8]
    d = tempfile.mkdtemp(prefix=f"elastic-launcher-{os.getpid()}-{tag}-", dir=root)  # 0700, ours
    atexit.register(shutil.rmtree, d, True)
    src, exe = os.path.join(d, f"{name}.c"), os.path.join(d, name)
    with open(src, "w") as f:
        f.write(source)
    try:
        r = subprocess.run(["gcc", "-O2", "-o", exe, src], capture_output=True, timeout=60,
                           env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"})
        ok = r.returncode == 0 and os.path.isfile(exe)
        why = r.stderr.decode(errors="replace").strip()[-300:]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    if not ok:
        log.warning("building %s failed: %s", name, why)
        return None
    os.remove(src)
    return exe


def argv(exe: str, err_fd: int, msg_fd: int, cgroup_procs: Sequence[str], block_fd: Optional[int] = None) -> List[str]:
    """The command line that spawns the shim: attached to `cgroup_procs`, then waiting for
    its message on `msg_fd`."""
    out = [exe, "-e", str(err_fd), "-m", str(msg_fd)]
    if block_fd is not None:
        out += ["-B", str(block_fd)]
    for f in cgroup_procs:
        out += ["-g", f]
    return out


def message(command: Sequence[str], rlimits: Sequence[Tuple[int, int, int]], cpu: Optional[int],
            stdin_path: Optional[str] = None, keep_block_fd: bool = False) -> bytes:
    """What the shim applies, then execs: rlimits, CPU pin, stdin, the command."""
    toks: List[str] = []
    for res, soft, hard in rlimits:
        toks += ["-r", f"{res}:{_unsigned(soft)}:{_unsigned(hard)}"]
    if cpu is not None:
        toks += ["-c", str(cpu)]
    if stdin_path is not None:
        toks += ["-i", stdin_path]
    if keep_block_fd:
        toks.append("-b")
    toks += ["--", *command]
    return b"".join(t.encode(errors="surrogateescape") + b"\0" for t in toks)


def _unsigned(v: int) -> int:
    """RLIM_INFINITY is -1 in Python's resource module and all-ones in C."""
    return (1 << 64) - 1 if v < 0 else v
