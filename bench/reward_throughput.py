"""Reward-service throughput against the same work unsandboxed, and timing stability.

1. Per repetition (each in a fresh process with its own local Ray cluster):

   * ``baseline``: the same work as one evaluation with no sandbox, sequentially in one
     process (plain ``subprocess``): compile with the evaluator's gcc/g++ command, run every
     test and check its output, run the benchmark input once and check its output;
   * ``in-process``: :func:`elastic.reward.evaluate` sequentially in one process (the whole
     sandbox, no pool), ``timing_runs=1, warmup_runs=0`` so it runs the binary as often as
     the baseline does;

   both in a 1-CPU Ray actor, so at the niceness Ray gives its workers (15), like the pool's
   actors: a baseline in the driver (nice 0) would be favoured on a shared machine;
   * ``parallel baseline``: the baseline on all N slots at once (N actors, each its own
     distinct programs), evaluations/s over the span from the first start to the last end;
   * ``pool``: ``RewardPool.evaluate_batch`` with N actors (N CPU slots), same settings.

   Every item is a distinct program (the solution plus a unique comment), so the pool's
   dedup never fires here: the figures are the cost of real evaluations.

   ``overhead = (N / pool_evals_per_s) / (1 / baseline_evals_per_s)``: CPU-slot seconds per
   evaluation, sandboxed in the pool over unsandboxed. ``in-process overhead`` is the same
   for one process (sandbox cost without Ray). ``parallel overhead = parallel_baseline_evals_per_s
   / pool_evals_per_s`` compares at equal parallelism: with N = the number of cores the
   sequential baseline has a core to spare for everything else, the pool does not (it also
   shares those cores with the driver and Ray's own processes, which is counted against it in
   both ratios). The machine may be shared: repetitions alternate between code versions
   (``--before``), and medians over repetitions are quoted. ``--max-load``
   takes each repetition only once the 1-minute load average is below a threshold; every
   repetition records the load before and after it.

2. Coefficient of variation (stdev / mean) of 10 repeated timings of the problem's
   reference program on its benchmark input, in each timing mode (wall, instructions).

3. Dedup: a batch where every program appears `--group` times (a GRPO group repeating one
   answer): evaluations run and evals/s per submitted item.

    python bench/reward_throughput.py --actors 2 --items 32 --reps 5 --before a87294a

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
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
FENCE = "```"


def _sources(src: str, tag: str, n: int) -> List[str]:
    """`n` distinct programs doing identical work."""
    return [f"{src}\n/* bench {tag} {i} */\n" for i in range(n)]


def baseline_eps(problem, sources: List[str], lang: str, stdin: Path, ref_out: bytes) -> float:
    from elastic.reward.verifiers.code_opt.checkers import check
    from elastic.reward.verifiers.programs import COMPILE

    argv, name = COMPILE[lang]
    t0 = time.perf_counter()
    for src in sources:
        with tempfile.TemporaryDirectory() as d:
            Path(d, name).write_text(src)
            subprocess.run(argv, cwd=d, check=True, capture_output=True)
            for t in problem.tests:
                out = subprocess.run(["./prog"], cwd=d, input=t.input, capture_output=True, timeout=30).stdout
                assert check(problem.checker, out, t.expected)[0]
            with open(stdin, "rb") as f:
                out = subprocess.run(["./prog"], cwd=d, stdin=f, capture_output=True, timeout=60).stdout
            assert check(problem.checker, out, ref_out)[0]
    return len(sources) / (time.perf_counter() - t0)


def inprocess_eps(problem, sources: List[str], lang: str, cache: str) -> float:
    from elastic.reward.verifiers.code_opt.evaluator import evaluate
    from elastic.reward.settings import EvalSettings

    settings = EvalSettings(timing="wall", timing_runs=1, warmup_runs=0, cache_dir=cache)
    r = evaluate(problem, sources[0] + "/* warm */", lang, settings)  # sandbox detection, launcher build
    assert r.status == "ok", r.reason
    t0 = time.perf_counter()
    for src in sources:
        r = evaluate(problem, src, lang, settings)
        assert r.status == "ok", r.reason
    return len(sources) / (time.perf_counter() - t0)


def pool_eps(problem_dir: Path, sources: List[str], lang: str, actors: int, cache: str):
    """Pool throughput (Ray is up: see one_rep)."""
    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=actors, timing="wall", timing_runs=1, warmup_runs=0, cache_dir=cache)
    pool = RewardPool(section, problem_dir.parent)
    warm = pool.evaluate_batch([(problem_dir.name, f"{FENCE}{lang}\n{s}/* warm */\n{FENCE}")
                                for s in sources[:actors]])  # actors up, reference cached
    assert all(r.status == "ok" for r in warm), [r.reason for r in warm]
    layers = pool.layers()
    t0 = time.perf_counter()
    res = pool.evaluate_batch([(problem_dir.name, f"{FENCE}{lang}\n{s}\n{FENCE}") for s in sources])
    dt = time.perf_counter() - t0
    assert all(r.status == "ok" for r in res), {r.status for r in res}
    extra: Dict[str, Any] = {}
    if hasattr(pool, "stats"):
        extra = {"dedup_hits": pool.stats()["dedup_hits"]}
    pool.shutdown()
    return len(sources) / dt, layers, extra


def _sequential(kind: str, problem_dir: str, sources: List[str], lang: str, cache: str,
                start_at: float = 0.0) -> Dict[str, Any]:
    """Runs inside a Ray actor: the baseline or the in-process sandboxed evaluations. With
    `start_at` (a time.time() value) the timed part waits for it, so that tasks started on
    several slots (each in a worker process that may have had to start first) overlap."""
    from elastic.reward.verifiers.code_opt.problems import load_problem
    from elastic.reward.verifiers.code_opt.timing import bench_input

    problem = load_problem(problem_dir)
    if kind == "baseline":
        stdin = bench_input(problem, Path(cache))
        ref = _reference_output(problem, stdin)
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.time()
        eps = baseline_eps(problem, sources, lang, stdin, ref)
    else:
        t0 = time.time()
        eps = inprocess_eps(problem, sources, lang, cache)
    return {"evals_per_s": eps, "nice": os.nice(0), "t0": t0, "t1": time.time(), "items": len(sources)}


def one_rep(args) -> Dict[str, Any]:
    """One repetition with the `elastic` package found in args.code (printed as JSON).

    The baseline and the in-process runs happen in a Ray actor (1 CPU), like the pool's
    evaluations: Ray starts workers at niceness 15, and a baseline run in the driver (nice 0)
    would win every contest for CPU on a machine shared with other Ray workers."""
    import ray

    from elastic.reward.verifiers.code_opt.problems import load_problem

    pdir = Path(args.problem).resolve()
    problem = load_problem(pdir)
    lang, src = problem.solutions[args.solution]
    cache = tempfile.mkdtemp(prefix="elastic-bench-cache-")
    ray.init(address="local", num_cpus=args.actors, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(args.code)}})
    try:
        tag = f"{os.getpid()}-{time.time_ns()}"
        seq = ray.remote(num_cpus=1)(_sequential)
        b = ray.get(seq.remote("baseline", str(pdir), _sources(src, tag + "b", args.baseline_items), lang, cache))
        i = ray.get(seq.remote("in-process", str(pdir), _sources(src, tag + "i", args.baseline_items), lang, cache))
        # The same unsandboxed work on every slot at once: the pool's baseline at equal
        # parallelism (the slots then share the machine's cores, caches and kernel as the
        # pool's actors do).
        start_at = time.time() + 10.0  # time for a worker process per slot to start
        par = ray.get([seq.remote("baseline", str(pdir), _sources(src, f"{tag}b{j}", args.baseline_items), lang, cache,
                                  start_at) for j in range(args.actors)])
        late = max(x["t0"] for x in par) - start_at
        if late > 0.5:
            raise RuntimeError(f"parallel baseline: a slot started {late:.1f} s late; the runs did not overlap")
        par_eps = sum(x["items"] for x in par) / (max(x["t1"] for x in par) - min(x["t0"] for x in par))
        peps, layers, extra = pool_eps(pdir, _sources(src, tag + "p", args.items), lang, args.actors, cache)
        base, inproc = b["evals_per_s"], i["evals_per_s"]
        return {"baseline_evals_per_s": base, "inprocess_evals_per_s": inproc, "pool_evals_per_s": peps,
                "parallel_baseline_evals_per_s": par_eps,
                "overhead_ratio": (args.actors / peps) / (1 / base), "inprocess_overhead_ratio": base / inproc,
                "parallel_overhead_ratio": par_eps / peps,
                "worker_nice": b["nice"], "layers": layers, **extra}
    finally:
        ray.shutdown()
        shutil.rmtree(cache, ignore_errors=True)


def _reference_output(problem, stdin: Path) -> bytes:
    from elastic.reward.verifiers.programs import COMPILE

    argv, name = COMPILE[problem.language]
    with tempfile.TemporaryDirectory() as d:
        Path(d, name).write_text(problem.reference_source)
        subprocess.run(argv, cwd=d, check=True, capture_output=True)
        with open(stdin, "rb") as f:
            return subprocess.run(["./prog"], cwd=d, stdin=f, capture_output=True, timeout=60, check=True).stdout


def dedup_figures(problem_dir: Path, src: str, lang: str, actors: int, items: int, group: int) -> Dict[str, Any]:
    """A batch of `items` where each distinct program appears `group` times."""
    import ray

    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool

    cache = tempfile.mkdtemp(prefix="elastic-bench-cache-")
    ray.init(address="local", num_cpus=actors, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        section = RewardSection(num_actors=actors, timing="wall", timing_runs=1, warmup_runs=0, cache_dir=cache)
        pool = RewardPool(section, problem_dir.parent)
        pool.evaluate_batch([(problem_dir.name, f"{FENCE}{lang}\n{s}\n{FENCE}") for s in _sources(src, "w", actors)])
        distinct = _sources(src, f"dedup-{time.time_ns()}", max(1, items // group))
        batch = [(problem_dir.name, f"{FENCE}{lang}\n{s}\n{FENCE}") for s in distinct for _ in range(group)]
        before = pool.stats()
        t0 = time.perf_counter()
        res = pool.evaluate_batch(batch)
        dt = time.perf_counter() - t0
        after = pool.stats()
        assert all(r.status == "ok" for r in res)
        pool.shutdown()
        return {"items": len(batch), "group": group, "evaluations": after["evaluations"] - before["evaluations"],
                "dedup_hits": after["dedup_hits"] - before["dedup_hits"], "items_per_s": len(batch) / dt}
    finally:
        ray.shutdown()
        shutil.rmtree(cache, ignore_errors=True)


def cv_of_timings(problem, stdin: Path, mode: str, repeats: int):
    from elastic.reward.verifiers.programs import default_sandbox
    from elastic.reward.verifiers.programs import compile_limits, compiled
    from elastic.reward.verifiers.code_opt.timing import measure

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


def checkout(ref: str) -> Path:
    """The `elastic` package of git commit `ref`, extracted read-only into a temp dir."""
    d = Path(tempfile.mkdtemp(prefix="elastic-bench-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "elastic"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive, check=True)
    return d


def wait_for_quiet(max_load: float, timeout_s: float) -> float:
    """Wait until the 1-minute load average is below `max_load` (a shared machine); returns it."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def run_rep(code: Path, args) -> Dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one-rep", "--code", str(code), "--actors",
           str(args.actors), "--items", str(args.items), "--baseline-items", str(args.baseline_items),
           "--problem", args.problem, "--solution", args.solution]
    env = dict(os.environ, RAY_ADDRESS="local", PYTHONPATH=str(code))
    # cwd=code: Ray puts the driver's working directory first on its workers' sys.path, so
    # from the repository's root the actors would import the current `elastic`, not `code`'s.
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=str(code))
    if r.returncode != 0:
        raise SystemExit(f"repetition failed ({code}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--baseline-items", type=int, default=16, help="items of the baseline and in-process runs")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per code version (medians are quoted)")
    ap.add_argument("--before", default="", help="git ref of an earlier version to alternate with (e.g. a87294a)")
    ap.add_argument("--group", type=int, default=8, help="dedup section: copies of each program in a batch")
    ap.add_argument("--problem", default=str(REPO / "tests" / "fixtures" / "code-opt" / "pair-sum"))
    ap.add_argument("--solution", default="fast", help="solutions/<name> evaluated (default fast)")
    ap.add_argument("--repeats", type=int, default=10, help="timings per mode for the CV figures")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reward_throughput.json"))
    ap.add_argument("--max-load", type=float, default=0.0,
                    help="before each repetition wait until the 1-minute load average is below this (0: don't)")
    ap.add_argument("--quiet-timeout", type=float, default=1800.0, help="longest wait for --max-load, seconds")
    ap.add_argument("--one-rep", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code", default=str(REPO), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.code)
    if args.one_rep:
        print(json.dumps(one_rep(args)))
        return

    versions = {"current": REPO}
    if args.before:
        versions = {f"before ({args.before})": checkout(args.before), "current": REPO}
    reps: Dict[str, List[Dict[str, Any]]] = {v: [] for v in versions}
    for i in range(args.reps):
        for v, code in versions.items():
            load = wait_for_quiet(args.max_load, args.quiet_timeout) if args.max_load else os.getloadavg()[0]
            rep = run_rep(code, args)
            rep["loadavg_1m_before"], rep["loadavg_1m_after"] = load, os.getloadavg()[0]
            reps[v].append(rep)
            print(f"rep {i + 1}/{args.reps} {v:<22} baseline {rep['baseline_evals_per_s']:6.2f}/s  in-process "
                  f"{rep['inprocess_evals_per_s']:6.2f}/s  pool {rep['pool_evals_per_s']:6.2f}/s  overhead "
                  f"{rep['overhead_ratio']:.2f}x (in-process {rep['inprocess_overhead_ratio']:.2f}x, vs "
                  f"{args.actors} parallel baselines {rep['parallel_overhead_ratio']:.2f}x)  load "
                  f"{rep['loadavg_1m_before']:.1f} -> {rep['loadavg_1m_after']:.1f}", flush=True)

    from elastic.reward.verifiers.code_opt.problems import load_problem
    from elastic.reward.verifiers.code_opt.timing import bench_input

    pdir = Path(args.problem).resolve()
    problem = load_problem(pdir)
    lang, src = problem.solutions[args.solution]
    cache = tempfile.mkdtemp(prefix="elastic-bench-cache-")
    stdin = bench_input(problem, Path(cache))
    cv_wall, wall_vals, _ = cv_of_timings(problem, stdin, "wall", args.repeats)
    cv_instr, instr_vals, tool = cv_of_timings(problem, stdin, "instructions", args.repeats)
    dedup = dedup_figures(pdir, src, lang, args.actors, args.items, args.group)

    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("baseline_evals_per_s", "inprocess_evals_per_s",
                                                                  "pool_evals_per_s", "overhead_ratio",
                                                                  "inprocess_overhead_ratio",
                                                                  "parallel_baseline_evals_per_s",
                                                                  "parallel_overhead_ratio")}
           for v, rs in reps.items()}
    rows = [("problem", problem.id), ("actors (CPU slots)", args.actors), ("items (distinct programs)", args.items),
            ("repetitions per version", args.reps)]
    for v, m in med.items():
        rows += [(f"[{v}] baseline evals/s (no sandbox, 1 process)", f"{m['baseline_evals_per_s']:.2f}"),
                 (f"[{v}] in-process sandboxed evals/s (no Ray)", f"{m['inprocess_evals_per_s']:.2f}"),
                 (f"[{v}] pool evals/s ({args.actors} actors)", f"{m['pool_evals_per_s']:.2f}"),
                 (f"[{v}] in-process overhead (sandboxed / unsandboxed)", f"{m['inprocess_overhead_ratio']:.2f}x"),
                 (f"[{v}] pool overhead (per-eval CPU-slot cost)", f"{m['overhead_ratio']:.2f}x"),
                 (f"[{v}] baseline on {args.actors} slots at once, evals/s", f"{m['parallel_baseline_evals_per_s']:.2f}"),
                 (f"[{v}] pool overhead vs that (equal parallelism)", f"{m['parallel_overhead_ratio']:.2f}x")]
    rows += [(f"dedup: {dedup['items']} items, each program x{dedup['group']}",
              f"{dedup['evaluations']} evaluations, {dedup['dedup_hits']} hits, {dedup['items_per_s']:.1f} items/s"),
             (f"CV wall ({args.repeats} runs, median {statistics.median(wall_vals):.4f}s)", f"{cv_wall:.4f}"),
             (f"CV instructions ({tool}, {args.repeats} runs)", f"{cv_instr:.6f}")]
    w = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    layers = reps["current"][-1]["layers"]
    print("active layers:", ", ".join(k for k, v in layers.items() if v and k != "running_as_root"))
    load = os.getloadavg()
    out = {"problem": problem.id, "actors": args.actors, "items": args.items, "baseline_items": args.baseline_items,
           "reps": args.reps, "definition": "overhead = (actors / pool_evals_per_s) / (1 / baseline_evals_per_s); "
           "parallel overhead = parallel_baseline_evals_per_s / pool_evals_per_s (the baseline on every slot "
           "at once); medians over repetitions; every item a distinct program (no dedup)",
           "medians": med, "repetitions": reps, "dedup": dedup, "cv_wall": cv_wall, "cv_instructions": cv_instr,
           "instruction_tool": tool, "wall_runs_s": wall_vals, "instruction_runs": instr_vals, "layers": layers,
           "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "loadavg_at_end": load},
           "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(cache, ignore_errors=True)
    for v, code in versions.items():
        if code != REPO:
            shutil.rmtree(code, ignore_errors=True)


if __name__ == "__main__":
    main()
