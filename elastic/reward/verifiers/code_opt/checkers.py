"""Compare a program's output with the expected one (the ``checker`` field of problem.yaml).

* ``exact``: byte-equal after stripping trailing whitespace on each line and trailing newlines;
* ``tokens``: whitespace-separated tokens equal;
* ``float:<tol>``: same token count; numeric tokens within ``tol`` absolute (or relative for
  large magnitudes: ``|a-b| <= tol * max(1, |b|)``), other tokens equal.
"""

from __future__ import annotations

import math
from typing import Tuple


def _norm_exact(b: bytes) -> bytes:
    return b"\n".join(line.rstrip() for line in b.split(b"\n")).rstrip(b"\n")


def check(checker: str, output: bytes, expected: bytes) -> Tuple[bool, str]:
    """(passed, one-line reason when not)."""
    if checker == "exact":
        if _norm_exact(output) == _norm_exact(expected):
            return True, ""
        a, b = _norm_exact(output).split(b"\n"), _norm_exact(expected).split(b"\n")
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return False, f"line {i + 1} differs"
        return False, f"{len(a)} lines, expected {len(b)}"
    got, exp = output.split(), expected.split()
    if len(got) != len(exp):
        return False, f"{len(got)} tokens, expected {len(exp)}"
    if checker == "tokens":
        for i, (x, y) in enumerate(zip(got, exp)):
            if x != y:
                return False, f"token {i + 1} differs"
        return True, ""
    if checker.startswith("float:"):
        tol = float(checker.split(":", 1)[1])
        for i, (x, y) in enumerate(zip(got, exp)):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                return False, f"token {i + 1} differs"
            if not (math.isfinite(fx) and abs(fx - fy) <= tol * max(1.0, abs(fy))):
                return False, f"token {i + 1}: {fx!r} vs {fy!r} beyond {tol}"
        return True, ""
    raise ValueError(f"unknown checker {checker!r}")
