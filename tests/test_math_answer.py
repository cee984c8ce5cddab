"""elastic/reward/verifiers/math_answer.py: hand-labelled (completion, reference, expected) pairs for every
extraction and equivalence rule, reasons, bad input, and adversarial input speed."""

from __future__ import annotations

import time

import pytest

from elastic.reward.verifiers.math_answer import (MAX_TEXT_CHARS, answers_equal, extract_answer, normalize, reference_answer,
                                        score_math)

GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
MATH_SOLUTION = r"The distance is $\sqrt{(3-0)^2+(4-0)^2} = \boxed{5}$."

# (completion, reference, expected). Labelled by hand, one rule per line where possible.
CASES = [
    # --- extraction: \boxed / \fbox (last one, balanced braces) ---
    (r"So the answer is \boxed{\frac{1}{2}}.", "0.5", True),
    (r"\boxed{3}", "4", False),
    (r"First \boxed{4}, no wait, \boxed{3}.", "3", True),                      # the last box counts
    (r"First \boxed{4}, no wait, \boxed{3}.", "4", False),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", True),                 # nested braces
    (r"The result is \fbox{42}", "42", True),
    (r"$\boxed 7$", "7", True),                                                  # brace-less box
    (r"\boxed{5} and then I started \boxed{", "5", True),                       # unclosed last box
    (r"\boxed{x=5}", "5", True),
    # --- extraction: GSM8K #### ---
    ("She has 3 + 4 = 7 apples.\n#### 7", "7", True),
    ("#### 1,234", "1234", True),
    ("#### $1,234.00", "1234", True),
    ("#### 72", GSM8K_SOLUTION, True),                                           # reference is a solution
    ("#### 71", GSM8K_SOLUTION, False),
    ("Work: 10 then 20\n#### 20\nextra 99", "20", True),                         # only the #### line
    # --- extraction: "the answer is" / "Answer:" ---
    ("The answer is 12 apples.", "12", True),
    ("So the final answer is 3.5. I hope it is correct.", "3.5", True),
    ("Answer: 18", "18", True),
    ("answer: -4", "-4", True),
    ("The answer is: \n\n 9", "9", True),
    ("The answer is $\\frac{3}{4}$.", "0.75", True),
    ("The answer is **42**", "42", True),
    ("The answer is 12 apples.", "13", False),
    # --- extraction: last number ---
    ("I computed 3 + 4 and got 7", "7", True),
    ("First 5 then 6, total 1,000 items", "1000", True),
    ("It costs $2.50 each, so 4 cost 10", "10", True),
    ("the ratio is 3/4", "0.75", True),
    ("we get -3", "-3", True),
    ("there is no number here at all", "5", False),
    ("", "5", False),
    # --- equivalence: numbers ---
    (r"\boxed{72.0}", "72", True),
    (r"\boxed{72.5}", "72", False),
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{0.33333}", r"\frac{1}{3}", False),                                # 1e-6 relative: too coarse
    (r"\boxed{0.3333333333}", r"\frac{1}{3}", True),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),                              # exact rationals
    (r"\boxed{\dfrac{1}{2}}", r"\tfrac12", True),
    (r"\boxed{1/2}", r"\frac{1}{2}", True),
    (r"\boxed{-\frac{1}{2}}", "-0.5", True),
    (r"\boxed{\frac{-1}{2}}", "-0.5", True),
    (r"\boxed{-\frac{1}{2}}", "0.5", False),
    (r"\boxed{2\frac{1}{2}}", r"\frac{5}{2}", True),                             # mixed number
    (r"\boxed{\sqrt{2}}", r"\sqrt2", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{\sqrt{2}}", "1.41421356", True),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}", False),
    (r"\boxed{2\pi}", r"6.283185307", True),
    (r"\boxed{50\%}", "50", True),
    (r"\boxed{50\%}", "0.5", False),                                             # percent signs are dropped, not divided
    (r"\boxed{90^\circ}", "90", True),
    (r"\boxed{\$18.90}", "18.9", True),
    (r"\boxed{12\text{ cm}}", "12", True),
    (r"\boxed{5 \text{ dollars}}", r"5", True),
    (r"\boxed{2^{10}}", "1024", True),
    (r"\boxed{10{,}000}", "10000", True),                                       # LaTeX thousands separators
    (r"\boxed{10\,000}", "10,000", True),
    (r"\boxed{12\text{ cm}^2}", "12", True),
    ("The answer is \u22125", "-5", True),                                      # unicode minus
    (r"\boxed{10^{10^{10}}}", "1", False),                                       # huge power: no hang, no match
    # --- equivalence: tuples, intervals, sets, text ---
    (r"\boxed{(3, 4)}", "(3,4)", True),
    (r"\boxed{\left( 3, 4 \right)}", "(3, 4)", True),
    (r"\boxed{(0.5, 1)}", r"(\frac12, 1)", True),
    (r"\boxed{(4, 3)}", "(3, 4)", False),                                        # tuples are ordered
    (r"\boxed{[1, 2)}", "[1, 2)", True),
    (r"\boxed{[1, 2)}", "[1, 2]", False),                                        # closed vs half-open
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]", True),
    (r"\boxed{\{2, 1\}}", r"\{1, 2\}", True),                                    # sets are unordered
    (r"\boxed{1, -2}", "-2, 1", True),                                           # so are lists of solutions
    (r"\boxed{\text{Yes}}", "yes", True),
    (r"\boxed{\text{(B)}}", "(B)", True),
    (r"\boxed{2x+1}", "2x + 1", True),
    (r"\boxed{2x+1}", "1+2x", False),                                            # no symbolic algebra
    (MATH_SOLUTION.replace("5", "5.0"), MATH_SOLUTION, True),                    # reference is a MATH solution
]


