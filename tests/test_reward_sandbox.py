"""Hostile programs are contained and classified, and the host is fine afterwards.

Every program here runs through the real evaluator and sandbox on the `pair-sum` fixture.
Programs that probe a boundary (network, environment, filesystem, parent) solve the problem
correctly when the boundary holds, so `ok` means "contained" and the test also checks the
host side (no connection accepted, no file written).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import uuid

import pytest

from elastic.reward import evaluate, load_problem
from elastic.sandbox.isolation import detect
from tests.reward_helpers import (FIXTURES, fast_settings, leftover_cgroups, leftover_programs, leftover_scratch,
                                  wait_until)

SOLVE = r"""
#include <stdio.h>
#include <stdlib.h>
static void solve(void) {
    int n, k; if (scanf("%d %d", &n, &k) != 2) exit(1);
    long long *cnt = calloc(k, sizeof(long long)), count = 0;
    for (int i = 0; i < n; i++) { long long x; scanf("%lld", &x); int r = (int)(x % k); count += cnt[(k - r) % k]; cnt[r]++; }
    printf("%lld\n", count);
}
"""


@pytest.fixture(scope="module")
def problem():
    return load_problem(FIXTURES / "pair-sum")


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return fast_settings(tmp_path_factory.mktemp("reward-cache"), compile_time_limit_s=10.0)


def run(problem, settings, src, lang="c"):
    return evaluate(problem, src, lang, settings)


def test_layers_detected_and_reported():
    rep = detect().report()
    for k in ("process_group", "rlimits", "clean_env", "scratch_dir", "net_namespace", "pid_namespace",
              "cgroup_pids", "cgroup_memory", "cpu_pinning"):
        assert k in rep
    assert rep["net_namespace"], "no network namespace: CI must have bubblewrap or unshare"


@pytest.mark.parametrize("name,src,expected", [
    ("fork_bomb", "#include <unistd.h>\nint main(void){ for(;;) fork(); }", {"timeout"}),
    ("infinite_loop", "int main(void){ volatile unsigned long x = 0; for(;;) x++; }", {"timeout"}),
    ("ignores_sigterm", "#include <signal.h>\nint main(void){ signal(SIGTERM, SIG_IGN); signal(SIGXCPU, SIG_IGN);"
                        " signal(SIGINT, SIG_IGN); volatile int x = 0; for(;;) x++; }", {"timeout"}),
    ("sleeper", "#include <unistd.h>\nint main(void){ for(;;) pause(); }", {"timeout"}),
    ("memory_bomb", "#include <stdlib.h>\n#include <string.h>\nint main(void){ for(;;){ char *p = malloc(1<<20);"
                    " memset(p, 1, 1<<20); } }", {"memory_limit"}),
    ("disk_filler", "#include <stdio.h>\nint main(void){ static char b[1<<16]; FILE *f = fopen(\"fill\", \"w\");"
                    " for(;;) fwrite(b, 1, sizeof b, f); }", {"runtime_error"}),
    ("output_flood", "#include <stdio.h>\nint main(void){ for(;;) puts(\"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\"); }",
     {"runtime_error"}),
    ("daemonizes", "#include <unistd.h>\n" + "int main(void){ if (fork() == 0) { setsid(); for(;;) sleep(1); } return 0; }",
     {"wrong_answer"}),
])
def test_hostile_program_contained(problem, settings, name, src, expected):
    if name == "memory_bomb":  # a small limit: page faults are slow on a loaded VM, keep it under the clock
        problem = dataclasses.replace(problem, memory_limit_mb=64)
    r = run(problem, settings, src)
    assert r.status in expected, (name, r.status, r.reason)
    assert r.reward == settings.failure_reward
    if name == "output_flood":
        assert "output limit" in r.reason
    assert wait_until(lambda: leftover_programs() == [], 10), leftover_programs()


def test_network_is_unreachable(problem, settings):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    got = []

    def accept():
        try:
            got.append(srv.accept())
        except OSError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    src = SOLVE + f"""
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>
int main(void) {{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {{0}}; a.sin_family = AF_INET; a.sin_port = htons({port});
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {{ puts("CONNECTED"); return 0; }}
    solve(); return 0;
}}"""
    r = run(problem, settings, src)
    th.join()
    srv.close()
    assert got == [], "the sandboxed program reached a listener on the host"
    assert r.status == "ok", r.reason


def test_parent_environment_is_not_inherited(problem, settings, monkeypatch):
    monkeypatch.setenv("ELASTIC_TEST_SECRET", "hunter2")
    src = SOLVE + r"""
