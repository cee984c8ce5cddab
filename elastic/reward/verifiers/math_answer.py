"""Final-answer verification for math problems: extract the answer, compare with the reference.

Pure functions, standard library only; they never raise on any input (a failure is a False or
a ``None``) and take time linear in the input: only the last :data:`MAX_TEXT_CHARS` characters of a
completion are read, an extracted answer is cut at :data:`MAX_ANSWER_CHARS`, and no regular
expression here can backtrack catastrophically (each is a single pass of literal runs and
disjoint character classes).

Extraction (:func:`extract_answer`), first rule that yields a non-empty answer wins:

1. the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces, nesting allowed; also the
   brace-less ``\\boxed 5``); a truncated, unclosed last box falls back to the one before it;
2. GSM8K's ``#### <answer>``: the rest of the line after the last ``####``;
3. the last "answer is X" / "Answer: X" (case-insensitive, so also "The final answer is X"): X
   is the rest of that line, cut at the first sentence end (". " ), trailing "." dropped;
4. the last number in the text (``-12``, ``1,234``, ``3.5``, ``3/4``).

The answer of rules 2-4 loses surrounding ``$`` / ``**`` / ``\\( \\)``; trailing plain words after a
number are dropped ("12 apples" -> "12").

A reference (:func:`reference_answer`) may be a bare answer, a GSM8K solution ending in
``#### 72`` or a MATH solution with a ``\\boxed{}``; only rules 1 and 2 are applied to it (a bare
reference like "(3, 4)" is used as it is).

Equivalence (:func:`answers_equal`) after Hendrycks-MATH-style normalisation (:func:`normalize`:
drop ``$``, ``\\left``/``\\right``, ``\\!``/``\\,``/``\\;``/``\\:``, ``^\\circ``, ``\\%``/``%``, a trailing
``\\text{unit}``, spaces and a final "."; ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\frac12`` ->
``\\frac{1}{2}``; ``\\sqrt2`` -> ``\\sqrt{2}``; a leading ``x=`` with a left side of <= 2 characters;
``\\text{X}`` -> ``X``; ``\\{ \\}`` -> ``{ }``; ``{,}`` -> ``,``; unicode minus -> ``-``):

- equal normalised strings are equal (purely alphabetic answers compare case-insensitively);
- numbers: both sides are evaluated when they are arithmetic in numbers (``1,000``, ``-72.0``,
  ``\\frac{a}{b}``, ``a/b``, mixed numbers ``2\\frac{1}{2}``, ``\\sqrt{}``, ``\\sqrt[n]{}``, ``\\pi``,
  ``+ - * / ^``, ``\\cdot``, ``\\times``, implicit products such as ``2\\sqrt{3}``). Two exact
  rationals (integers and fractions only) must be equal exactly; otherwise (a decimal point,
  a root or pi on either side) they must agree to a relative tolerance of :data:`REL_TOL`;
- tuples and intervals ``(a, b)``, ``[a, b)`` compare element by element with the same brackets;
  sets ``{a, b}`` and bare lists ``a, b`` compare as multisets;
- anything else (expressions in variables, text) must match as normalised strings.

Where this matches or differs from verl (``verl/utils/reward_score/math.py``, ``gsm8k.py``), as read
from those files:

- verl's ``math.compute_score`` scores only the last ``\\boxed``/``\\fbox`` (``last_boxed_only_string``)
  and is 0 without one; we fall back to rules 2-4. Its ``strip_string`` is the same Hendrycks
  normalisation we follow (``_fix_fracs``, ``_fix_sqrt``, ``_fix_a_slash_b``, ``\\text{ `` units,
  ``k = `` prefixes), and its ``is_equiv`` is string equality after it, with one numeric special
  case (``0.5`` -> ``\\frac{1}{2}``). We add numeric equality, so ``0.25`` == ``\\frac14``,
  ``72.0`` == ``72`` and ``1,000`` == ``1000``, which verl's ``math`` scores as wrong.
- verl's ``gsm8k.compute_score`` (``method='strict'``) takes the *first* ``#### `` followed by
  ``[-0-9.,]+``, removes commas and ``$`` and compares strings exactly with the ground truth
  (``72.0`` != ``72``); ``'flexible'`` takes the last number. We take the *last* ``####`` and
  compare numerically.
- verl's math-verify / Prime scorers (sympy-based symbolic equivalence) are not reproduced: an
  expression in variables (``2x+2`` vs ``2(x+1)``) only matches as an identical normalised string.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import List, NamedTuple, Optional, Tuple, Union

MAX_TEXT_CHARS = 10_000
"""Only the last this many characters of a completion are searched for the final answer."""
MAX_ANSWER_CHARS = 1_000
"""An extracted (or reference) answer is cut to this many characters before normalisation."""
REL_TOL = 1e-6
"""Relative tolerance for numbers that are not both exact rationals."""
_MAX_DEPTH = 40  # nesting depth for the expression evaluator and element-wise comparison
_MAX_ELEMENTS = 64  # elements of a tuple / set compared element-wise
_PREVIEW = 80  # characters of an answer shown in a reason

# ---------------------------------------------------------------------------------------------
# extraction

_BOX_CMDS = ("\\boxed", "\\fbox")
_ANSWER_IS = re.compile(r"answer\s*(?:is\b\s*:?|:)", re.IGNORECASE)
# A number in prose: not glued to a word or a decimal point before it; thousands groups or
# plain digits, an optional decimal part and an optional "/denominator". Disjoint classes, no
# nested quantifiers over the same characters: linear time.
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


def _brace_matches(text: str) -> dict:
    """``{index of '{': index of its matching '}'}`` for every balanced pair, one pass."""
    stack: List[int] = []
    match = {}
    for m in re.finditer(r"[{}]", text):
        i = m.start()
        if text[i] == "{":
            stack.append(i)
        elif stack:
            match[stack.pop()] = i
    return match


def _last_boxed(text: str) -> Optional[str]:
    """Content of the last balanced ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed X``), else None."""
    starts = []
    for cmd in _BOX_CMDS:
        i = text.find(cmd)
        while i >= 0:
            starts.append((i, i + len(cmd)))
            i = text.find(cmd, i + 1)
    if not starts:
        return None
    starts.sort()
    match = _brace_matches(text)
    for start, after in reversed(starts):
        j = after
        if text.startswith("{", j):
            end = match.get(j)
            if end is not None and text[j + 1:end].strip():
                return text[j + 1:end]
            continue
        if j < len(text) and text[j] == " ":  # "\boxed 5": up to the next space or "$"
            m = re.match(r" +([^\s$]+)", text[j:j + MAX_ANSWER_CHARS])
            if m:
                return m.group(1)
    return None


def _after_hashes(text: str) -> Optional[str]:
    i = text.rfind("####")
    if i < 0:
        return None
    line = text[i + 4:i + 4 + MAX_ANSWER_CHARS].split("\n", 1)[0]
    return line.strip().lstrip("#").strip() or None


def _after_answer_is(text: str) -> Optional[str]:
    last = None
    for last in _ANSWER_IS.finditer(text):
        pass
    if last is None:
        return None
    rest = text[last.end():last.end() + MAX_ANSWER_CHARS].lstrip()
    line = rest.split("\n", 1)[0]
    m = re.search(r"\.\s", line)  # sentence end; "3.5" has no space after its point
    if m:
        line = line[:m.start()]
    return line.strip() or None


def _last_number(text: str) -> Optional[str]:
    last = None
    for last in _NUMBER_IN_TEXT.finditer(text):
        pass
    return last.group(0) if last is not None else None


def _unwrap(ans: str) -> str:
    """Drop markdown bold, surrounding ``$``/``\\( \\)``/``\\[ \\]`` and a final period."""
    s = ans.strip()
    for _ in range(3):
        before = s
        s = s.strip("*").strip()
        for a, b in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b):
                s = s[len(a):len(s) - len(b)].strip()
        s = s.rstrip(".").strip()
        if s == before:
            break
    return s


def _drop_trailing_words(ans: str) -> str:
    """``"12 apples"`` -> ``"12"``: plain words after a number are units or prose, not the answer."""
    toks = ans.split()
    n = len(toks)
    while n > 1 and toks[n - 1].rstrip(".,;:!?").isalpha():
        n -= 1
    if n == len(toks):
        return ans
    head = " ".join(toks[:n])
    return head if _to_number(normalize(head)) is not None else ans


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a completion (rules in the module doc), or None when there is none."""
    try:
        if not isinstance(text, str) or not text:
            return None
        tail = text[-MAX_TEXT_CHARS:]
        boxed = _last_boxed(tail)
        if boxed is not None:
            return _drop_trailing_words(boxed.strip()[:MAX_ANSWER_CHARS])
        for rule in (_after_hashes, _after_answer_is, _last_number):
            ans = rule(tail)
            if ans:
                ans = _drop_trailing_words(_unwrap(ans))
                if ans:
                    return ans[:MAX_ANSWER_CHARS]
        return None
    except Exception:  # never raise on model output
        return None


