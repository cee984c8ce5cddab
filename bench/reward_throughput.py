"""Reward-service throughput and timing stability.

1. Evaluations/s of a RewardPool with N actors (sandboxed compile + tests + one timed
   benchmark run per item) vs. the same compile + runs with no sandbox, sequentially in one
   process (plain subprocess). ``overhead`` = per-evaluation CPU-slot cost sandboxed /
   unsandboxed = (N / pool_eps) / (1 / baseline_eps).
2. Coefficient of variation (stdev / mean) of 10 repeated timings of the problem's reference
   program on its benchmark input, in each timing mode (wall, instructions).

    python bench/reward_throughput.py --actors 2 --items 32 --problem tests/fixtures/code-opt/pair-sum

Prints a table and writes bench/results/reward_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elastic.config.schema import RewardSection  # noqa: E402
from elastic.reward.checkers import check  # noqa: E402
from elastic.reward.evaluator import default_sandbox  # noqa: E402
from elastic.reward.problems import load_problem  # noqa: E402
from elastic.reward.programs import COMPILE, compile_limits, compiled  # noqa: E402
from elastic.reward.timing import bench_input, measure  # noqa: E402


def baseline_eps(problem, src, lang, stdin: Path, items: int) -> float:
    """Same work as one evaluation, no sandbox: compile, run tests, run the bench input once."""
    argv, name = COMPILE[lang]
    t0 = time.perf_counter()
    for _ in range(items):
        with tempfile.TemporaryDirectory() as d:
            Path(d, name).write_text(src)
            subprocess.run(argv, cwd=d, check=True, capture_output=True)
            for t in problem.tests:
                out = subprocess.run(["./prog"], cwd=d, input=t.input, capture_output=True, timeout=30).stdout
                assert check(problem.checker, out, t.expected)[0]
            with open(stdin, "rb") as f:
                subprocess.run(["./prog"], cwd=d, stdin=f, capture_output=True, timeout=60)
    return items / (time.perf_counter() - t0)


def pool_eps(problem_dir: Path, src, lang, actors: int, items: int, cache: str):
    import ray

    from elastic.reward.pool import RewardPool

    ray.init(address="local", num_cpus=actors, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        section = RewardSection(num_actors=actors, timing="wall", timing_runs=1, warmup_runs=0, cache_dir=cache)
        pool = RewardPool(section, problem_dir.parent)
        completion = f"```{lang}\n{src}\n```"
        warm = pool.evaluate_batch([(problem_dir.name, completion)] * actors)  # actors up, reference cached
        assert all(r.status == "ok" for r in warm), [r.reason for r in warm]
        layers = pool.layers()
        t0 = time.perf_counter()
        res = pool.evaluate_batch([(problem_dir.name, completion)] * items)
        dt = time.perf_counter() - t0
        assert all(r.status == "ok" for r in res), {r.status for r in res}
        pool.shutdown()
        return items / dt, layers
    finally:
        ray.shutdown()


def cv_of_timings(problem, stdin: Path, mode: str, repeats: int):
    sb = default_sandbox()
    limits = compile_limits(60, 1024)
    vals = []
    with compiled(sb, problem.reference_source, problem.language, limits) as c:
        for _ in range(repeats):
            m = measure(sb, c.binary, stdin, mode, runs=1, warmup=0, bench_limit_s=problem.bench_time_limit_s,
                        memory_mb=problem.memory_limit_mb, instructions_limit_s=300, cpu=None)
            assert m.failure is None, m.failure
            vals.append(m.value)
    mean = statistics.mean(vals)
    return statistics.pstdev(vals) / mean if mean else 0.0, vals, m.tool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--problem", default=str(REPO / "tests" / "fixtures" / "code-opt" / "pair-sum"))
    ap.add_argument("--solution", default="fast", help="solutions/<name> evaluated by the pool (default fast)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reward_throughput.json"))
    args = ap.parse_args()
    pdir = Path(args.problem).resolve()
    problem = load_problem(pdir)
    lang, src = problem.solutions[args.solution]
    cache = tempfile.mkdtemp(prefix="elastic-bench-cache-")
    stdin = bench_input(problem, Path(cache))

    base = baseline_eps(problem, src, lang, stdin, max(4, args.items // 2))
    peps, layers = pool_eps(pdir, src, lang, args.actors, args.items, cache)
    overhead = (args.actors / peps) / (1 / base)
    cv_wall, wall_vals, _ = cv_of_timings(problem, stdin, "wall", args.repeats)
    cv_instr, instr_vals, tool = cv_of_timings(problem, stdin, "instructions", args.repeats)

    rows = [("problem", problem.id), ("actors", args.actors), ("items", args.items),
            ("baseline evals/s (no sandbox, 1 process)", f"{base:.2f}"),
            (f"pool evals/s ({args.actors} actors)", f"{peps:.2f}"),
            ("overhead (sandboxed / unsandboxed cost per eval)", f"{overhead:.2f}x"),
            (f"CV wall ({args.repeats} runs, median {statistics.median(wall_vals):.4f}s)", f"{cv_wall:.4f}"),
            (f"CV instructions ({tool}, {args.repeats} runs)", f"{cv_instr:.6f}")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("active layers:", ", ".join(k for k, v in layers.items() if v and k != "running_as_root"))
    out = {"problem": problem.id, "actors": args.actors, "items": args.items, "baseline_evals_per_s": base,
           "pool_evals_per_s": peps, "overhead_ratio": overhead, "cv_wall": cv_wall, "cv_instructions": cv_instr,
           "instruction_tool": tool, "wall_runs_s": wall_vals, "instruction_runs": instr_vals, "layers": layers,
           "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
