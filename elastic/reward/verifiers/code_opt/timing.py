"""Benchmark inputs, timing modes and the per-problem, per-machine reference cache.

Modes:

* ``wall``: ``warmup_runs`` untimed runs, then the median of ``timing_runs`` wall-clock runs,
  every run pinned to one core (``sched_setaffinity`` in the child). The runs are launched
  ahead (:func:`bench_runs`: spawned, attached to their cgroups, limited, waiting in the
  launcher); each clock runs from its release to its exit, so it includes a constant few-ms
  sandbox start-up (bubblewrap's namespaces and mounts) but not the spawn or the cgroup
  attach (whose RCU grace period varies with the host's load). No run is set up while
  another is timed: set-ups would share the pinned core.
* ``instructions``: one run under a deterministic instruction counter: ``perf stat -e
  instructions:u`` where the kernel exposes the counter, else ``valgrind --tool=callgrind``
  (~50x slower, so the run gets ``instructions_time_limit_s``). The count comes over a
  private fd the program cannot write to.

Cache layout under ``cache_dir`` (atomic writes, an flock per problem so concurrent actors on
one machine measure a reference once):

* ``bench/<problem hash>.in`` / ``.out``: benchmark input (from the trusted ``gen_bench.py``)
  and the reference's output on it (what the candidate's output is checked against);
* ``timings/v<TIMING_VERSION>-<problem hash>-<machine fingerprint>-<mode>-<runs>.json``:
  reference timing (the version changes whenever what a timing includes changes).

The machine fingerprint hashes hostname, CPU model, CPU count and compiler version, so a
timing is never reused across machines or toolchains.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from elastic.reward.verifiers.code_opt.problems import Problem
from elastic.reward.verifiers.programs import RunQueue, classify
from elastic.sandbox.command import Limits, Sandbox
from elastic.sandbox.session import RunSession, SessionQueue, sessions_available

GEN_BENCH_TIMEOUT_S = 300.0
# 3: wall clock of the in-sandbox runner (elastic/sandbox/session.py), fork to reap;
# 2: wall clock starts at the release of an attached run (was: before fork + preexec_fn)
TIMING_VERSION = 3


class ReferenceError_(RuntimeError):
    """The problem's own reference or generator failed: an infrastructure/data error."""