def reference_answer(reference: Union[str, int, float]) -> Optional[str]:
    """The answer inside a reference: the last ``\\boxed{}``, else the text after the last
    ``####`` (GSM8K solutions), else the reference itself (numbers are turned into text)."""
    try:
        if isinstance(reference, bool) or not isinstance(reference, (str, int, float, Fraction)):
            return None
        ref = str(reference).strip()
        if not ref:
            return None
        tail = ref[-MAX_TEXT_CHARS:]
        boxed = _last_boxed(tail) if "box" in tail else None
        if boxed is not None:
            return boxed.strip()[:MAX_ANSWER_CHARS]
        after = _after_hashes(tail)
        if after is not None:
            return _unwrap(after)[:MAX_ANSWER_CHARS] or None
        return ref[:MAX_ANSWER_CHARS]
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# normalisation (Hendrycks MATH's strip_string, extended)

def _group_end(s: str, i: int) -> int:
    """``s[i] == '{'``: index just past its matching '}', or -1."""
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _fix_command_args(s: str, cmd: str, nargs: int) -> str:
    """Brace the single-character arguments of ``cmd``: ``\\frac12`` -> ``\\frac{1}{2}``,
    ``\\frac1{72}`` -> ``\\frac{1}{72}``, ``\\sqrt3`` -> ``\\sqrt{3}``."""
    out: List[str] = []
    i = 0
    n = len(s)
    while True:
        j = s.find(cmd, i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        k = j + len(cmd)
        if k < n and s[k].isalpha():  # another command that starts the same (\fracX is not one)
            out.append(s[i:k])
            i = k
            continue
        out.append(s[i:k])
        if cmd == "\\sqrt" and k < n and s[k] == "[":  # \sqrt[3]{x}: keep the index as it is
            close = s.find("]", k)
            if close < 0:
                out.append(s[k:])
                return "".join(out)
            out.append(s[k:close + 1])
            k = close + 1
        for _ in range(nargs):
            if k >= n:
                break
            if s[k] == "{":
                e = _group_end(s, k)
                if e < 0:
                    break
                out.append(s[k:e])
                k = e
            elif s[k] == "\\":
                break  # \frac\pi2 and the like: leave as written
            else:
                out.append("{" + s[k] + "}")
                k += 1
        i = k


_UNIT_POWER = re.compile(r"\^(?:\d|\{\d\})")


def _drop_trailing_text(s: str) -> str:
    """Drop a trailing ``\\text{...}`` / ``\\mbox{...}`` / ``\\mathrm{...}`` unit (``\\text{ cm}^2``
    included) when something precedes it."""
    for cmd in ("\\text", "\\mbox", "\\mathrm", "\\textbf"):
        j = s.rfind(cmd + "{")
        if j <= 0 or not s[:j].strip():
            continue
        e = _group_end(s, j + len(cmd))
        if e == len(s) or (e > 0 and _UNIT_POWER.fullmatch(s, e)):
            return s[:j].rstrip()
    return s


def _unwrap_text(s: str) -> str:
    """``\\text{X}`` / ``\\textbf{X}`` / ``\\mbox{X}`` / ``\\mathrm{X}`` -> ``X`` (balanced)."""
    for cmd in ("\\textbf{", "\\text{", "\\mbox{", "\\mathrm{"):
        guard = 0
        j = s.find(cmd)
        while j >= 0 and guard < 100:
            guard += 1
            e = _group_end(s, j + len(cmd) - 1)
            if e < 0:
                break
            s = s[:j] + s[j + len(cmd):e - 1] + s[e:]
            j = s.find(cmd, j)
    return s


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) == 2 and re.fullmatch(r"-?\d+", parts[0]) and re.fullmatch(r"\d+", parts[1]):
        sign = "-" if parts[0].startswith("-") else ""
        return f"{sign}\\frac{{{parts[0].lstrip('-')}}}{{{parts[1]}}}"
    return s


