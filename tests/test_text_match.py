"""elastic/reward/verifiers/text_match.py: exact and regex verifiers, their reasons, bad patterns, long input."""

from __future__ import annotations

import time

import pytest

from elastic.reward.verifiers import text_match
from elastic.reward.verifiers.text_match import MAX_REGEX_CHARS, compile_pattern, exact_match, regex_match


@pytest.mark.parametrize("completion, reference, kwargs, expected", [
    ("Paris", "Paris", {}, True),
    ("  Paris \n", "Paris", {}, True),                                  # ends stripped
    ("New   York\n\tCity", "New York City", {}, True),                   # inner whitespace collapsed
    ("New York City", "New\nYork City ", {}, True),                      # on both sides
    ("paris", "Paris", {}, False),                                      # case matters by default
    ("paris", "Paris", {"ignore_case": True}, True),
    ("STRASSE", "straße", {"ignore_case": True}, True),                 # casefold, not lower
    (" Paris", "Paris", {"strip": False}, False),                       # strip=False: as written
    ("New  York", "New York", {"strip": False}, False),
    ("Paris", "Paris", {"strip": False}, True),
    ("Paris is the capital", "Paris", {}, False),                       # the whole completion counts
    ("Reasoning... Answer: Paris", "Paris", {"answer_prefix": "Answer:"}, True),
    ("Answer: Lyon. Wait. Answer:  Paris\n", "Paris", {"answer_prefix": "Answer:"}, True),  # the last prefix
    ("Answer: Paris, France", "Paris", {"answer_prefix": "Answer:"}, False),
    ("answer: paris", "Paris", {"answer_prefix": "Answer:"}, False),    # the prefix is matched exactly
    ("", "", {}, True),
])
def test_exact_match(completion, reference, kwargs, expected):
    passed, reason = exact_match(completion, reference, **kwargs)
    assert passed is expected
    assert (reason == "") is expected and "\n" not in reason


def test_exact_match_reasons():
    assert exact_match("Lyon", "Paris") == (False, "got 'Lyon', expected 'Paris'")
    assert exact_match("Paris", "Paris", answer_prefix="Answer:") == (False, "answer prefix 'Answer:' not found")
    passed, reason = exact_match("x" * 10_000, "y")
    assert not passed and len(reason) < 200
    assert exact_match(None, "Paris")[0] is False and exact_match("Paris", 3)[0] is False


@pytest.mark.parametrize("completion, pattern, fullmatch, expected", [
    ("The result is 42.", r"\b42\b", False, True),
    ("The result is 420.", r"\b42\b", False, False),
    ("yes", r"(?i)YES", False, True),
    ("42", r"\d+", True, True),
    ("42 apples", r"\d+", True, False),                                 # fullmatch needs all of it
    ("line1\nANSWER: B\n", r"^ANSWER: [A-D]$", False, False),           # no MULTILINE unless asked
    ("line1\nANSWER: B\n", r"(?m)^ANSWER: [A-D]$", False, True),
    ("", r"^$", True, True),
])
def test_regex_match(completion, pattern, fullmatch, expected):
    passed, reason = regex_match(completion, pattern, fullmatch=fullmatch)
    assert passed is expected
    assert (reason == "") is expected and "\n" not in reason


def test_regex_reasons():
    assert regex_match("abc", r"\d") == (False, r"pattern '\\d' not found")
    assert regex_match("abc", r"ab", fullmatch=True) == (False, "pattern 'ab' does not fully match")
    assert regex_match(None, r"\d")[0] is False


@pytest.mark.parametrize("bad", [r"(", r"[a-", r"*x", r"(?P<n>a)(?P<n>b)", 5, None])
def test_bad_pattern_is_a_one_line_value_error_naming_it(bad):
    with pytest.raises(ValueError) as ei:
        regex_match("anything", bad)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("regex_match:")
    if isinstance(bad, str):
        assert repr(bad) in msg
    with pytest.raises(ValueError):
        compile_pattern(bad)


def test_patterns_are_compiled_once():
    text_match._compile.cache_clear()
    for _ in range(100):
        regex_match("a1", r"[a-z]\d")
    info = text_match._compile.cache_info()
    assert info.misses == 1 and info.hits == 99
    assert compile_pattern(r"[a-z]\d") is compile_pattern(r"[a-z]\d")


def test_long_completions_are_capped():
    tail = "ANSWER 7"
    long = "x" * (5 * MAX_REGEX_CHARS) + tail
    assert regex_match(long, r"ANSWER \d")[0]                            # the end is read
    assert not regex_match("ANSWER 7" + "x" * (5 * MAX_REGEX_CHARS), r"ANSWER \d")[0]  # the far start is not
    passed, reason = regex_match(long, r".*", fullmatch=True)
    assert not passed and "longer than" in reason
    # a pattern that is quadratic in the text read (re.search retries a* at every start) stays
    # bounded on a hostile 1 MB completion, because only MAX_REGEX_CHARS of it are read
    t0 = time.perf_counter()
    assert not regex_match("a" * 1_000_000, r"a*b")[0]
    assert time.perf_counter() - t0 < 2.0
