"""evaluate(problem, candidate_source) -> Result: compile, test, time, score.

Steps (under bubblewrap with wall-clock timing all in one sandbox session, each job with its
own directory, limits and clock, see elastic/sandbox/session.py; otherwise each in a fresh sandbox, elastic/sandbox/command.py):

1. compile the candidate (language from the fence tag, default the problem's);
2. run every test in name order with the problem's time and memory limits; stop at the
   first failure (later tests are reported ``skipped``);
3. run the candidate on the benchmark input: its output must match the reference's output
   there too (so special-casing the small tests does not pay), then time it (timing.py);
4. speedup = reference / candidate (time or instructions); reward = scoring.speedup_reward
   when everything passed, else ``failure_reward``.

Anything that is the infrastructure's or the problem's fault (sandbox cannot start,
reference broken, unexpected exception) is ``sandbox_error``, never a program verdict.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Optional

from elastic.reward.verifiers.code_opt.checkers import check
from elastic.reward.verifiers.code_opt.extract import extract_code
from elastic.reward.verifiers.code_opt.problems import Problem
from elastic.reward.verifiers.programs import (COMPILE, Compiled, RunQueue, classify, compile_limits, compile_verdict, compiled,
                                               default_sandbox, finish_compile, run_limits, start_compile)
from elastic.reward.result import OUTPUT_HEAD, Result, TestResult, Timing
from elastic.sandbox.command import Limits, Sandbox
from elastic.reward.verifiers.code_opt.scoring import speedup_reward
from elastic.sandbox.session import RunSession, SessionQueue, envelope, sessions_available
from elastic.reward.settings import EvalSettings
from elastic.reward.verifiers.code_opt.timing import ReferenceError_, bench_input, bench_runs, measure, reference_timing

log = logging.getLogger("elastic.reward")

def no_code_result(problem_id: str, settings: EvalSettings) -> Result:
    """A completion with no C/C++ block: a verdict on the completion (nothing to run)."""
    return Result(problem_id, "compile_error", settings.failure_reward, reason="no code block found")


def evaluate_completion(problem: Problem, completion: str, settings: Optional[EvalSettings] = None,
                        sandbox: Optional[Sandbox] = None) -> Result:
    """Extract the program from a model completion, then :func:`evaluate` it (the pool does
    the same two steps, extracting on its side so identical programs are evaluated once)."""
    settings = settings or EvalSettings()
    code = extract_code(completion, problem.language)
    if code is None:
        r = no_code_result(problem.id, settings)
        r.sandbox = (sandbox or default_sandbox(settings.env_allow, settings.allow_weak_isolation)).layers
        return r
    lang, src = code
    return evaluate(problem, src, lang, settings, sandbox)


def evaluate(problem: Problem, candidate_source: str, language: Optional[str] = None,
             settings: Optional[EvalSettings] = None, sandbox: Optional[Sandbox] = None) -> Result:
    settings = settings or EvalSettings()
    sandbox = sandbox or default_sandbox(settings.env_allow, settings.allow_weak_isolation)
    t0 = time.perf_counter()
    lang = language or problem.language
    try:
        r = _evaluate(problem, candidate_source, lang, settings, sandbox)
    except ReferenceError_ as e:
        r = Result(problem.id, "sandbox_error", settings.failure_reward, reason=str(e))
    except Exception as e:  # infrastructure bug: never a verdict on the program
        log.exception("evaluation of %s crashed", problem.id)
        r = Result(problem.id, "sandbox_error", settings.failure_reward, reason=f"{type(e).__name__}: {e}")
    r.language = lang
    r.duration_s = time.perf_counter() - t0
    r.sandbox = sandbox.layers
    return r


def _fail(problem: Problem, settings: EvalSettings, status: str, reason: str, **kw) -> Result:
    return Result(problem.id, status, settings.failure_reward, reason=reason, **kw)


def _evaluate(problem: Problem, source: str, lang: str, settings: EvalSettings, sandbox: Sandbox) -> Result:
    cache = Path(settings.cache_dir)
    cpu = settings.pinned_cpu()
    climits = compile_limits(settings.compile_time_limit_s, settings.compile_memory_mb)
    limits = run_limits(problem.time_limit_s, problem.memory_limit_mb)
    with sandbox.scratch() as d, tempfile.TemporaryDirectory(prefix="elastic-io-") as io:
        binary = d / "prog"
        inputs = []
        for i, t in enumerate(problem.tests):
            inputs.append(Path(io) / f"{i}.in")
            inputs[-1].write_bytes(t.input)
        stdin = bench_input(problem, cache)
        if settings.timing == "wall" and sessions_available(sandbox):
            # One sandbox for the compile and every run (elastic/sandbox/session.py): its launcher was attached
            # to its cgroup during the previous evaluation, so nothing here waits for a cgroup
            # attach's RCU grace period, and one bubblewrap set-up serves all the jobs.
            argv, src_name = COMPILE[lang]
            (d / src_name).write_text(source)
            bench = Limits(wall_s=problem.bench_time_limit_s, memory_mb=problem.memory_limit_mb)
            with RunSession(sandbox, [*inputs, stdin], envelope(climits, limits, bench), cpu, build_dir=d) as s:
                o = s.compile(list(argv), climits)
                c = compile_verdict(o, s.compiled, None)
                runs = SessionQueue(s, inputs, limits)
                timed = bench_runs(sandbox, binary, stdin, settings.timing, settings.timing_runs, settings.warmup_runs,
                                   problem.bench_time_limit_s, problem.memory_limit_mb,
                                   settings.instructions_time_limit_s, cpu, session=s)
                return _judge(problem, settings, sandbox, c, runs, timed, limits, climits, cpu, binary, stdin)
        # One sandbox per process: the compiler starts at once (on the sandbox's spare launcher,
        # attached long ago); every later run of the program is launched while it compiles
        # (RunQueue), so no run waits for a cgroup attach's RCU grace period and the test
        # sandboxes are set up meanwhile.
        compiling = start_compile(sandbox, d, source, lang, climits)
        with compiling, RunQueue(sandbox, binary, inputs, limits, cpu) as runs, \
                bench_runs(sandbox, binary, stdin, settings.timing, settings.timing_runs, settings.warmup_runs,
                           problem.bench_time_limit_s, problem.memory_limit_mb, settings.instructions_time_limit_s,
                           cpu) as timed:
            return _judge(problem, settings, sandbox, finish_compile(compiling, d), runs, timed, limits, climits,
                          cpu, binary, stdin)


def _judge(problem: Problem, settings: EvalSettings, sandbox: Sandbox, c: Compiled, runs, timed, limits: Limits,
           climits: Limits, cpu: Optional[int], binary: Path, stdin: Path) -> Result:
    """Tests in order (stop at the first failure), then the timed benchmark runs; `runs` and
    `timed` are queues (programs.RunQueue or session.SessionQueue) over the compiled program."""
    cout = c.outcome.stderr.decode(errors="replace")[-4000:]
    if not c.ok:
        status = "sandbox_error" if c.sandbox_error else "compile_error"
        return _fail(problem, settings, status, c.reason, compile_output=cout)
    tests = []
    failed: Optional[TestResult] = None
    for t in problem.tests:
        if failed is not None:
            tests.append(TestResult(t.name, "skipped"))
            continue
        o = runs.next()
        status, detail = classify(o, limits)
        if status == "ok":
            passed, why = check(problem.checker, o.stdout, t.expected)
            if not passed:
                status, detail = "wrong_answer", why
        shown = o.stdout[:OUTPUT_HEAD].decode("utf-8", errors="replace") if status == "wrong_answer" else ""
        tr = TestResult(t.name, status, round(o.wall_s, 6), detail, output=shown)
        tests.append(tr)
        if status != "ok":
            failed = tr
    if failed is not None:
        return _fail(problem, settings, failed.status, f"test {failed.name}: {failed.detail}",
                     tests=tests, compile_output=cout)

    @contextlib.contextmanager
    def reference_binary():
        with compiled(sandbox, problem.reference_source, problem.language, climits) as rc:
            if not rc.ok:
                raise ReferenceError_(f"{problem.id}: reference does not compile: {rc.reason}")
            yield rc.binary

    ref, ref_out, cached = reference_timing(sandbox, problem, reference_binary, Path(settings.cache_dir),
                                            settings.timing, settings.timing_runs, settings.warmup_runs,
                                            settings.instructions_time_limit_s, cpu)
    m = measure(sandbox, binary, stdin, settings.timing, settings.timing_runs, settings.warmup_runs,
                problem.bench_time_limit_s, problem.memory_limit_mb, settings.instructions_time_limit_s, cpu,
                queue=timed)
    if m.failure is not None:
        return _fail(problem, settings, m.failure[0], f"benchmark input: {m.failure[1]}", tests=tests,
                     compile_output=cout)
    passed, why = check(problem.checker, m.output, ref_out)
    if not passed:
        return _fail(problem, settings, "wrong_answer", f"benchmark input: {why}", tests=tests, compile_output=cout)
    unit = "s" if settings.timing == "wall" else "instructions"
    timing = Timing(settings.timing, unit, m.value, ref.value, m.runs, ref.runs, m.tool, cached)
    speedup = ref.value / m.value if m.value > 0 else float("inf")
    reward = speedup_reward(speedup, settings.reward_floor, settings.speedup_scale)
    return Result(problem.id, "ok", reward, speedup=speedup, tests=tests, timing=timing, compile_output=cout)
