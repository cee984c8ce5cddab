"""Text verifiers for RL rewards: exact match against a reference, and a regular-expression match.

Pure functions, standard library only. Each returns ``(passed, reason)`` with ``reason`` ``""`` on a
pass and one line otherwise, like :func:`elastic.reward.verifiers.code_opt.checkers.check`.

- :func:`exact_match` compares the whole completion (or the text after the last
  ``answer_prefix``) with the reference, by default after collapsing every run of whitespace to
  one space and stripping both ends.
- :func:`regex_match` searches (or, with ``fullmatch``, fully matches) a pattern. Patterns are
  compiled once (:func:`compile_pattern`, cached); a bad pattern is a ``ValueError`` with a
  one-line message naming it, which the caller should surface when the task is loaded (call
  :func:`compile_pattern` there), not on the first completion.

Completions are model output and may be anything: nothing here raises on a completion, and
:func:`regex_match` reads at most :data:`MAX_REGEX_CHARS` characters of it (the last ones; a
``fullmatch`` on a longer completion fails with a reason). Python's ``re`` has no timeout, so a
pattern with catastrophic backtracking (``(a+)+$``) can still take exponential time on a short
hostile input: the pattern is the task author's, and is trusted to be linear.
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Pattern, Tuple

MAX_REGEX_CHARS = 20_000
"""regex_match reads at most the last this many characters of a completion."""
_PREVIEW = 60


def _preview(s: str) -> str:
    s = " ".join(s.split())
    return repr(s if len(s) <= _PREVIEW else s[:_PREVIEW - 3] + "...")


def _norm(s: str, strip: bool, ignore_case: bool) -> str:
    if strip:
        s = " ".join(s.split())
    return s.casefold() if ignore_case else s


def exact_match(completion: str, reference: str, *, strip: bool = True, ignore_case: bool = False,
                answer_prefix: Optional[str] = None) -> Tuple[bool, str]:
    """Whether the completion equals the reference.

    ``answer_prefix`` (e.g. ``"Answer:"``): compare only the text after its *last* occurrence in
    the completion (to the end of the completion); a completion without it fails. ``strip``:
    collapse runs of whitespace (spaces, tabs, newlines) to one space and strip both ends of both
    sides; ``strip=False`` compares the strings as they are. ``ignore_case``: compare
    ``str.casefold()`` forms.
    """
    if not isinstance(completion, str):
        return False, f"completion is not text ({type(completion).__name__})"
    if not isinstance(reference, str):
        return False, f"reference is not text ({type(reference).__name__})"
    text = completion
    if answer_prefix:
        i = completion.rfind(answer_prefix)
        if i < 0:
            return False, f"answer prefix {_preview(answer_prefix)} not found"
        text = completion[i + len(answer_prefix):]
    got, want = _norm(text, strip, ignore_case), _norm(reference, strip, ignore_case)
    if got == want:
        return True, ""
    return False, f"got {_preview(got)}, expected {_preview(want)}"


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> Pattern[str]:
    return re.compile(pattern)


def compile_pattern(pattern: str) -> Pattern[str]:
    """The compiled pattern (cached); ``ValueError("regex_match: bad pattern '...': <why>")`` when
    it is not a string or does not compile. Call it at task-load time to reject bad configs early."""
    if not isinstance(pattern, str):
        raise ValueError(f"regex_match: pattern must be a string, got {type(pattern).__name__}")
    try:
        return _compile(pattern)
    except re.error as err:
        why = " ".join(str(err).split())
        raise ValueError(f"regex_match: bad pattern {pattern!r}: {why}") from None


def regex_match(completion: str, pattern: str, *, fullmatch: bool = False) -> Tuple[bool, str]:
    """Whether ``pattern`` is found in the completion (``re.search``), or matches all of it
    (``fullmatch=True``). Raises ValueError only for a bad pattern (see :func:`compile_pattern`)."""
    rx = compile_pattern(pattern)
    if not isinstance(completion, str):
        return False, f"completion is not text ({type(completion).__name__})"
    if fullmatch:
        if len(completion) > MAX_REGEX_CHARS:
            return False, f"completion of {len(completion)} characters is longer than {MAX_REGEX_CHARS} (fullmatch)"
        ok = rx.fullmatch(completion) is not None
    else:
        ok = rx.search(completion[-MAX_REGEX_CHARS:]) is not None
    if ok:
        return True, ""
    how = "does not fully match" if fullmatch else "not found"
    return False, f"pattern {_preview(pattern)} {how}"