def normalize(answer: str) -> str:
    """Hendrycks-MATH-style canonical form of one answer (see the module doc); ``""`` for a non-string."""
    if not isinstance(answer, str):
        return ""
    s = answer[:MAX_ANSWER_CHARS].strip().replace("\n", " ")
    s = s.replace("\\!", "").replace("\\displaystyle", "").replace("\u2212", "-")
    s = s.replace("{,}", ",")  # LaTeX thousands separator: 10{,}000
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    for sp in ("\\,", "\\;", "\\:", "\\ ", "\\quad", "\\qquad"):
        s = s.replace(sp, " ")
    s = s.replace("\\{", "{").replace("\\}", "}")
    s = s.strip()
    s = _drop_trailing_text(s)
    s = _unwrap_text(s)
    s = s.strip().rstrip(".").strip()
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if s.count("=") == 1:  # "x = 5", "k=3": a short left side is a name, not part of the answer
        lhs, rhs = s.split("=")
        if len(lhs.strip()) <= 2 and rhs.strip():
            s = rhs
    s = _fix_command_args(s, "\\sqrt", 1)
    s = s.replace(" ", "")
    s = _fix_command_args(s, "\\frac", 2)
    s = _fix_a_slash_b(s)
    if s.startswith("+") and len(s) > 1:
        s = s[1:]
    return s