@pytest.mark.parametrize("completion, reference, expected", CASES)
def test_labelled_pairs(completion, reference, expected):
    passed, reason = score_math(completion, reference)
    assert passed is expected, (completion, reference, reason)
    assert (reason == "") is expected
    assert "\n" not in reason


def test_there_are_enough_labelled_pairs_on_both_sides():
    assert len(CASES) >= 40
    assert sum(e for _, _, e in CASES) >= 20 and sum(not e for _, _, e in CASES) >= 15


def test_extraction_order_and_values():
    assert extract_answer(r"#### 5 but \boxed{6}") == "6"                # box beats ####
    assert extract_answer("The answer is 4.\n#### 5") == "5"             # #### beats "answer is"
    assert extract_answer("The answer is 4. Then 9 more.") == "4"        # "answer is" beats last number
    assert extract_answer("values 1, 2 and 3") == "3"
    assert extract_answer(r"\boxed{\frac{\sqrt{3}}{2}}") == r"\frac{\sqrt{3}}{2}"
    assert extract_answer("nothing") is None
    assert extract_answer(r"\boxed{}") is None
    assert extract_answer("x" * (2 * MAX_TEXT_CHARS) + " 7") == "7"
    assert extract_answer("8 " + "x" * (2 * MAX_TEXT_CHARS)) is None     # only the tail is read


def test_reference_extraction():
    assert reference_answer(GSM8K_SOLUTION) == "72"
    assert reference_answer(MATH_SOLUTION) == "5"
    assert reference_answer("(3, 4)") == "(3, 4)"
    assert reference_answer(72) == "72"
    assert reference_answer("") is None and reference_answer(None) is None


def test_normalisation():
    assert normalize(r"\dfrac12") == r"\frac{1}{2}"
    assert normalize(r"\frac1{72}") == r"\frac{1}{72}"
    assert normalize(r"\sqrt3") == r"\sqrt{3}"
    assert normalize(r"\left( 1, 2 \right)") == "(1,2)"
    assert normalize(r"x = 5") == "5"
    assert normalize(r"5\text{ cm}") == "5"
    assert normalize(r"\text{cm}") == "cm"                                # nothing before it: kept
    assert normalize(r"10^{\circ}") == "10"
    assert normalize(r"3/4") == r"\frac{3}{4}"
    assert normalize(".5") == "0.5"


def test_reasons():
    assert score_math("no digits", "5") == (False, "no final answer found")
    assert score_math(r"\boxed{3}", "4") == (False, "answer '3' != reference '4'")
    assert score_math(r"\boxed{3}", "") == (False, "reference has no answer")
    passed, reason = score_math(r"\boxed{" + "9" * 500 + "}", "1")
    assert not passed and len(reason) < 250


@pytest.mark.parametrize("bad", [None, 3, b"\\boxed{3}", ["x"], "\\boxed{", "\\boxed{{{", "}}}}", "\\frac{", "$$",
                                 "\\sqrt[", "#### ", "answer is", "\x00\ud800", "1/0", "\\frac{1}{0}",
                                 "(((((((", "\\boxed{" + "(" * 500 + "}", "2^{-}", "0^{-1}", "(-8)^{1/3}",
                                 "\\sqrt{-4}", "1e99999", "\\boxed{1e308*1e308}"])
def test_never_raises(bad):
    extract_answer(bad)
    reference_answer(bad)
    assert answers_equal(bad, bad) in (True, False)
    assert answers_equal("1", bad) in (True, False)
    passed, reason = score_math(bad, bad)
    assert isinstance(passed, bool) and isinstance(reason, str)


def test_division_by_zero_is_not_a_number():
    assert not answers_equal(r"\frac{1}{0}", r"\frac{2}{0}")
    assert answers_equal(r"\frac{1}{0}", r"\frac{1}{0}")                  # identical strings still match


@pytest.mark.parametrize("name, text", [
    ("boxes", "\\boxed{" * 15_000),
    ("braces", "{" * 50_000 + "}" * 50_000),
    ("digits", "1" * 100_000),
    ("commas", "1," * 50_000),
    ("answer-is", "answer is " * 10_000),
    ("hashes", "#" * 100_000),
    ("fracs", "\\frac" * 20_000),
    ("sets", " " * 90_000 + "\\boxed{" + "{1," * 300 + "}" * 300 + "}"),
    ("mixed", ("\\boxed{\\frac{\\sqrt{" + "1,2/3." * 10 + "}}{x}} answer: 12 #### ") * 1_500),
    ("power", " " * 99_000 + "\\boxed{" + "2^{" * 300 + "9" + "}" * 301),
    ("nested-tuples", " " * 90_000 + "\\boxed{" + "(1,(" * 240 + "2" + "))" * 240 + "}"),
    ("long-answer", " " * 90_000 + "\\boxed{" + "(1,2)," * 1_600 + "}"),
    ("sqrt-chain", " " * 90_000 + "\\boxed{" + "\\sqrt{" * 120 + "2" + "}" * 121),
])
def test_adversarial_100kb_is_fast(name, text):
    assert len(text) >= 90_000
    t0 = time.perf_counter()
    pred = extract_answer(text)
    answers_equal(pred or "", pred or "")
    answers_equal(pred or "", "12")
    score_math(text, text)
    assert time.perf_counter() - t0 < 0.5, name
