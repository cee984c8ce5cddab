"""Where the time of one reward evaluation goes, measured inside a pool actor.

Runs in a Ray actor (the large, multi-threaded process the pool evaluates in) and times
each cost of a sandboxed run separately, plus the same work without a sandbox:

* spawning: ``vfork`` + exec (what the sandbox does now, through the launcher) against
  ``fork`` + ``preexec_fn`` (what it did), for ``/bin/true``; bubblewrap with the sandbox's
  arguments around ``/bin/true`` (these four interleaved);
* a cgroup v1 attach right after another one, and 50 ms after the last one (an RCU grace
  period: why the evaluator launches test runs ahead of time);
* per-run bookkeeping: cgroup create/remove, scratch dir create/remove, the per-run sweep
  check, a full sweep (with the host's /tmp, and with 10,000 entries), counting the user's
  tasks in /proc (what a non-root sandbox needs for RLIMIT_NPROC);
* one test run of the candidate: launched and set up ahead then started (the per-process
  path), launched and started at once, as a job of a sandbox session (what an evaluation
  does now, session.py), and plain ``subprocess``;
* compile: sandboxed (on the sandbox's spare launcher) against plain gcc (interleaved);
* one whole evaluation (``timing_runs=1``), and Ray's round trip for a no-op actor call.

Medians of `--n` repetitions (the machine may be shared). Prints a table, writes
bench/results/reward_profile.json.

    python bench/reward_profile.py --n 40
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _median_ms(fn: Callable[[], Any], n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e3


def _interleaved_ms(fns: Dict[str, Callable[[], Any]], n: int) -> Dict[str, float]:
    """Medians of variants measured in turn (A, B, A, B, ...): load changes hit all alike."""
    xs: Dict[str, list] = {k: [] for k in fns}
    for _ in range(n):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            xs[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in xs.items()}


def profile(problem_dir: str, n: int) -> Dict[str, Any]:
    """Runs inside the actor; returns {name: median ms} plus context."""
    import resource
    import shutil
    import subprocess
    import tempfile

    from elastic.sandbox import launcher
    from elastic.reward.verifiers.code_opt.evaluator import evaluate
    from elastic.reward.verifiers.code_opt.problems import load_problem
    from elastic.reward.verifiers.programs import COMPILE, compile_limits, compiled, prepare_binary, run_limits
    from elastic.sandbox.session import RunSession, sessions_available
    from elastic.sandbox.command import Sandbox, _user_tasks
    from elastic.reward.settings import EvalSettings

    sb = Sandbox()
    problem = load_problem(problem_dir)
    lang, src = problem.solutions["fast"]
    out: Dict[str, Any] = {}
    cpu = sorted(os.sched_getaffinity(0))[-1]

    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        os.sched_setaffinity(0, {cpu})

    spawn = {"spawn /bin/true: vfork+exec": lambda: subprocess.Popen(["/bin/true"], start_new_session=True).wait(),
             "spawn /bin/true: fork+preexec_fn (before)": lambda: subprocess.Popen(
                 ["/bin/true"], start_new_session=True, preexec_fn=pre).wait()}
    if sb.launcher:
        def via_launcher() -> None:  # spawn, then the message (rlimits, pin, command) and exec
            err_r, err_w = os.pipe()
            msg_r, msg_w = os.pipe()
            p = subprocess.Popen(launcher.argv(sb.launcher, err_w, msg_r, []), start_new_session=True,
                                 pass_fds=(err_w, msg_r))
            os.close(err_w)
            os.close(msg_r)
            os.write(msg_w, launcher.message(["/bin/true"], [(resource.RLIMIT_NOFILE, 64, 64)], cpu))
            os.close(msg_w)
            p.wait()
            os.close(err_r)
        spawn["spawn /bin/true: vfork+launcher (now)"] = via_launcher
    if sb.iso.wrapper == "bwrap":
        from elastic.sandbox.isolation import BWRAP_BASE

        bwd = tempfile.mkdtemp()
        bw = ["bwrap", *BWRAP_BASE, *sb._system_binds, "--proc", "/proc", "--dev", "/dev", "--size",
              str(64 << 20), "--tmpfs", "/tmp", "--bind", bwd, "/sandbox", "--chdir", "/sandbox", "--", "/bin/true"]
        spawn["bwrap (sandbox args) around /bin/true"] = lambda: subprocess.run(bw)
    out.update(_interleaved_ms(spawn, n))

    factory = sb.iso.cgroups
    if factory is not None and factory.pids:
        sleeper = subprocess.Popen(["sleep", "600"])

        def attach(pause: float) -> float:
            c = factory.create(64, 256 << 20)
            time.sleep(pause)
            t0 = time.perf_counter()
            for f in c.procs_files():
                with open(f, "w") as fh:
                    fh.write(str(sleeper.pid))
            dt = time.perf_counter() - t0
            for f in c.procs_files():  # back out, so the cgroup can go
                with open(str(Path(f).parent.parent / "cgroup.procs"), "w") as fh:
                    fh.write(str(sleeper.pid))
            c.remove()
            return dt
        for pause, label in ((0.0, "cgroup attach right after another"), (0.05, "cgroup attach 50 ms after the last")):
            out[label] = statistics.median(attach(pause) for _ in range(max(5, n // 2))) * 1e3
        sleeper.kill()
        sleeper.wait()
        out["cgroup create+remove"] = _median_ms(lambda: factory.create(64, 256 << 20).remove(), n)

    def scratch() -> None:
        with sb.scratch():
            pass
    out["scratch dir create+remove"] = _median_ms(scratch, n)
    out["per-run sweep check (now)"] = _median_ms(sb._maybe_sweep, n)
    tmp_entries = len(os.listdir(tempfile.gettempdir()))
    out[f"full sweep, host /tmp ({tmp_entries} entries; before: every run)"] = _median_ms(sb.sweep_stale, n)
    big = tempfile.mkdtemp(prefix="elastic-profile-")
    try:
        for i in range(10000):
            os.mkdir(os.path.join(big, f"other-{i}"))
        sbig = Sandbox(scratch_root=big)
        out["full sweep, /tmp of 10,000 entries"] = _median_ms(sbig.sweep_stale, max(3, n // 4))
    finally:
        shutil.rmtree(big, ignore_errors=True)
    nprocs = sum(1 for d in os.listdir("/proc") if d.isdigit())
    out[f"count user tasks in /proc ({nprocs} processes; non-root, before: every run)"] = _median_ms(
        lambda: _user_tasks(os.getuid()), n)

    climits = compile_limits(30, 1024)
    test = problem.tests[0]
    with compiled(sb, src, lang, climits) as c, tempfile.TemporaryDirectory() as io:
        inp = Path(io) / "in"
        inp.write_bytes(test.input)
        limits = run_limits(problem.time_limit_s, problem.memory_limit_mb)
        launch, ahead, child, at_once, plain = [], [], [], [], []
        for _ in range(n):
            t0 = time.perf_counter()
            run = prepare_binary(sb, c.binary, inp, limits, cpu)
            launch.append(time.perf_counter() - t0)
            time.sleep(0.03)  # what the evaluator overlaps with the compile
            t0 = time.perf_counter()
            o = run.start()
            ahead.append(time.perf_counter() - t0)
            child.append(o.wall_s)
            t0 = time.perf_counter()
            prepare_binary(sb, c.binary, inp, limits, cpu).start()
            at_once.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with open(inp, "rb") as f:
                subprocess.run([str(c.binary)], stdin=f, capture_output=True)
            plain.append(time.perf_counter() - t0)
        med = lambda v: statistics.median(v) * 1e3  # noqa: E731
        out["test run: launch (parent: cgroup, spawn; attach and bwrap set-up follow in the background)"] = med(launch)
        out["test run launched and set up ahead: start -> reaped and cleaned"] = med(ahead)
        out["  of which the program's wall clock (release -> exit)"] = med(child)
        out["test run launched and started at once (launch, attach, set-up, run)"] = med(at_once)
        out["test run plain subprocess"] = med(plain)
        if sessions_available(sb):  # what an evaluation does now: every run a job of one sandbox
            with RunSession(sb, [inp], limits, cpu, binary=c.binary) as session:
                session.run(inp, limits)  # the sandbox's start-up is the evaluation's, once
                jobs = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    assert session.run(inp, limits).ok
                    jobs.append(time.perf_counter() - t0)
            out["test run as a job of the evaluation's sandbox session: sent -> answered (wiped)"] = med(jobs)

    argv, name = COMPILE[lang]

    def sandboxed_compile() -> None:
        with compiled(sb, src, lang, climits) as cc:
            assert cc.ok

    def plain_compile() -> None:
        with tempfile.TemporaryDirectory() as d:
            Path(d, name).write_text(src)
            subprocess.run(argv, cwd=d, check=True, capture_output=True)
    m = max(5, n // 4)
    out.update(_interleaved_ms({"compile sandboxed": sandboxed_compile, "compile plain": plain_compile}, m))
    with tempfile.TemporaryDirectory() as cache:
        settings = EvalSettings(timing="wall", timing_runs=1, warmup_runs=0, cache_dir=cache, cpu=cpu)
        evaluate(problem, src, lang, settings, sb)
        k = iter(range(10 ** 6))
        out["whole evaluation (compile + 4 tests + 1 bench run)"] = _median_ms(
            lambda: evaluate(problem, f"{src}/* {next(k)} */", lang, settings, sb), m)
    out["_context"] = {"pid": os.getpid(), "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       "threads": len(os.listdir("/proc/self/task")), "launcher": bool(sb.launcher),
                       "layers": sb.layers}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="repetitions per figure (medians)")
    ap.add_argument("--problem", default=str(REPO / "tests" / "fixtures" / "code-opt" / "pair-sum"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reward_profile.json"))
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        actor = ray.remote(num_cpus=1)(type("ProfileActor", (), {"run": lambda self, p, n: profile(p, n)})).remote()
        res = ray.get(actor.run.remote(str(Path(args.problem).resolve()), args.n))

        @ray.remote(num_cpus=0)
        class Noop:
            def f(self, x):
                return x
        a = Noop.remote()
        ray.get(a.f.remote(0))
        res["Ray round trip, no-op actor call (driver side)"] = _median_ms(lambda: ray.get(a.f.remote(0)), args.n * 5)
    finally:
        ray.shutdown()
    ctx = res.pop("_context")
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{w}}  {v:8.2f} ms")
    print(f"actor: {ctx['maxrss_mb']:.0f} MB max RSS, {ctx['threads']} threads, launcher {ctx['launcher']}; "
          f"load average {os.getloadavg()[0]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"median_ms": res, "context": ctx, "n": args.n, "loadavg": os.getloadavg(),
                                          "machine": {"node": platform.node(), "cpus": os.cpu_count()},
                                          "date": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