# ---------------------------------------------------------------------------------------------
# numbers: a small exact/approximate evaluator for arithmetic in numbers

class _Num(NamedTuple):
    value: Union[Fraction, float]
    exact: bool  # built from integers and fractions only (no decimal point, root or pi)


class _ParseError(Exception):
    pass


_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LITERAL = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_SCI = re.compile(r"(?:e|E)[+-]?\d{1,4}")
_MULS = ("\\cdot", "\\times", "*")
_DIVS = ("\\div", "/")
_MAX_BITS = 4096  # exact powers larger than this are computed in floating point


def _mul(a: _Num, b: _Num) -> _Num:
    if a.exact and b.exact:
        return _Num(a.value * b.value, True)
    return _Num(float(a.value) * float(b.value), False)


def _div(a: _Num, b: _Num) -> _Num:
    if b.value == 0:
        raise _ParseError("division by zero")
    if a.exact and b.exact:
        return _Num(a.value / b.value, True)
    return _Num(float(a.value) / float(b.value), False)


def _add(a: _Num, b: _Num, sign: int) -> _Num:
    if a.exact and b.exact:
        return _Num(a.value + sign * b.value, True)
    return _Num(float(a.value) + sign * float(b.value), False)


def _pow(a: _Num, b: _Num) -> _Num:
    if a.exact and b.exact and b.value.denominator == 1:
        e = b.value.numerator
        bits = max(a.value.numerator.bit_length(), a.value.denominator.bit_length())
        if abs(e) <= 256 and bits * abs(e) <= _MAX_BITS and not (a.value == 0 and e < 0):
            return _Num(a.value ** e, True)
    try:
        v = math.pow(float(a.value), float(b.value))
    except (OverflowError, ValueError, ZeroDivisionError) as err:
        raise _ParseError(str(err)) from None
    if isinstance(v, complex) or math.isnan(v) or math.isinf(v):
        raise _ParseError("not a real number")
    return _Num(v, False)


def _root(x: _Num, n: _Num) -> _Num:
    if not (n.exact and n.value.denominator == 1 and n.value.numerator >= 2):
        raise _ParseError("root index")
    k = n.value.numerator
    v = x.value
    if v < 0 and k % 2 == 0:
        raise _ParseError("even root of a negative number")
    if x.exact:  # exact root of an exact perfect power stays exact (\sqrt{4} = 2)
        num, den = v.numerator, v.denominator
        rn, rd = _int_root(abs(num), k), _int_root(den, k)
        if rn is not None and rd is not None:
            return _Num(Fraction(rn if num >= 0 else -rn, rd), True)
    f = float(v)
    r = abs(f) ** (1.0 / k)
    return _Num(-r if f < 0 else r, False)


def _int_root(m: int, k: int) -> Optional[int]:
    if m.bit_length() > _MAX_BITS:
        return None
    r = round(m ** (1.0 / k)) if m < 2 ** 1000 else None
    if r is None:
        return None
    for c in (r - 1, r, r + 1):
        if c >= 0 and c ** k == m:
            return c
    return None