int main(void) { const char *s = getenv("ELASTIC_TEST_SECRET"); if (s) { puts(s); return 0; } solve(); return 0; }"""
    r = run(problem, settings, src)
    assert r.status == "ok", r.reason


def test_cannot_write_outside_scratch(problem, settings, tmp_path):
    targets = [tmp_path / "escape.txt", f"/tmp/elastic-escape-{uuid.uuid4().hex}", str(FIXTURES / "escape.txt")]
    writes = "".join(f'{{ FILE *f = fopen("{t}", "w"); if (f) {{ fputs("x", f); fclose(f); }} }}\n' for t in targets)
    src = SOLVE + f"int main(void) {{\n{writes} solve(); return 0; }}"
    r = run(problem, settings, src)
    assert r.status == "ok", r.reason
    for t in targets:
        assert not os.path.exists(t), f"sandboxed program wrote {t}"


@pytest.mark.skipif(detect().wrapper != "bwrap", reason="needs bubblewrap")
def test_host_sysctls_are_read_only(problem, settings):
    """/proc/sys is read-only in every sandboxed run (bwrap's --proc leaves it writable, and the
    sandbox's uid 0 is the host's): writing vm.swappiness back with its own value (harmless
    if it went through) must fail, or the program answers wrong on purpose."""
    src = SOLVE + r"""
int main(void) {
    char v[32] = {0}; FILE *f = fopen("/proc/sys/vm/swappiness", "r");
    if (f) { if (!fgets(v, sizeof v, f)) v[0] = 0; fclose(f); }
    f = fopen("/proc/sys/vm/swappiness", "w");
    if (f) { int ok = fputs(v, f) >= 0; ok = (fclose(f) == 0) && ok; if (ok && v[0]) { puts("-1"); return 0; } }
    solve(); return 0; }"""
    r = run(problem, settings, src)
    assert r.status == "ok", r.reason


@pytest.mark.skipif(not detect().pid_namespace, reason="no PID namespace here: a program could kill the test runner")
def test_killing_parent_and_everyone_is_contained(problem, settings):
    src = SOLVE + r"""
#include <signal.h>
#include <unistd.h>
int main(void) { kill(getppid(), SIGKILL); kill(-1, SIGKILL); solve(); return 0; }"""
    r = run(problem, settings, src)
    assert r.status in ("ok", "runtime_error", "wrong_answer"), r.reason
    assert r.status != "sandbox_error"


@pytest.mark.parametrize("lang,src", [
    ("c", '#include "/dev/zero"\nint main(void){return 0;}'),
    ("cpp", "template<int N, int K> struct B { static const long v = B<N-1, 2*K>::v + B<N-1, 2*K+1>::v; };\n"
            "template<int K> struct B<0, K> { static const long v = K; };\n"
            "int main() { return (int)B<26, 0>::v; }"),
])
def test_compile_time_bomb(problem, settings, lang, src):
    quick = dataclasses.replace(settings, compile_time_limit_s=4.0)
    r = run(problem, quick, src, lang)
    assert r.status == "compile_error", (r.status, r.reason)
    assert r.duration_s < quick.compile_time_limit_s + 10
    assert wait_until(lambda: leftover_programs() == [], 10), leftover_programs()


def test_host_is_fine_afterwards(problem, settings):
    lang, src = problem.solutions["fast"]
    r = run(problem, settings, src, lang)
    assert r.status == "ok", r.reason
    assert wait_until(lambda: leftover_programs() == [], 10), leftover_programs()
    assert leftover_scratch() == []
    from elastic.reward.verifiers.programs import default_sandbox

    default_sandbox(settings.env_allow).close()  # its spare launcher holds a cgroup by design
    assert wait_until(lambda: leftover_cgroups() == [], 10), leftover_cgroups()


LIMITS_PROBE = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <sys/resource.h>
static unsigned long long lim(int r) { struct rlimit l; getrlimit(r, &l); return (unsigned long long)l.rlim_cur; }
int main(void) {
    cpu_set_t s; CPU_ZERO(&s); sched_getaffinity(0, sizeof s, &s);
    int first = -1; for (int i = 0; i < CPU_SETSIZE; i++) if (CPU_ISSET(i, &s)) { first = i; break; }
    printf("%llu %llu %llu %llu %llu %d %d\n", lim(RLIMIT_NOFILE), lim(RLIMIT_FSIZE), lim(RLIMIT_CPU),
           lim(RLIMIT_AS), lim(RLIMIT_CORE), CPU_COUNT(&s), first);
    return 0;
}
"""