@lru_cache(maxsize=1)
def machine_fingerprint() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cc = subprocess.run(["gcc", "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        cc = ""
    raw = "|".join([platform.node(), cpu or platform.processor(), str(os.cpu_count()), cc])
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


@lru_cache(maxsize=1)
def instruction_tool() -> str:
    """"perf" when `perf stat` really counts user instructions here, else "valgrind" (or "")."""
    try:
        r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u", "true"], capture_output=True,
                           text=True, timeout=30)
        first = (r.stderr.strip().splitlines() or [""])[-1].split(",")[0]
        if r.returncode == 0 and first.isdigit() and int(first) > 0:
            return "perf"
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        subprocess.run(["valgrind", "--version"], capture_output=True, timeout=30, check=True)
        return "valgrind"
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return ""


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(cache_dir: Path, key: str) -> Iterator[None]:
    (cache_dir / "locks").mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "locks" / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def bench_input(problem: Problem, cache_dir: Path) -> Path:
    """The benchmark input file, generated once per problem content (trusted generator)."""
    path = cache_dir / "bench" / f"{problem.content_hash}.in"
    if path.is_file():
        return path
    with _locked(cache_dir, problem.content_hash + "-gen"):
        if path.is_file():
            return path
        with tempfile.TemporaryDirectory(prefix="elastic-gen-") as d:
            gen = Path(d) / "gen_bench.py"
            gen.write_text(problem.gen_bench_source)
            try:
                r = subprocess.run([sys.executable, str(gen)], cwd=d, capture_output=True, timeout=GEN_BENCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ReferenceError_(f"{problem.id}: gen_bench.py timed out") from None
            if r.returncode != 0:
                tail = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise ReferenceError_(f"{problem.id}: gen_bench.py failed (exit {r.returncode}): {tail[0]}")
        _atomic_write(path, r.stdout)
    return path


@dataclass
class Measurement:
    value: float = 0.0
    runs: List[float] = field(default_factory=list)
    tool: str = ""
    output: bytes = b""
    failure: Optional[Tuple[str, str]] = None  # (status, detail) when a run failed


_COUNT_RE = {"valgrind": re.compile(rb"Collected\s*:\s*(\d+)"), "perf": re.compile(rb"^\s*(\d+),", re.M)}


def bench_runs(sandbox: Sandbox, binary: Path, stdin: Path, mode: str, runs: int, warmup: int,
               bench_limit_s: float, memory_mb: int, instructions_limit_s: float, cpu: Optional[int],
               session: Optional[RunSession] = None) -> "RunQueue | SessionQueue":
    """The runs :func:`measure` will time. Wall mode: jobs of `session` (which must expose
    `stdin`), else of a session opened here, so that a candidate and its reference are timed
    the same way: the runner's clock, from its fork of the run to the reap. Without sessions:
    launched now, attached and limited, waiting in the launcher; bwrap sets each up only when
    it starts (inside its clock, like every timing)."""
    if mode == "wall":
        limits = Limits(wall_s=bench_limit_s, cpu_s=bench_limit_s, memory_mb=memory_mb)
        if session is not None:
            return SessionQueue(session, [stdin] * (warmup + runs), limits)
        if sessions_available(sandbox):
            own = RunSession(sandbox, [stdin], limits, cpu, binary=binary)
            return SessionQueue(own, [stdin] * (warmup + runs), limits, owns=True)
        return RunQueue(sandbox, binary, [stdin] * (warmup + runs), limits, cpu, setup_ahead=False)
    tool = instruction_tool()
    if tool == "perf":
        prefix = ["perf", "stat", "-x,", "-e", "instructions:u", "--log-fd", "{LOG_FD}", "--"]
        limits = Limits(wall_s=instructions_limit_s, cpu_s=instructions_limit_s, memory_mb=memory_mb + 256)
    else:
        prefix = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--vgdb=no",
                  "--log-fd={LOG_FD}"]
        # valgrind reserves large virtual ranges: no RLIMIT_AS, memory bounded by the cgroup.
        limits = Limits(wall_s=instructions_limit_s, cpu_s=instructions_limit_s, memory_mb=memory_mb + 512,
                        address_space=False)
    return RunQueue(sandbox, binary, [stdin] if tool else [], limits, cpu, setup_ahead=False, prefix=prefix,
                    want_log=True)


def measure(sandbox: Sandbox, binary: Path, stdin: Path, mode: str, runs: int, warmup: int,
            bench_limit_s: float, memory_mb: int, instructions_limit_s: float, cpu: Optional[int],
            queue: "Optional[RunQueue | SessionQueue]" = None) -> Measurement:
    """Time `binary` on `stdin` in `mode`; the first run's output is kept for checking.
    `queue` is :func:`bench_runs` with the same arguments, launched earlier by the caller."""
    with (queue or bench_runs(sandbox, binary, stdin, mode, runs, warmup, bench_limit_s, memory_mb,
                              instructions_limit_s, cpu)) as q:
        return _measure(q, mode, runs, warmup)


def _measure(q: "RunQueue | SessionQueue", mode: str, runs: int, warmup: int) -> Measurement:
    m = Measurement()
    limits = q.limits
    if mode == "wall":
        m.tool = "wall"
        for i in range(warmup + runs):
            o = q.next()
            status, detail = classify(o, limits)
            if status != "ok":
                m.failure = (status, detail)
                return m
            if i == 0:
                m.output = o.stdout
            if i >= warmup:
                m.runs.append(o.wall_s)
        m.value = statistics.median(m.runs)
        return m
    tool = instruction_tool()
    if not tool:
        m.failure = ("sandbox_error", "no instruction counter (neither perf nor valgrind usable)")
        return m
    m.tool = tool
    o = q.next()
    status, detail = classify(o, limits)
    if status != "ok":
        m.failure = (status, detail)
        return m
    hit = _COUNT_RE[tool].search(o.log)
    if not hit:
        m.failure = ("sandbox_error", f"{tool} reported no instruction count")
        return m
    m.value = float(int(hit.group(1)))
    m.runs = [m.value]
    m.output = o.stdout
    return m


def reference_timing(sandbox: Sandbox, problem: Problem, binary_factory, cache_dir: Path, mode: str, runs: int,
                     warmup: int, instructions_limit_s: float, cpu: Optional[int]) -> Tuple[Measurement, bytes, bool]:
    """(reference measurement, reference bench output, from_cache). `binary_factory()` is a
    context manager yielding the compiled reference; it is only entered on a cache miss."""
    key = f"v{TIMING_VERSION}-{problem.content_hash}-{machine_fingerprint()}-{mode}-{runs if mode == 'wall' else 1}"
    tpath = cache_dir / "timings" / f"{key}.json"
    opath = cache_dir / "bench" / f"{problem.content_hash}.out"
    if tpath.is_file() and opath.is_file():
        d = json.loads(tpath.read_text())
        return Measurement(d["value"], d["runs"], d["tool"]), opath.read_bytes(), True
    stdin = bench_input(problem, cache_dir)
    with _locked(cache_dir, key):
        if tpath.is_file() and opath.is_file():
            d = json.loads(tpath.read_text())
            return Measurement(d["value"], d["runs"], d["tool"]), opath.read_bytes(), True
        with binary_factory() as binary:
            m = measure(sandbox, binary, stdin, mode, runs, warmup, problem.bench_time_limit_s,
                        problem.memory_limit_mb, instructions_limit_s, cpu)
        if m.failure is not None:
            raise ReferenceError_(f"{problem.id}: reference failed on the benchmark input: {m.failure[0]} ({m.failure[1]})")
        if not opath.is_file():
            _atomic_write(opath, m.output)
        _atomic_write(tpath, json.dumps({"value": m.value, "runs": m.runs, "tool": m.tool, "problem": problem.id,
                                         "mode": mode}).encode())
        return m, opath.read_bytes(), False
