"""``python -m elastic.reward --problem DIR --program FILE [--timing wall|instructions] [--json]``

Evaluates one program with the pool's code path (evaluate_completion: the pool's extract_code,
then the evaluate a pool actor runs) on a fenced block built from the file, language from the
file extension. Exit code 0 when an evaluation happened (whatever its status), 2 on bad
arguments or a malformed problem, 3 when the sandbox refuses to start (no working bubblewrap
and no ``--allow-weak-isolation``; one line on stderr says how to install it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import List, Optional

from elastic.reward.verifiers.code_opt.evaluator import evaluate_completion
from elastic.sandbox.isolation import SandboxUnavailable
from elastic.reward.verifiers.code_opt.problems import ProblemError, load_problem
from elastic.reward.result import Result
from elastic.reward.settings import EvalSettings

_EXT_TAG = {".c": "c", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".c++": "cpp"}


def _human(r: Result) -> str:
    lines = [f"problem   {r.problem_id}", f"status    {r.status}" + (f"  ({r.reason})" if r.reason else ""),
             f"reward    {r.reward:.4f}"]
    if r.speedup is not None and r.timing is not None:
        t = r.timing
        fmt = (lambda v: f"{v:.4f} s") if t.unit == "s" else (lambda v: f"{v:,.0f} instructions")
        lines += [f"speedup   {r.speedup:.3f}x", f"candidate {fmt(t.candidate)}  ({t.tool})",
                  f"reference {fmt(t.reference)}{'  (cached)' if t.reference_cached else ''}"]
    for t in r.tests:
        lines.append(f"  test {t.name:<8} {t.status:<14} {t.wall_s:.3f}s {t.detail}")
    if r.status == "compile_error" and r.compile_output:
        lines.append(r.compile_output.rstrip())
    active = [k for k, v in r.sandbox.items() if v and k != "running_as_root"]
    lines.append(f"sandbox   {', '.join(active)}")
    lines.append(f"duration  {r.duration_s:.2f} s")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m elastic.reward", description=__doc__.splitlines()[0])
    ap.add_argument("--problem", required=True, help="problem directory (datasets/code-opt/<id>)")
    ap.add_argument("--program", required=True, help="C/C++ source file, or a completion (.md/.txt) with a fenced block")
    ap.add_argument("--timing", choices=("wall", "instructions"), default="wall")
    ap.add_argument("--timing-runs", type=int, default=5)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print the Result as JSON")
    ap.add_argument("--allow-weak-isolation", action="store_true",
                    help="without a working bubblewrap, run under unshare or no namespaces instead of refusing")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        problem = load_problem(args.problem)
    except ProblemError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prog = Path(args.program)
    if not prog.is_file():
        print(f"error: --program {prog}: not found", file=sys.stderr)
        return 2
    text = prog.read_text(errors="replace")
    tag = _EXT_TAG.get(prog.suffix.lower())
    completion = f"```{tag}\n{text}\n```\n" if tag else text
    settings = EvalSettings(timing=args.timing, timing_runs=max(1, args.timing_runs),
                            allow_weak_isolation=args.allow_weak_isolation)
    if args.cache_dir:
        settings.cache_dir = args.cache_dir
    try:
        r = evaluate_completion(problem, completion, settings)
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    print(json.dumps(r.to_dict(), indent=2) if args.json else _human(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