def _isolation(wrapper: str):
    """The detected layers with bwrap, or the `unshare` fallback (detection cache restored); a
    Sandbox takes the latter only with allow_weak_isolation (it fails closed otherwise)."""
    from elastic.sandbox import isolation

    if wrapper == "bwrap":
        return isolation.detect()
    saved = isolation._DETECTED
    try:
        iso = isolation.detect(force=True, allow_bwrap=False)
    finally:
        isolation._DETECTED = saved
    if iso.wrapper != "unshare":
        pytest.skip("no usable unshare here")
    return iso


@pytest.mark.parametrize("wrapper", ["bwrap", "unshare"])
@pytest.mark.parametrize("use_launcher", [True, False], ids=["launcher", "preexec_fn"])
def test_limits_are_in_place_when_the_program_starts(tmp_path, use_launcher, wrapper):
    """Both spawn paths (exec shim, preexec_fn fallback) apply the same rlimits and pinning,
    under bwrap and under the unshare fallback."""
    from elastic.reward.verifiers.programs import compile_limits, compiled, run_binary, run_limits
    from elastic.sandbox.command import Sandbox

    sb = Sandbox(isolation=_isolation(wrapper), use_launcher=use_launcher, allow_weak_isolation=wrapper != "bwrap")
    assert (sb.launcher is not None) is use_launcher
    cpu = sorted(os.sched_getaffinity(0))[-1]
    limits = run_limits(2.0, 128)
    empty = tmp_path / "in"
    empty.write_bytes(b"")
    with compiled(sb, LIMITS_PROBE, "c", compile_limits(20, 1024)) as c:
        assert c.ok, c.reason
        o = run_binary(sb, c.binary, empty, limits, cpu)
    assert o.ok, (o.sandbox_error, o.stderr)
    nofile, fsize, cpu_s, as_, core, ncpu, first = map(int, o.stdout.split())
    assert (nofile, fsize, cpu_s, core) == (limits.nofile, limits.fsize_mb << 20, limits.cpu_limit, 0)
    assert as_ == (limits.memory_mb + 64) << 20
    assert (ncpu, first) == (1, cpu)


