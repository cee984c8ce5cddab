#!/usr/bin/env python3
"""Developer check for the code-optimisation problem set (datasets/code-opt).

For every problem folder this script:
  * validates problem.yaml (one-line error naming the file and the field),
  * checks the required files exist (statement.md, reference, >= 4 test pairs,
    gen_bench.py, solutions/fast.*, solutions/wrong.*),
  * compiles reference / fast / wrong with the official flags,
  * runs every test with the problem's checker: reference and fast must pass,
    wrong must fail at least one test,
  * runs the reference on the example in statement.md (the code blocks after "Input:" and
    "Output:") and checks it prints the stated output,
  * generates the benchmark input, times reference and fast (median of N runs),
    checks that fast's benchmark output matches the reference's,
  * prints a table and exits non-zero on any violation.

This is a dev tool using plain subprocess calls, not the evaluation sandbox.

Usage:
  python tools/check_problems.py                 # check everything
  python tools/check_problems.py --only ID ...   # some problems
  python tools/check_problems.py --skip-timing   # correctness only (fast)
  python tools/check_problems.py --wall          # judge timings on wall time (idle machine)
  python tools/check_problems.py --regen-outputs # rewrite tests/*.out from the reference
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "datasets" / "code-opt"

KINDS = {"algorithmic", "memory_layout", "repeated_work", "io_buffering", "data_structure"}
LANGS = {"c": "c", "cpp": "cpp"}
FIELDS = ["id", "title", "language", "kind", "time_limit_s", "memory_limit_mb", "checker",
          "bench_time_limit_s"]
ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
CHECKER_RE = re.compile(r"^(exact|tokens|float:([0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?))$")
COMPILE = {
    "c": ["gcc", "-O2", "-std=c17", "-o", "{out}", "{src}", "-lm"],
    "cpp": ["g++", "-O2", "-std=c++17", "-o", "{out}", "{src}"],
}
# Timing expectations from the problem-set brief.
REF_MIN_S, REF_MAX_S = 0.2, 1.5
MIN_SPEEDUP = 3.0
BENCH_MAX_MB, BENCH_SOFT_MB = 40.0, 20.0
GEN_MAX_S, GEN_SOFT_S = 6.0, 3.0


EXAMPLE_RE = re.compile(r"Input:\s*\n```[a-z]*\n(.*?)```.*?Output:\s*\n```[a-z]*\n(.*?)```", re.S)


class Invalid(Exception):
    pass


# --------------------------------------------------------------------------- checkers
# The evaluator's own checker, so the problem set is validated with the semantics it is scored by.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elastic.reward.verifiers.code_opt.checkers import check as check_output  # noqa: E402
from elastic.sandbox.command import Limits  # noqa: E402


def load_problem(pdir: Path) -> dict:
    yf = pdir / "problem.yaml"
    rel = yf.relative_to(ROOT)
    if not yf.is_file():
        raise Invalid(f"{rel}: file missing")
    try:
        meta = yaml.safe_load(yf.read_text())
    except yaml.YAMLError as e:
        raise Invalid(f"{rel}: not valid YAML ({str(e).splitlines()[0]})")
    if not isinstance(meta, dict):
        raise Invalid(f"{rel}: top level must be a mapping")
    for f in FIELDS:
        if f not in meta:
            raise Invalid(f"{rel}: field '{f}' missing")
    for f in meta:
        if f not in FIELDS:
            raise Invalid(f"{rel}: field '{f}' unknown (allowed: {', '.join(FIELDS)})")
    pid = meta["id"]
    if not isinstance(pid, str) or not ID_RE.match(pid):
        raise Invalid(f"{rel}: field 'id' must be lowercase-with-hyphens, got {pid!r}")
    if pid != pdir.name:
        raise Invalid(f"{rel}: field 'id' is {pid!r} but the folder is {pdir.name!r}")
    t = meta["title"]
    if not isinstance(t, str) or not t.strip() or "\n" in t.strip():
        raise Invalid(f"{rel}: field 'title' must be a non-empty one-line string")
    if meta["language"] not in LANGS:
        raise Invalid(f"{rel}: field 'language' must be c or cpp, got {meta['language']!r}")
    if meta["kind"] not in KINDS:
        raise Invalid(f"{rel}: field 'kind' must be one of {sorted(KINDS)}, got {meta['kind']!r}")
    for f in ("time_limit_s", "bench_time_limit_s"):
        v = meta[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise Invalid(f"{rel}: field '{f}' must be a positive number, got {v!r}")
    v = meta["memory_limit_mb"]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise Invalid(f"{rel}: field 'memory_limit_mb' must be a positive integer, got {v!r}")
    c = meta["checker"]
    if not isinstance(c, str) or not CHECKER_RE.match(c):
        raise Invalid(f"{rel}: field 'checker' must be exact, tokens or float:<abs_tol>, got {c!r}")
    return meta


def find_source(base: Path, stem: str) -> Path:
    found = [p for p in (base / f"{stem}.c", base / f"{stem}.cpp") if p.is_file()]
    if len(found) != 1:
        raise Invalid(f"{base.relative_to(ROOT)}/{stem}.c|cpp: expected exactly one, found {len(found)}")
    return found[0]


def list_tests(pdir: Path) -> list[tuple[Path, Path]]:
    tdir = pdir / "tests"
    ins = sorted(tdir.glob("*.in")) if tdir.is_dir() else []
    pairs = []
    for i in ins:
        if not re.match(r"^\d{2,}$", i.stem):
            raise Invalid(f"{i.relative_to(ROOT)}: test name must be NN.in")
        o = i.with_suffix(".out")
        pairs.append((i, o))
    if len(pairs) < 4:
        raise Invalid(f"{tdir.relative_to(ROOT)}: need >= 4 test pairs, found {len(pairs)}")
    return pairs


# --------------------------------------------------------------------------- running
def compile_src(src: Path, out: Path) -> None:
    lang = "cpp" if src.suffix == ".cpp" else "c"
    cmd = [a.format(out=out, src=src) for a in COMPILE[lang]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["?"])[0]
        raise Invalid(f"{src.relative_to(ROOT)}: compile failed: {msg}")


@dataclass
class RunResult:
    rc: int
    wall: float
    maxrss_mb: float
    timed_out: bool
    cpu: float = 0.0
    stdout: bytes = b""


def run_prog(argv: list[str], stdin_path: Path, timeout: float, stdout_path: Path | None = None,
             pin: bool = True) -> RunResult:
    if pin and shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1:
        argv = ["taskset", "-c", str(os.cpu_count() - 1)] + argv
    with open(stdin_path, "rb") as fin:
        out_f = open(stdout_path, "wb") if stdout_path else subprocess.PIPE
        try:
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, stdin=fin, stdout=out_f, stderr=subprocess.DEVNULL)
            timed_out = False
            data = b""
            if stdout_path is None:
                try:
                    data, _ = p.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    data, _ = p.communicate()
                    timed_out = True
                ru = None  # already reaped by communicate(); memory is only checked on the bench
            else:
                deadline = t0 + timeout
                status, ru = 0, None
                while True:
                    pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                    if pid:
                        break
                    if time.perf_counter() > deadline:
                        p.kill()
                        _, status, ru = os.wait4(p.pid, 0)
                        timed_out = True
                        break
                    time.sleep(0.002)
                p.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
        finally:
            if stdout_path:
                out_f.close()
    rc = p.returncode
    rss = (ru.ru_maxrss / 1024.0) if ru is not None else 0.0
    cpu = (ru.ru_utime + ru.ru_stime) if ru is not None else wall
    return RunResult(rc=rc, wall=wall, maxrss_mb=rss, timed_out=timed_out, cpu=cpu, stdout=data)


# --------------------------------------------------------------------------- per problem
@dataclass
class Report:
    pid: str
    kind: str = "?"
    lang: str = "?"
    ref_s: float | None = None      # the timing used for checks (cpu or wall, see --wall)
    fast_s: float | None = None
    ref_wall: float | None = None
    fast_wall: float | None = None
    wrong_fails: str = "-"
    bench_mb: float | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_problem(pdir: Path, work: Path, args) -> Report:
    rep = Report(pid=pdir.name)
    try:
        meta = load_problem(pdir)
    except Invalid as e:
        rep.errors.append(str(e))
        return rep
    rep.kind, rep.lang = meta["kind"], meta["language"]
    try:
        ref_src = find_source(pdir, "reference")
        if ref_src.suffix.lstrip(".") != meta["language"]:
            raise Invalid(f"{ref_src.relative_to(ROOT)}: extension does not match field 'language' ({meta['language']})")
        fast_src = find_source(pdir / "solutions", "fast")
        wrong_src = find_source(pdir / "solutions", "wrong")
        for f in ("statement.md", "gen_bench.py"):
            if not (pdir / f).is_file():
                raise Invalid(f"{(pdir / f).relative_to(ROOT)}: file missing")
        tests = list_tests(pdir)
    except Invalid as e:
        rep.errors.append(str(e))
        return rep

    bins = {}
    wdir = work / pdir.name
    wdir.mkdir(parents=True, exist_ok=True)
    for name, src in (("reference", ref_src), ("fast", fast_src), ("wrong", wrong_src)):
        try:
            b = wdir / name
            compile_src(src, b)
            bins[name] = b
        except Invalid as e:
            rep.errors.append(str(e))
    if len(bins) < 3:
        return rep

    checker = meta["checker"]
    tl = float(meta["time_limit_s"])
    if args.regen_outputs:
        for tin, tout in tests:
            r = run_prog([str(bins["reference"])], tin, timeout=tl * 5, pin=False)
            if r.rc != 0 or r.timed_out:
                rep.errors.append(f"{tin.relative_to(ROOT)}: reference failed (rc={r.rc}) while regenerating")
            else:
                tout.write_bytes(r.stdout)

    # ---- tests
    wrong_failed = []
    for tin, tout in tests:
        trel = tin.relative_to(ROOT)
        if not tout.is_file():
            rep.errors.append(f"{tout.relative_to(ROOT)}: file missing")
            continue
        want = tout.read_bytes()
        for name in ("reference", "fast", "wrong"):
            r = run_prog([str(bins[name])], tin, timeout=tl, pin=False)
            if r.timed_out:
                ok, why = False, f"timeout > {tl}s"
            elif r.rc != 0:
                ok, why = False, f"exit code {r.rc}"
            else:
                ok, why = check_output(checker, r.stdout, want)
            if name == "wrong":
                if not ok:
                    wrong_failed.append(tin.stem)
            elif not ok:
                rep.errors.append(f"{trel}: {name} fails ({why})")
    rep.wrong_fails = ",".join(wrong_failed) if wrong_failed else "NONE"
    if not wrong_failed:
        rep.errors.append(f"{wrong_src.relative_to(ROOT)}: passes every test (must fail at least one)")

    # ---- the worked example in statement.md must match the reference
    text = (pdir / "statement.md").read_text()
    m = EXAMPLE_RE.search(text)
    if not m:
        rep.warnings.append("statement.md has no 'Input:'/'Output:' example to verify")
    else:
        ex_in = wdir / "example.in"
        ex_in.write_text(m.group(1))
        r = run_prog([str(bins["reference"])], ex_in, timeout=tl, pin=False)
        ok, why = check_output(checker, r.stdout, m.group(2).encode())
        if r.rc != 0 or not ok:
            rep.errors.append(f"{(pdir / 'statement.md').relative_to(ROOT)}: example output does not match "
                              f"the reference ({why or f'exit code {r.rc}'})")

    # ---- benchmark
    bench_in = wdir / "bench.in"
    t0 = time.perf_counter()
    with open(bench_in, "wb") as f:
        g = subprocess.run([sys.executable, str(pdir / "gen_bench.py")], stdout=f,
                           stderr=subprocess.PIPE, timeout=60)
    gen_s = time.perf_counter() - t0
    if g.returncode != 0:
        rep.errors.append(f"{(pdir / 'gen_bench.py').relative_to(ROOT)}: exit {g.returncode}: "
                          f"{(g.stderr.decode().strip().splitlines() or ['?'])[-1]}")
        return rep
    # determinism of the generator
    g2 = subprocess.run([sys.executable, str(pdir / "gen_bench.py")], capture_output=True, timeout=60)
    if g2.stdout != bench_in.read_bytes():
        rep.errors.append(f"{(pdir / 'gen_bench.py').relative_to(ROOT)}: output is not deterministic")
    if gen_s > GEN_MAX_S:
        rep.errors.append(f"gen_bench.py took {gen_s:.1f}s (> {GEN_MAX_S}s)")
    elif gen_s > GEN_SOFT_S:
        rep.warnings.append(f"gen_bench.py took {gen_s:.1f}s (> {GEN_SOFT_S}s)")
    mb = bench_in.stat().st_size / 1e6
    rep.bench_mb = mb
    if mb > BENCH_MAX_MB:
        rep.errors.append(f"bench input is {mb:.1f} MB (> {BENCH_MAX_MB} MB)")
    elif mb > BENCH_SOFT_MB:
        rep.warnings.append(f"bench input is {mb:.1f} MB (> {BENCH_SOFT_MB} MB)")

    btl = float(meta["bench_time_limit_s"])
    mem = float(meta["memory_limit_mb"])
    outs = {}
    times = {}
    walls = {}
    runs = 1 if args.skip_timing else args.runs
    for name in ("reference", "fast"):
        ts, ws = [], []
        for k in range(runs):
            outp = wdir / f"bench.{name}.out"
            r = run_prog([str(bins[name])], bench_in, timeout=btl, stdout_path=outp)
            if r.timed_out or r.rc != 0:
                rep.errors.append(f"bench: {name} {'timed out' if r.timed_out else f'exit code {r.rc}'}")
                break
            if r.maxrss_mb > mem:
                rep.errors.append(f"bench: {name} used {r.maxrss_mb:.0f} MB (> memory_limit_mb {mem:.0f})")
            ts.append(r.wall if args.wall else r.cpu)
            ws.append(r.wall)
            outs[name] = outp
        if ts:
            times[name] = statistics.median(ts)
            walls[name] = statistics.median(ws)
    rep.ref_s, rep.fast_s = times.get("reference"), times.get("fast")
    rep.ref_wall, rep.fast_wall = walls.get("reference"), walls.get("fast")
    if "reference" in outs and "fast" in outs:
        ok, why = check_output(checker, outs["fast"].read_bytes(), outs["reference"].read_bytes())
        if not ok:
            rep.errors.append(f"bench: fast output differs from reference ({why})")
        if outs["reference"].stat().st_size == 0:
            rep.errors.append("bench: reference output is empty")
        cap = Limits().stdout_bytes  # what the sandbox captures before killing a run
        if outs["reference"].stat().st_size > cap:
            rep.errors.append(f"bench: reference output is {outs['reference'].stat().st_size / 2**20:.1f} MiB, over the "
                              f"sandbox's stdout cap of {cap / 2**20:.0f} MiB")
    if not args.skip_timing and rep.ref_s is not None and rep.fast_s is not None:
        if not (REF_MIN_S <= rep.ref_s <= REF_MAX_S):
            rep.errors.append(f"bench: reference took {rep.ref_s:.3f}s {'wall' if args.wall else 'cpu'} "
                              f"(want {REF_MIN_S}-{REF_MAX_S}s)")
        sp = rep.ref_s / max(rep.fast_s, 1e-9)
        if sp < MIN_SPEEDUP:
            rep.errors.append(f"bench: speedup {sp:.1f}x < {MIN_SPEEDUP}x")
    return rep


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ID", help="check only these problem ids")
    ap.add_argument("--skip-timing", action="store_true", help="run the benchmark once, no timing checks")
    ap.add_argument("--runs", type=int, default=3, help="timed benchmark runs per program (median)")
    ap.add_argument("--wall", action="store_true",
                    help="check timings on wall-clock time instead of child CPU time (user+sys); "
                         "CPU time is the default because it is robust to a loaded machine")
    ap.add_argument("--regen-outputs", action="store_true", help="rewrite tests/*.out from the reference first")
    ap.add_argument("--keep", action="store_true", help="keep the build directory and print it")
    args = ap.parse_args()

    if not DATASET.is_dir():
        print(f"no dataset folder {DATASET}", file=sys.stderr)
        return 2
    pdirs = sorted(p for p in DATASET.iterdir() if p.is_dir())
    if args.only:
        missing = set(args.only) - {p.name for p in pdirs}
        if missing:
            print(f"unknown problem id(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
        pdirs = [p for p in pdirs if p.name in args.only]

    work = Path(tempfile.mkdtemp(prefix="check_problems_"))
    reports = []
    try:
        for p in pdirs:
            print(f"... {p.name}", file=sys.stderr, flush=True)
            reports.append(check_problem(p, work, args))
    finally:
        if args.keep:
            print(f"build dir: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    basis = "wall" if args.wall else "cpu"
    hdr = (f"{'id':<32} {'kind':<15} {'lang':<4} {'ref s':>7} {'fast s':>7} {'speedup':>8} "
           f"{'ref wall':>8} {'fastwall':>8} {'bench MB':>8}  wrong fails test #")
    print(f"timings: median of {args.runs} runs, pinned with taskset; 'ref s'/'fast s'/speedup use {basis} time")
    print(hdr)
    print("-" * len(hdr))
    for r in reports:
        sp = None if (r.ref_s is None or r.fast_s is None) else r.ref_s / max(r.fast_s, 1e-9)
        sps = "-" if sp is None else f"{sp:7.1f}x"
        print(f"{r.pid:<32} {r.kind:<15} {r.lang:<4} {fmt(r.ref_s, '7.3f')} {fmt(r.fast_s, '7.3f')} "
              f"{sps:>8} {fmt(r.ref_wall, '8.3f')} {fmt(r.fast_wall, '8.3f')} {fmt(r.bench_mb, '8.1f')}  {r.wrong_fails}")
    n_err = sum(len(r.errors) for r in reports)
    for r in reports:
        for w in r.warnings:
            print(f"WARNING {r.pid}: {w}")
    for r in reports:
        for e in r.errors:
            print(f"ERROR {r.pid}: {e}")
    kinds = {}
    langs = {}
    for r in reports:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
        langs[r.lang] = langs.get(r.lang, 0) + 1
    print(f"{len(reports)} problems; kinds: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
          + "; languages: " + ", ".join(f"{k}={v}" for k, v in sorted(langs.items())))
    print("OK" if n_err == 0 else f"FAILED: {n_err} violation(s)")
    return 0 if n_err == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