class _Parser:
    """Recursive descent over a normalised answer (no spaces):

    expr := term (('+'|'-') term)* ; term := unary ((mul|div)? unary)* (empty operator: implicit
    product) ; unary := ('-'|'+') unary | power ; power := atom ('^' (group | digit | atom))? ;
    atom := number | mixed number | \\frac{.}{.} | \\sqrt[n]{.} | \\pi | (expr) | {expr}.
    """

    def __init__(self, s: str):
        self.s = s
        self.i = 0
        self.depth = 0

    def parse(self) -> _Num:
        v = self.expr()
        if self.i != len(self.s):
            raise _ParseError(f"unexpected {self.s[self.i:self.i + 10]!r}")
        return v

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _ParseError("too deep")

    def _peek(self, tok: str) -> bool:
        return self.s.startswith(tok, self.i)

    def _eat(self, tok: str) -> bool:
        if self.s.startswith(tok, self.i):
            self.i += len(tok)
            return True
        return False

    def expr(self) -> _Num:
        self._enter()
        v = self.unary()
        while self.i < len(self.s) and self.s[self.i] in "+-":
            sign = 1 if self.s[self.i] == "+" else -1
            self.i += 1
            v = _add(v, self.unary(), sign)
        self.depth -= 1
        return v

    def unary(self) -> _Num:
        self._enter()
        if self._eat("-"):
            v = self.unary()
            v = _Num(-v.value, v.exact)
        elif self._eat("+"):
            v = self.unary()
        else:
            v = self.term()
        self.depth -= 1
        return v

    def term(self) -> _Num:
        v = self.power()
        while self.i < len(self.s):
            op = next((m for m in _MULS if self._peek(m)), None) or next((d for d in _DIVS if self._peek(d)), None)
            if op is not None:
                self.i += len(op)
                rhs = self.signed_power()
                v = _mul(v, rhs) if op in _MULS else _div(v, rhs)
            elif self._starts_atom():
                v = _mul(v, self.power())  # implicit product: 2\sqrt{3}, 3\pi, 2(1+1)
            else:
                break
        return v

    def _starts_atom(self) -> bool:
        return self.i < len(self.s) and (self.s[self.i] in "({" or self._peek("\\frac") or self._peek("\\sqrt")
                                         or self._peek("\\pi"))

    def signed_power(self) -> _Num:
        """The right side of an explicit ``*`` or ``/``: ``2*-3``."""
        if self._eat("-"):
            v = self.power()
            return _Num(-v.value, v.exact)
        self._eat("+")
        return self.power()

    def power(self) -> _Num:
        base = self.atom()
        if self._eat("^"):
            if self._peek("{"):
                exp = self.group()
            elif self.i < len(self.s) and self.s[self.i].isdigit():
                exp = _Num(Fraction(int(self.s[self.i])), True)
                self.i += 1
            elif self._eat("-"):
                a = self.atom()
                exp = _Num(-a.value, a.exact)
            else:
                exp = self.atom()
            base = _pow(base, exp)
        return base

    def group(self) -> _Num:
        if not self._eat("{"):
            raise _ParseError("expected {")
        v = self.expr()
        if not self._eat("}"):
            raise _ParseError("expected }")
        return v

    def atom(self) -> _Num:
        self._enter()
        try:
            s, i = self.s, self.i
            if i >= len(s):
                raise _ParseError("unexpected end")
            if self._eat("\\frac"):
                return _div(self.group(), self.group())
            if self._eat("\\sqrt"):
                index = _Num(Fraction(2), True)
                if self._eat("["):
                    index = self.expr()
                    if not self._eat("]"):
                        raise _ParseError("expected ]")
                return _root(self.group(), index)
            if self._eat("\\pi"):
                return _Num(math.pi, False)
            if s[i] == "(":
                self.i += 1
                v = self.expr()
                if not self._eat(")"):
                    raise _ParseError("expected )")
                return v
            if s[i] == "{":
                return self.group()
            m = _LITERAL.match(s, i)
            if m:
                self.i = m.end()
                text = m.group(0)
                sci = _SCI.match(s, self.i)
                if sci:
                    self.i = sci.end()
                    text += sci.group(0)
                decimal = "." in text or "e" in text.lower()
                v = _Num(Fraction(text), not decimal)
                if not decimal and self._peek("\\frac{"):  # mixed number 2\frac{1}{2} = 5/2
                    save = self.i
                    self.i += len("\\frac")
                    a, b = self.group(), self.group()
                    whole = a.exact and b.exact and a.value.denominator == 1 and b.value.denominator == 1
                    if whole and a.value >= 0 and b.value > 0:
                        return _Num(v.value + a.value / b.value, True)
                    self.i = save
                return v
            raise _ParseError(f"unexpected {s[i:i + 10]!r}")
        finally:
            self.depth -= 1