def _launch(cgroups, message):
    """Run the launcher by hand: (exit code, report pipe text, stdout)."""
    import subprocess

    from elastic.sandbox import launcher

    exe = launcher.build()
    assert exe is not None, "gcc could not build the launcher"
    rep_r, rep_w = os.pipe()
    msg_r, msg_w = os.pipe()
    p = subprocess.Popen(launcher.argv(exe, rep_w, msg_r, cgroups), pass_fds=(rep_w, msg_r),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(rep_w)
    os.close(msg_r)
    try:
        os.write(msg_w, message)
    except BrokenPipeError:
        pass
    os.close(msg_w)
    out, err = p.communicate(timeout=30)
    with os.fdopen(rep_r, "rb") as f:
        report = f.read().decode()
    assert err == b""  # never stderr: a program could write there
    return p.returncode, report, out


def test_launcher_reports_on_its_own_channel():
    """The shim reports on a private pipe, never by exit code or stderr a program could forge;
    an empty message (cancelled, or its parent died) runs nothing."""
    from elastic.sandbox import launcher

    code, report, _ = _launch(["/nonexistent/cgroup.procs"], launcher.message(["/bin/echo", "ran"], [], None))
    assert code == launcher.EXIT_LAUNCHER_FAILED and "cgroup attach /nonexistent/cgroup.procs" in report
    code, report, out = _launch([], b"")
    assert code == launcher.EXIT_LAUNCHER_FAILED and report == "+" and out == b""
    code, report, out = _launch([], launcher.message(["/bin/echo", "ran"], [], None))
    assert code == 0 and report == "+" and out == b"ran\n"
    code, report, _ = _launch([], b"-x\0--\0/bin/true\0")
    assert code == launcher.EXIT_LAUNCHER_FAILED and "unknown option -x" in report


def test_program_exit_125_is_a_program_verdict(problem, settings):
    r = run(problem, settings, "int main(void){ return 125; }")
    assert r.status == "runtime_error" and "125" in r.reason


def test_exit_code_verdict_ignores_the_evaluators_own_memory(problem, settings):
    """The shim is vforked from this process and Linux keeps maxrss across exec: a program that
    exits by itself must not inherit this process's high-water mark as memory evidence."""
    ballast = bytearray((2 * problem.memory_limit_mb) << 20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # resident, not just reserved
    r = run(problem, settings, "int main(void){ return 3; }")
    assert r.status == "runtime_error" and "exit code 3" in r.reason, (r.status, r.reason)
    del ballast


@pytest.mark.parametrize("wrapper", ["bwrap", "unshare"])
def test_cancelled_prepared_run_never_runs(tmp_path, wrapper):
    """A prepared run waits fully set up; cancel() must not release it (bwrap reads EOF on its
    block fd as "go"; the launcher, waiting itself under unshare, as "abort"), start() must.
    The command leaves a mark in its working dir."""
    import time

    from elastic.sandbox.command import Limits, Sandbox

    sb = Sandbox(isolation=_isolation(wrapper), allow_weak_isolation=wrapper != "bwrap")
    cmd = ["/bin/sh", "-c", "echo ran > mark"]
    dirs = []
    for action in ("cancel", "start", "leave the with block"):
        d = tmp_path / action.replace(" ", "-")
        d.mkdir()
        with sb.prepare(cmd, d, Limits(wall_s=5)) as run:
            dirs += list(run.cg.dirs) if run.cg is not None else []
            time.sleep(0.3)  # long enough for the wrapper to be waiting
            if action == "cancel":
                run.cancel()
            elif action == "start":
                o = run.start()
                assert o.ok, (o.sandbox_error, o.stderr)
        time.sleep(0.3)
        assert (d / "mark").exists() is (action == "start"), action
    sb.close()
    assert dirs or sb.iso.cgroups is None or not (sb.iso.cgroups.pids or sb.iso.cgroups.memory)
    assert wait_until(lambda: not any(p.exists() for p in dirs), 10), dirs


def test_no_state_carries_over_between_runs_of_one_program(problem, settings):
    """Every run of one evaluation (4 tests, then the timed run) shares one sandbox session
    (session.py). A run that finds what an earlier run left (files in its directory, the
    session's tmpfs roots, /tmp, /dev/shm; System V shared memory, semaphores, message queues;
    a POSIX message queue) answers wrongly; so `ok` means nothing carried over. Without the
    wipe, a test run could compute the benchmark answer and leave it for the timed run."""
    src = SOLVE + r"""
#include <fcntl.h>
#include <mqueue.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>
static const char *files[] = {"mark", "../mark", "/sandbox/mark", "/tmp/mark", "/dev/shm/mark", "/dev/mark"};
int main(void) {
    int seen = 0;
    for (int i = 0; i < 6; i++) if (access(files[i], F_OK) == 0) seen = 1;
    if (shmget(0x5eed, 0, 0) >= 0 || semget(0x5eed, 0, 0) >= 0 || msgget(0x5eed, 0) >= 0) seen = 1;
    mqd_t q = mq_open("/elastic-mark", O_RDONLY);
    if (q != (mqd_t)-1) seen = 1;
    if (seen) { puts("-1"); return 0; }
    for (int i = 0; i < 6; i++) { int fd = open(files[i], O_CREAT | O_WRONLY, 0600); if (fd >= 0) close(fd); }
    const char *self[] = {"/proc/self/exe", "prog", "/build/prog"};  /* the binary later runs exec */
    for (int i = 0; i < 3; i++) { int fd = open(self[i], O_WRONLY | O_TRUNC); if (fd >= 0) { write(fd, "x", 1); close(fd); } }
    mkdir("/tmp/locked", 0700); close(open("/tmp/locked/x", O_CREAT | O_WRONLY, 0600)); chmod("/tmp/locked", 0);
    shmget(0x5eed, 4096, IPC_CREAT | 0600); semget(0x5eed, 1, IPC_CREAT | 0600); msgget(0x5eed, IPC_CREAT | 0600);
    struct mq_attr a = {0}; a.mq_maxmsg = 1; a.mq_msgsize = 1;
    mq_open("/elastic-mark", O_CREAT | O_RDONLY, 0600, &a);
    solve(); return 0;
}"""
    r = evaluate(problem, src, "c", settings)
    assert r.status == "ok", (r.status, r.reason, [(t.name, t.status, t.detail) for t in r.tests])
    assert len(r.tests) == len(problem.tests) and all(t.status == "ok" for t in r.tests)


def _refusal_and_opt_in(iso, tmp_path, why: str) -> None:
    import logging

    from elastic.sandbox.isolation import SandboxUnavailable
    from elastic.sandbox.command import Limits, Sandbox

    with pytest.raises(SandboxUnavailable) as e:
        Sandbox(isolation=iso)
    msg = str(e.value)
    assert "\n" not in msg and why in msg, msg
    for hint in ("apt-get install bubblewrap", "bash scripts/setup.sh", "reward.allow_weak_isolation"):
        assert hint in msg, msg
    logger = logging.getLogger("elastic.reward")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda rec: seen.append(rec.getMessage())
    logger.addHandler(handler)
    from elastic.sandbox import isolation

    isolation._WARNED_WEAK.discard((iso.wrapper, tuple(iso.unshare_prefix)))
    try:
        sb = Sandbox(isolation=iso, allow_weak_isolation=True)
    finally:
        logger.removeHandler(handler)
    assert any(m.startswith("SANDBOX WARNING") for m in seen), seen
    try:
        o = sb.run(["/bin/sh", "-c", "echo ran"], tmp_path, Limits(wall_s=10))
        assert o.ok and o.stdout == b"ran\n", (o.sandbox_error, o.stderr)
    finally:
        sb.close()


def test_sandbox_fails_closed_without_bubblewrap(tmp_path):
    """No bubblewrap: a Sandbox refuses with one line (how to install it, the opt-in's name);
    with allow_weak_isolation it runs, under the unshare fallback, with a WARNING."""
    from elastic.sandbox import isolation

    saved = isolation._DETECTED
    try:
        iso = isolation.detect(force=True, allow_bwrap=False)
    finally:
        isolation._DETECTED = saved
    _refusal_and_opt_in(iso, tmp_path, "bubblewrap disabled")


def test_sandbox_fails_closed_with_bwrap_missing_from_path(tmp_path, monkeypatch):
    """`bwrap` not on PATH (nor `unshare`): refused; opted in, it runs with no namespaces."""
    from elastic.sandbox import isolation

    empty = tmp_path / "bin"
    empty.mkdir()
    saved = isolation._DETECTED
    monkeypatch.setenv("PATH", str(empty))
    try:
        iso = isolation.detect(force=True)
    finally:
        isolation._DETECTED = saved
        monkeypatch.undo()
    assert iso.wrapper == "" and "not found on PATH" in iso.bwrap_error
    _refusal_and_opt_in(iso, tmp_path, "`bwrap` not found on PATH")


def test_default_sandbox_fails_closed(monkeypatch):
    """evaluate() with no sandbox given refuses too (the process's default sandbox)."""
    from elastic.reward.verifiers import programs
    from elastic.sandbox import isolation
    from elastic.sandbox.isolation import SandboxUnavailable

    saved = isolation._DETECTED
    try:
        weak = isolation.detect(force=True, allow_bwrap=False)
    finally:
        isolation._DETECTED = saved
    monkeypatch.setattr(isolation, "_DETECTED", weak)
    monkeypatch.setattr(programs, "_SANDBOXES", {})
    monkeypatch.setattr("elastic.sandbox.command.detect", lambda: weak)
    with pytest.raises(SandboxUnavailable):
        programs.default_sandbox()
    sb = programs.default_sandbox(allow_weak_isolation=True)
    assert sb.iso.wrapper == weak.wrapper
    sb.close()
