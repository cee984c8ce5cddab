"""Execution feedback for multi-turn RL (issue 44): one door from a verifier's
:class:`~elastic.reward.result.Result` to a short message the policy sees as its next user turn.

``feedback_text(result, kind, mode, max_bytes, task=None) -> Optional[str]``

The text is built from the verifier's result only (statuses, reasons, compiler output, the
failing test's detail and printed output, all of which come from the sandbox's report), plus,
for ``details``, what the task itself already shows or allows: code_opt's failing test input
and expected output (the problem's own test files) and math_answer's gold answer when the task
sets ``reveal_answer`` (elastic/reward/tasks.py). Nothing else (no host paths, no timing, no
sandbox layers) is ever included.

- A passing result gives ``None`` (no feedback: the episode ends). So does ``sandbox_error``:
  that is the infrastructure's failure, not a verdict on the program, and the trainer drops it.
- ``mode="verdict"``: one line naming the verdict (math_answer: "wrong" only; the verifier's
  reason names the reference answer, so it is not shown).
- ``mode="details"``: code_opt adds the first lines of the compiler's diagnostics, or the first
  failing test (its name and checker reason, input, expected and actual output, each capped),
  or the timeout / memory verdict; python_tests adds the failing assertion or exception (the
  harness's detail) and the verdict; math_answer adds the gold answer only when the task allows.

The whole text is cut to ``max_bytes`` UTF-8 bytes (at a character boundary, ending with
:data:`MARKER`). The token cap ``rl.feedback_max_tokens`` is the caller's, after tokenizing
(``elastic.rl.algorithms.turns.cap_tokens``).

Where it runs: in the reward pool (elastic/reward/pool.py, for a submission whose
:class:`~elastic.reward.request.Request` names a mode), where the task and its tests are at
hand; the trainer gets the text as ``Result.feedback`` and applies the token cap.
"""

from __future__ import annotations

from typing import Any, List, Optional

from elastic.reward.result import Result

MODES = ("verdict", "details")
MARKER = "\n[truncated]"
FIELD_BYTES = 200  # each of a failing test's input / expected / actual
DIAG_LINES = 12  # compiler diagnostics: first lines
TRACE_BYTES = 600  # python_tests: the tail of the harness's detail

_VERDICTS = {
    "compile_error": "compilation failed",
    "syntax_error": "the program does not parse",
    "runtime_error": "runtime error",
    "timeout": "time limit exceeded",
    "memory_limit": "memory limit exceeded",
    "wrong_answer": "wrong answer",
}


def cut_bytes(text: str, max_bytes: int, marker: str = "") -> str:
    """``text`` if its UTF-8 encoding fits ``max_bytes``, else its head cut at a character
    boundary followed by ``marker``, the whole within ``max_bytes`` bytes."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    mark = marker.encode("utf-8")
    if len(mark) > max_bytes:
        mark = b""
    # errors="ignore" drops a multi-byte character the cut went through, never adds one
    return raw[:max_bytes - len(mark)].decode("utf-8", errors="ignore") + mark.decode("utf-8")


def _tail_bytes(text: str, max_bytes: int) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    return "..." + raw[len(raw) - (max_bytes - 3):].decode("utf-8", errors="ignore")


def _show(data: Any) -> str:
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="replace")
    return cut_bytes(str(data), FIELD_BYTES, " ...")


def _code_opt(result: Result, task: Any) -> List[str]:
    if result.status == "compile_error":
        lines = [ln for ln in result.compile_output.splitlines() if ln.strip()]
        out = [f"Verdict: compilation failed ({result.reason})" if result.reason else "Verdict: compilation failed"]
        if lines:
            out.append("Compiler output:\n" + "\n".join(lines[:DIAG_LINES]))
        return out
    failed = next((t for t in result.tests if t.status not in ("ok", "skipped")), None)
    if failed is None:  # the benchmark input (or a failure with no test named)
        return [f"Verdict: {_VERDICTS.get(result.status, result.status)}" + (f" ({result.reason})" if result.reason else "")]
    out = [f"Verdict: {_VERDICTS.get(failed.status, failed.status)} on test {failed.name}"
           + (f": {failed.detail}" if failed.detail else "")]
    problem = getattr(task, "problem", None)
    case = next((c for c in getattr(problem, "tests", []) or [] if c.name == failed.name), None)
    if case is not None:
        out.append("Input:\n" + _show(case.input))
    if failed.status == "wrong_answer":
        if case is not None:
            out.append("Expected output:\n" + _show(case.expected))
        out.append("Your output:\n" + _show(failed.output))
    return out


def _python_tests(result: Result) -> List[str]:
    failed = next((t for t in result.tests if t.status not in ("ok", "skipped")), None)
    if failed is None:  # the program did not load: the reason is the harness's detail
        out = [f"Verdict: {_VERDICTS.get(result.status, result.status)}"]
        if result.reason:
            out.append(_tail_bytes(result.reason, TRACE_BYTES))
        return out
    out = [f"Verdict: {_VERDICTS.get(failed.status, failed.status)} on {failed.name}"]
    if failed.detail:
        out.append(_tail_bytes(failed.detail, TRACE_BYTES))
    return out


def feedback_text(result: Result, kind: str, mode: str = "verdict", max_bytes: int = 1024,
                  task: Any = None) -> Optional[str]:
    """The feedback for one failed turn, or None (passed, or the infrastructure failed).

    ``kind``: the verifier's name (``code_opt``, ``python_tests``, ``math_answer``; any other gets
    its verdict line only). ``task``: the :class:`~elastic.reward.tasks.Task` the result is for
    (code_opt's failing test input/expected and math_answer's ``reveal_answer`` come from it;
    without it they are left out). The text never exceeds ``max_bytes`` UTF-8 bytes.
    """
    if mode not in MODES:
        raise ValueError(f"feedback: mode must be one of {'|'.join(MODES)}, got {mode!r}")
    if max_bytes < len(MARKER.encode("utf-8")) + 1:
        raise ValueError(f"feedback: max_bytes must be > {len(MARKER.encode('utf-8'))}, got {max_bytes}")
    if result.passed or result.status == "sandbox_error":
        return None
    if kind == "math_answer":
        parts = ["Your answer is wrong."]
        if mode == "details" and task is not None and getattr(task, "reveal_answer", False) is True \
                and getattr(task, "answer", None):
            parts.append(f"The correct answer is {task.answer}.")
    elif mode == "verdict":
        parts = [f"Verdict: {_VERDICTS.get(result.status, result.status)}."]
    elif kind == "code_opt":
        parts = _code_opt(result, task)
    elif kind == "python_tests":
        parts = _python_tests(result)
    else:
        parts = [f"Verdict: {_VERDICTS.get(result.status, result.status)}."]
    return cut_bytes("\n".join(parts), max_bytes, MARKER)