@functools.lru_cache(maxsize=4096)
def _to_number(norm: str) -> Optional[_Num]:
    """The value of a normalised answer that is arithmetic in numbers, else None."""
    if not norm or len(norm) > MAX_ANSWER_CHARS:
        return None
    if _THOUSANDS.fullmatch(norm):
        norm = norm.replace(",", "")
    if "," in norm or (not any(c.isdigit() for c in norm) and "\\pi" not in norm):
        return None
    try:
        v = _Parser(norm).parse()
    except (_ParseError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    if not v.exact and (math.isnan(float(v.value)) or math.isinf(float(v.value))):
        return None
    return v


def _numbers_equal(a: _Num, b: _Num) -> bool:
    if a.exact and b.exact:
        return a.value == b.value
    try:
        return math.isclose(float(a.value), float(b.value), rel_tol=REL_TOL, abs_tol=1e-12)
    except OverflowError:
        return False


# ---------------------------------------------------------------------------------------------
# tuples, intervals, sets

def _split_top(s: str) -> Optional[List[str]]:
    """Split at commas outside any brackets; None when the brackets do not nest."""
    parts, depth, start = [], 0, 0
    for j, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    if depth != 0:
        return None
    parts.append(s[start:])
    return parts


def _sequence(norm: str) -> Optional[Tuple[str, List[str]]]:
    """``("()", elements)`` for a tuple/interval ``(a,b]``..., ``("{}", ...)`` for a set or a bare
    comma list (unordered); None when the answer is not a sequence."""
    if len(norm) >= 2 and norm[0] in "([{" and norm[-1] in ")]}":
        parts = _split_top(norm[1:-1])
        if parts is not None and (len(parts) >= 2 or (norm[0] == "{" and norm[-1] == "}")):
            kind = "{}" if norm[0] == "{" and norm[-1] == "}" else norm[0] + norm[-1]
            return kind, parts
        return None
    parts = _split_top(norm)
    if parts is not None and len(parts) >= 2:
        return "{}", parts
    return None


def _equal_norm(a: str, b: str, depth: int = 0) -> bool:
    if depth > 4:
        return a == b
    if a and a == b:
        return True
    if a.isalpha() and b.isalpha():
        return a.lower() == b.lower()
    na, nb = _to_number(a), _to_number(b)
    if na is not None and nb is not None:
        return _numbers_equal(na, nb)
    sa, sb = _sequence(a), _sequence(b)
    if sa is None or sb is None or sa[0] != sb[0] or len(sa[1]) != len(sb[1]) or len(sa[1]) > _MAX_ELEMENTS:
        return False
    ea, eb = [normalize(x) for x in sa[1]], [normalize(x) for x in sb[1]]
    if sa[0] != "{}":
        return all(_equal_norm(x, y, depth + 1) for x, y in zip(ea, eb))
    unused = list(eb)  # unordered: greedy matching is exact here, equality is transitive
    for x in ea:
        k = next((j for j, y in enumerate(unused) if _equal_norm(x, y, depth + 1)), None)
        if k is None:
            return False
        unused.pop(k)
    return True


def answers_equal(pred: str, ref: str) -> bool:
    """Whether two *answers* (not whole solutions: see :func:`reference_answer`) are equivalent
    under the rules of the module doc. False for anything that is not a non-empty string."""
    try:
        if not isinstance(pred, str) or not isinstance(ref, str):
            return False
        a, b = normalize(pred), normalize(ref)
        if not a or not b:
            return False
        return _equal_norm(a, b)
    except Exception:  # never raise on model output
        return False


def _preview(s: str) -> str:
    s = " ".join(s.split())
    return repr(s if len(s) <= _PREVIEW else s[:_PREVIEW - 3] + "...")


def score_math(completion: str, reference: Union[str, int, float]) -> Tuple[bool, str]:
    """``(passed, reason)``: reason is ``""`` on a pass, else ``"no final answer found"``,
    ``"reference has no answer"`` or ``"answer X != reference Y"`` (one line, both shortened)."""
    pred = extract_answer(completion)
    if pred is None:
        return False, "no final answer found"
    ref = reference_answer(reference)
    if ref is None:
        return False, "reference has no answer"
    if answers_equal(pred, ref):
        return True, ""
    return False, f"answer {_preview(pred)} != reference {_preview(ref)}"
