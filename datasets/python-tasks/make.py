"""Generate the python-tasks set: small HumanEval-format function-completion tasks.

    python datasets/python-tasks/make.py          # writes train.jsonl, heldout.jsonl, sft.jsonl,
                                                  # heldout_sft.jsonl, repair_sft.jsonl here
    python datasets/python-tasks/make.py --check  # regenerate in memory, compare with the files

Deterministic (fixed seed, standard library only): 16 templated families of one-line functions,
each task with its own function name, argument names and constants. The held-out tasks (2 per
family) are drawn first, so they do not change with --train-per-family; they come from the same
families but never repeat a train task (function names are unique over the set, and in a family
with constants no train task uses a held-out task's constants). 30 train tasks per family: with
6 the tiny model memorised them instead of learning to copy names and constants from the
prompt (datasets/README.md). Every row is verified locally (no sandbox: the code is this
file's own): the canonical solution passes its check, `return None` fails it, and within a
family every other task's body with different constants fails it (the asserts pin the
constants down).

repair_sft.jsonl (issue 44): 6 train tasks per family (own seed), each a 4-message conversation:
the instruction, a wrong attempt (a syntax error, an off-by-one, or a wrong return), the
python_tests verifier's feedback on it, the canonical answer. The feedback is not written here:
the real verifier runs each attempt in its sandbox (bubblewrap; this file then imports
`elastic`) and elastic/reward/feedback.py words it (`details`), as GRPO's multi-turn episodes
show it. The wrong attempt carries `"weight": 0` (elastic/data/chat.py: context, not learned),
so SFT learns only the fix.

Row fields (HumanEval plus `instruction`): task_id "py/<family>-<n>", prompt (signature and
one-line docstring), canonical_solution (the body), entry_point, test (`def check(candidate):`
with 4-6 asserts), instruction (the whole user message given to the chat model).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
from typing import Any, Callable, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261126
TRAIN_PER_FAMILY = 30
HELDOUT_PER_FAMILY = 2

INT_ARGS = ["x", "n", "value", "num"]
LIST_ARGS = ["xs", "nums", "values", "items"]
STR_ARGS = ["s", "text", "word", "name"]
PAIR_ARGS = [("a", "b"), ("x", "y"), ("p", "q"), ("left", "right")]
NOUNS = ["score", "total", "level", "price", "step", "height", "width", "age", "count", "speed",
         "label", "title", "token", "batch", "row", "box", "item", "point", "mark", "code"]
LETTERS = "abcdeilnorst"
SEPS = ["-", ",", ":", "+", "_", "/", ";", "|"]
WORDS = ["cat", "dog", "sun", "tree", "moon", "apple", "rain", "stone", "bird", "fish", "hello", "data"]


def instruction_for(prompt: str) -> str:
    return "Complete this Python function.\n\n```python\n" + prompt + "```"


def assistant_for(prompt: str, body: str) -> str:
    return "```python\n" + prompt + body + "```"


class Family:
    """One template. `draw(rng)` → params (a dict; `key` = the constants that identify a variant,
    () for a family without constants); `spec(params)` → (stems, doc, args, body, reference fn,
    test inputs)."""

    def __init__(self, name: str, stems: Sequence[str], draw: Callable[[random.Random], Dict[str, Any]],
                 spec: Callable[[Dict[str, Any]], Tuple[str, str, str, Callable, List[tuple]]],
                 new_keys: bool = True):
        self.name, self.stems, self.draw, self.spec = name, list(stems), draw, spec
        # Held-out tasks take constants no train task of the family has (False for the
        # families with 2-3 variants: their held-out tasks differ in names only).
        self.new_keys = new_keys


def _int_arg(rng):
    return rng.choice(INT_ARGS)


def _fam_add():
    def draw(rng):
        return dict(key=(rng.randint(2, 9),), a=_int_arg(rng))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return {a} plus {k}.", a, f"return {a} + {k}", lambda x: x + k,
                [(0,), (1,), (-k,), (10,), (-7,)])
    return Family("add", ["add", "plus", "increase", "bump"], draw, spec)


def _fam_mul():
    def draw(rng):
        return dict(key=(rng.randint(2, 9),), a=_int_arg(rng))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return {a} times {k}.", a, f"return {a} * {k}", lambda x: x * k,
                [(0,), (1,), (-3,), (5,), (11,)])
    return Family("mul", ["times", "scale", "multiply", "grow"], draw, spec)


def _fam_divisible():
    def draw(rng):
        return dict(key=(rng.randint(2, 9),), a=_int_arg(rng))

    def spec(p):
        (k,), a = p["key"], p["a"]
        # k and 0 are multiples, k + 1 is not; candidate(k) is True only for the divisors of k,
        # and the proper divisors of k in 2..9 (2, 3, 4) are tested directly.
        ins = [(k,), (0,), (k + 1,)] + [(d,) for d in (2, 3, 4) if d < k and k % d == 0]
        ins = (ins + [(k * 3,), (k * 5 + 2,)])[:6]
        return (f"Return True if {a} is divisible by {k}, else False.", a, f"return {a} % {k} == 0",
                lambda x: x % k == 0, ins)
    return Family("divisible", ["is_multiple", "divides", "check_multiple", "is_divisible"], draw, spec)


def _fam_greater():
    def draw(rng):
        return dict(key=(rng.randint(0, 12),), a=_int_arg(rng))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return True if {a} is greater than {k}, else False.", a, f"return {a} > {k}",
                lambda x: x > k, [(k + 1,), (k,), (k - 1,), (-20,), (100,)])
    return Family("greater", ["is_above", "exceeds", "is_greater", "over"], draw, spec)


def _fam_clamp():
    def draw(rng):
        lo = rng.randint(-5, 5)
        return dict(key=(lo, lo + rng.randint(3, 9)), a=_int_arg(rng))

    def spec(p):
        (lo, hi), a = p["key"], p["a"]
        return (f"Return {a} clamped to the range [{lo}, {hi}].", a, f"return max({lo}, min({hi}, {a}))",
                lambda x: max(lo, min(hi, x)), [(lo - 1,), (hi + 1,), (lo,), (hi,), ((lo + hi) // 2,), (-100,)])
    return Family("clamp", ["clamp", "limit", "bound", "clip"], draw, spec)


def _fam_absdiff():
    def draw(rng):
        return dict(key=(), a=rng.choice(PAIR_ARGS))

    def spec(p):
        a, b = p["a"]
        return (f"Return the absolute difference of {a} and {b}.", f"{a}, {b}", f"return abs({a} - {b})",
                lambda x, y: abs(x - y), [(3, 8), (8, 3), (0, 0), (-4, 5), (7, -2)])
    return Family("absdiff", ["distance", "gap", "diff", "spread"], draw, spec)


def _fam_sum_list():
    def draw(rng):
        return dict(key=(), a=rng.choice(LIST_ARGS))

    def spec(p):
        a = p["a"]
        return (f"Return the sum of the numbers in the list {a}.", a, f"return sum({a})",
                lambda xs: sum(xs), [([1, 2, 3],), ([],), ([5],), ([-2, 2, 7],), ([10, 20, 30, 40],)])
    return Family("sum_list", ["sum", "total_of", "add_up", "sum_all"], draw, spec)


def _fam_extreme():
    def draw(rng):
        return dict(key=(rng.choice(["largest", "smallest"]),), a=rng.choice(LIST_ARGS))

    def spec(p):
        (which,), a = p["key"], p["a"]
        fn = "max" if which == "largest" else "min"
        ref = max if fn == "max" else min
        return (f"Return the {which} number in the non-empty list {a}.", a, f"return {fn}({a})",
                lambda xs: ref(xs), [([3, 1, 2],), ([5],), ([-4, -9, -1],), ([2, 8, 8, 0],), ([7, 3, 9, 4],)])
    return Family("extreme", ["pick", "find", "select", "get"], draw, spec, new_keys=False)


def _fam_element():
    positions = {"first": "0", "second": "1", "last": "-1"}

    def draw(rng):
        return dict(key=(rng.choice(sorted(positions)),), a=rng.choice(LIST_ARGS))

    def spec(p):
        (which,), a = p["key"], p["a"]
        i = positions[which]
        return (f"Return the {which} element of the list {a}, which has at least two elements.", a,
                f"return {a}[{i}]", lambda xs: xs[int(i)],
                [([4, 5, 6],), ([9, 1],), ([0, -3, 8, 2],), (["a", "b", "c"],), ([7, 7, 1],)])
    return Family("element", ["element", "entry", "take", "fetch"], draw, spec, new_keys=False)


def _fam_scale_list():
    def draw(rng):
        return dict(key=(rng.randint(2, 9),), a=rng.choice(LIST_ARGS))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return a list of the numbers in {a}, each multiplied by {k}.", a, f"return [v * {k} for v in {a}]",
                lambda xs: [v * k for v in xs], [([1, 2, 3],), ([],), ([0],), ([-1, 4],), ([5, 5, 2, 1],)])
    return Family("scale_list", ["scale_all", "multiply_all", "stretch", "times_each"], draw, spec)


def _fam_parity():
    def draw(rng):
        return dict(key=(rng.choice(["even", "odd"]),), a=rng.choice(LIST_ARGS))

    def spec(p):
        (which,), a = p["key"], p["a"]
        r = 0 if which == "even" else 1
        return (f"Return the {which} numbers in {a}, in their original order.", a,
                f"return [v for v in {a} if v % 2 == {r}]", lambda xs: [v for v in xs if v % 2 == r],
                [([1, 2, 3, 4],), ([],), ([2, 4],), ([1, 3, 5],), ([-3, -2, 0, 7],)])
    return Family("parity", ["keep", "filter", "only", "select"], draw, spec, new_keys=False)


def _fam_count_char():
    def draw(rng):
        return dict(key=(rng.choice(LETTERS),), a=rng.choice(STR_ARGS))

    def spec(p):
        (c,), a = p["key"], p["a"]
        other = next(ch for ch in LETTERS if ch != c)
        ins = [("",), (c,), (c * 3,), (f"x{c}y{c}",), (other * 2 + c,), ("zzz",)]
        return (f"Return how many times the character '{c}' appears in the string {a}.", a,
                f"return {a}.count('{c}')", lambda s: s.count(c), ins)
    return Family("count_char", ["count", "tally", "how_many", "occurrences"], draw, spec)


def _fam_reverse():
    def draw(rng):
        return dict(key=(), a=rng.choice(STR_ARGS))

    def spec(p):
        a = p["a"]
        return (f"Return the string {a} reversed.", a, f"return {a}[::-1]", lambda s: s[::-1],
                [("abc",), ("",), ("x",), ("hello",), ("abba",)])
    return Family("reverse", ["reverse", "flip", "backwards", "mirror"], draw, spec)


def _fam_repeat():
    def draw(rng):
        return dict(key=(rng.randint(2, 8),), a=rng.choice(STR_ARGS))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return the string {a} repeated {k} times.", a, f"return {a} * {k}", lambda s: s * k,
                [("ab",), ("",), ("x",), ("hi ",)])
    return Family("repeat", ["repeat", "echo", "copies", "duplicate"], draw, spec)


def _fam_longer():
    def draw(rng):
        return dict(key=(rng.randint(2, 9),), a=rng.choice(STR_ARGS))

    def spec(p):
        (k,), a = p["key"], p["a"]
        return (f"Return True if the string {a} has more than {k} characters, else False.", a,
                f"return len({a}) > {k}", lambda s: len(s) > k,
                [("a" * (k + 1),), ("b" * k,), ("",), ("c" * (k - 1),), ("hello world",)])
    return Family("longer", ["is_long", "longer", "too_long", "is_wide"], draw, spec)


def _fam_join():
    def draw(rng):
        return dict(key=(rng.choice(SEPS),), a=rng.choice(PAIR_ARGS))

    def spec(p):
        (sep,), (a, b) = p["key"], p["a"]
        return (f"Return the strings {a} and {b} joined by '{sep}'.", f"{a}, {b}", f"return {a} + '{sep}' + {b}",
                lambda x, y: x + sep + y, [("a", "b"), ("", ""), ("cat", "dog"), ("x", ""), ("12", "34")])
    return Family("join", ["join", "glue", "link", "combine"], draw, spec)


FAMILIES = [_fam_add(), _fam_mul(), _fam_divisible(), _fam_greater(), _fam_clamp(), _fam_absdiff(),
            _fam_sum_list(), _fam_extreme(), _fam_element(), _fam_scale_list(), _fam_parity(),
            _fam_count_char(), _fam_reverse(), _fam_repeat(), _fam_longer(), _fam_join()]


def build_task(fam: Family, n: int, params: Dict[str, Any], fname: str) -> Dict[str, str]:
    doc, args, body, ref, inputs = fam.spec(params)
    prompt = f'def {fname}({args}):\n    """{doc}"""\n'
    lines = ["def check(candidate):"]
    for ins in inputs:
        call = ", ".join(repr(v) for v in ins)
        lines.append(f"    assert candidate({call}) == {ref(*ins)!r}")
    return {
        "task_id": f"py/{fam.name}-{n}",
        "prompt": prompt,
        "canonical_solution": f"    {body}\n",
        "entry_point": fname,
        "test": "\n".join(lines) + "\n",
        "instruction": instruction_for(prompt),
    }


def generate(seed: int = SEED, train_per_family: int = TRAIN_PER_FAMILY) -> Tuple[List[dict], List[dict]]:
    """Per family, the held-out tasks are drawn first (so they do not depend on the train size),
    with distinct constants; the train tasks then avoid those constants (families with
    `new_keys`). Function names are unique over the whole set."""
    rng = random.Random(seed)
    names: set = set()
    train: List[dict] = []
    heldout: List[dict] = []

    def draw(fam: Family, avoid: set, where: str) -> Tuple[Dict[str, Any], str]:
        for _ in range(1000):
            params = fam.draw(rng)
            if fam.new_keys and params["key"] and params["key"] in avoid:
                continue
            fname = f"{rng.choice(fam.stems)}_{rng.choice(NOUNS)}"
            if fname not in names:
                names.add(fname)
                return params, fname
        raise RuntimeError(f"{fam.name}: could not draw a {where} task")

    held: Dict[str, List[Tuple[Dict[str, Any], str]]] = {}
    for fam in FAMILIES:  # all held-out tasks first: they do not depend on train_per_family
        held[fam.name] = []
        for _ in range(HELDOUT_PER_FAMILY):
            params, fname = draw(fam, {p["key"] for p, _ in held[fam.name]}, "held-out")
            held[fam.name].append((params, fname))
    for fam in FAMILIES:
        held_keys = {p["key"] for p, _ in held[fam.name]}
        for i in range(train_per_family):
            params, fname = draw(fam, held_keys, "train")
            train.append(dict(build_task(fam, i, params, fname), _key=params["key"]))
        for j, (params, fname) in enumerate(held[fam.name]):
            heldout.append(dict(build_task(fam, train_per_family + j, params, fname), _key=params["key"]))
    return train, heldout


def run_check(task: dict, body: str) -> bool:
    """Unsandboxed: only for this file's own code."""
    env: Dict[str, Any] = {}
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # a wrong attempt may print
            exec(task["prompt"] + body, env)
            exec(task["test"], env)
            env["check"](env[task["entry_point"]])
        return True
    except Exception:
        return False


def verify(train: List[dict], heldout: List[dict]) -> None:
    rows = train + heldout
    ids = [r["task_id"] for r in rows]
    assert len(set(ids)) == len(ids), "duplicate task ids"
    names = [r["entry_point"] for r in rows]
    assert len(set(names)) == len(names), "duplicate function names"
    train_prompts = {r["prompt"] for r in train}
    for r in heldout:
        assert r["prompt"] not in train_prompts, f"{r['task_id']}: same prompt as a train task"
    for r in rows:
        n_asserts = r["test"].count("assert ")
        assert 4 <= n_asserts <= 6, f"{r['task_id']}: {n_asserts} asserts"
        assert run_check(r, r["canonical_solution"]), f"{r['task_id']}: canonical solution fails"
        assert not run_check(r, "    return None\n"), f"{r['task_id']}: `return None` passes"
    # Within a family, the body with another task's constants (and this task's argument names)
    # must fail: the asserts pin the constants down.
    for r in rows:
        fam = r["task_id"].split("/")[1].rsplit("-", 1)[0]
        for o in rows:
            if o is r or o["task_id"].split("/")[1].rsplit("-", 1)[0] != fam or o["_key"] == r["_key"]:
                continue
            fam_obj = next(f for f in FAMILIES if f.name == fam)
            params = {"key": o["_key"], "a": _args_of(r)}
            body = "    " + fam_obj.spec(params)[2] + "\n"
            assert not run_check(r, body), f"{r['task_id']}: passes with {o['task_id']}'s constants {o['_key']}"


def _args_of(task: dict):
    args = task["prompt"].split("(", 1)[1].split(")", 1)[0]
    parts = [a.strip() for a in args.split(",")]
    return tuple(parts) if len(parts) > 1 else parts[0]


# -- repair_sft.jsonl: (wrong attempt, the verifier's feedback, fix) episodes -------------------
# What a tiny policy needs to see before multi-turn GRPO (rl.turns > 1, issue 44) can teach it to
# use feedback: the conversation an episode's second turn continues. Drawn with their own seed
# from the train tasks (so the other four files do not change); the held-out tasks never appear.
REPAIR_SEED = SEED + 44
REPAIR_PER_FAMILY = 6
REPAIR_KINDS = ("syntax", "off_by_one", "wrong_return")  # cycled over each family's draws
# The feedback rows show: the python_tests verifier's `details` text (elastic/reward/feedback.py),
# the form GRPO gives with rl.feedback: details. bench/multiturn_grpo.py trains with it.
REPAIR_FEEDBACK = "details"
REPAIR_TIME_LIMIT_S = 2.0  # jobs/configs/grpo-python-tasks.yaml reward.python_time_limit_s

# A realistic off-by-one per family, as (old, new) on the canonical body; None: the family's
# constant plus one (its spec with key + 1).
_OFF_BY_ONE: Dict[str, Callable[[str, Any], Tuple[str, str]]] = {
    "greater": lambda a, k: (" > ", " >= "),
    "longer": lambda a, k: (" > ", " >= "),
    "clamp": lambda a, k: (f"min({k[1]}, ", f"min({k[1] - 1}, "),
    "absdiff": lambda a, k: (f"abs({a[0]} - {a[1]})", f"abs({a[0]} - {a[1]}) - 1"),
    "sum_list": lambda a, k: (f"sum({a})", f"sum({a}[1:])"),
    "extreme": lambda a, k: (f"({a})", f"({a}[1:])"),
    "element": lambda a, k: ({"first": ("[0]", "[1]"), "second": ("[1]", "[2]"), "last": ("[-1]", f"[len({a})]")}[k[0]]),
    "parity": lambda a, k: (f" in {a} ", f" in {a}[1:] "),
    "count_char": lambda a, k: (f"{a}.count", f"{a}[1:].count"),
    "reverse": lambda a, k: ("[::-1]", "[:0:-1]"),
    "join": lambda a, k: (f" + {a[1]}", f" + {a[1]}[1:]"),
}


def wrong_body(task: dict, kind: str, rng: random.Random) -> str:
    """A plausible wrong body for `task` (a canonical `    return ...` line): `syntax` (a stray or
    missing parenthesis, or `retrun`), `off_by_one` (a boundary or constant one off), or
    `wrong_return` (prints instead of returning, or returns its argument unchanged)."""
    body = task["canonical_solution"].rstrip("\n")
    expr = body.split("return ", 1)[1]
    fam_name = task["task_id"].split("/")[1].rsplit("-", 1)[0]
    args = _args_of(task)
    if kind == "syntax":
        options = [f"    retrun {expr}", f"    return {expr})"]
        if expr.endswith(")"):
            options.append(f"    return {expr[:-1]}")
        out = rng.choice(options)
    elif kind == "off_by_one":
        if fam_name in _OFF_BY_ONE:
            old, new = _OFF_BY_ONE[fam_name](args, task["_key"])
            assert old in body, (task["task_id"], old, body)
            out = body.replace(old, new, 1)
        else:
            fam = next(f for f in FAMILIES if f.name == fam_name)
            k = task["_key"]
            out = "    " + fam.spec({"key": (k[0] + 1,) + tuple(k[1:]), "a": args})[2]
    elif kind == "wrong_return":
        first = args[0] if isinstance(args, tuple) else args
        out = rng.choice([f"    print({expr})", f"    return {first}"])
    else:
        raise ValueError(kind)
    return out + "\n"


def verifier_feedback(rows: List[Tuple[dict, str]]) -> List[Tuple[str, str]]:
    """(status, feedback text) of each (task, completion) from the real python_tests verifier in
    its sandbox (bubblewrap), as GRPO's reward pool scores a turn (the task built by
    elastic/reward/tasks.py from the row, with `instruction` as the prompt) and as
    elastic/reward/feedback.py words it. Not hand-written: the text a policy sees in training."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from elastic.reward.feedback import feedback_text
    from elastic.reward.tasks import DEFAULT_FIELDS, row_task
    from elastic.reward.verifiers.python_tests.verifier import evaluate_python

    fields = dict(DEFAULT_FIELDS, prompt="instruction")
    out = []
    for i, (task, completion) in enumerate(rows):
        t = row_task({k: task[k] for k in FIELDS}, f"train.jsonl:{i}", i, "train", fields, ("tests",),
                     (REPAIR_TIME_LIMIT_S, 512))
        res = evaluate_python(t.id, t.tests, completion)
        for _ in range(3):  # none of these attempts loops: a timeout or sandbox_error is the machine's load
            if res.status not in ("timeout", "sandbox_error"):
                break
            res = evaluate_python(t.id, t.tests, completion)
        if res.status in ("timeout", "sandbox_error"):
            raise RuntimeError(f"{task['task_id']}: {res.status} 4 times ({res.reason}); repair_sft.jsonl needs "
                               "a working python_tests sandbox (docs/reward.md) and a machine not overloaded")
        out.append((res.status, feedback_text(res, "python_tests", REPAIR_FEEDBACK)))
    return out


def repair_rows(train: List[dict]) -> List[dict]:
    """REPAIR_PER_FAMILY train tasks per family, each as [user: instruction, assistant: a wrong
    attempt (weight 0: context, not learned), user: the verifier's feedback on it, assistant: the
    canonical answer (learned)]. Every wrong attempt fails locally and in the verifier."""
    rng = random.Random(REPAIR_SEED)
    picks: List[Tuple[dict, str]] = []
    for fam in FAMILIES:
        tasks = [r for r in train if r["task_id"].split("/")[1].rsplit("-", 1)[0] == fam.name]
        for j, task in enumerate(rng.sample(tasks, min(REPAIR_PER_FAMILY, len(tasks)))):
            kind = REPAIR_KINDS[j % len(REPAIR_KINDS)]
            body = wrong_body(task, kind, rng)
            assert not run_check(task, body), f"{task['task_id']}: the {kind} attempt passes"
            picks.append((task, body, kind))
    verdicts = verifier_feedback([(t, assistant_for(t["prompt"], b)) for t, b, _ in picks])
    rows = []
    for (task, body, kind), (status, fb) in zip(picks, verdicts):
        assert status != "ok" and fb, f"{task['task_id']}: the verifier passed the {kind} attempt"
        rows.append({"task_id": task["task_id"], "kind": kind, "messages": [
            {"role": "user", "content": task["instruction"]},
            {"role": "assistant", "content": assistant_for(task["prompt"], body), "weight": 0},
            {"role": "user", "content": fb},
            {"role": "assistant", "content": assistant_for(task["prompt"], task["canonical_solution"])}]})
    return rows


def sft_row(task: dict) -> dict:
    return {"messages": [{"role": "user", "content": task["instruction"]},
                         {"role": "assistant", "content": assistant_for(task["prompt"], task["canonical_solution"])}]}


FIELDS = ["task_id", "prompt", "canonical_solution", "entry_point", "test", "instruction"]


def render(train: List[dict], heldout: List[dict]) -> Dict[str, str]:
    def jsonl(rows):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    def clean(rows):
        return [{k: r[k] for k in FIELDS} for r in rows]

    return {
        "train.jsonl": jsonl(clean(train)),
        "heldout.jsonl": jsonl(clean(heldout)),
        "sft.jsonl": jsonl([sft_row(r) for r in train]),
        "heldout_sft.jsonl": jsonl([sft_row(r) for r in heldout]),
        "repair_sft.jsonl": jsonl(repair_rows(train)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify the files here match the generator")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--train-per-family", type=int, default=TRAIN_PER_FAMILY,
                    help="train tasks per family (the held-out tasks do not change with it)")
    args = ap.parse_args(argv)
    train, heldout = generate(train_per_family=args.train_per_family)
    verify(train, heldout)
    files = render(train, heldout)
    if args.check:
        bad = [n for n, text in files.items()
               if not os.path.isfile(os.path.join(args.out, n)) or open(os.path.join(args.out, n)).read() != text]
        if bad:
            print(f"out of date: {', '.join(bad)} (run python {os.path.relpath(__file__)})", file=sys.stderr)
            return 1
    else:
        for n, text in files.items():
            with open(os.path.join(args.out, n), "w") as f:
                f.write(text)
    fams = len(FAMILIES)
    print(f"python-tasks: {fams} families, {len(train)} train, {len(heldout)} held-out tasks "
          f"({'up to date' if args.check else 'written to ' + args.out}); all canonical solutions pass, "
          f"`return None` and other constants fail; {len(FAMILIES) * REPAIR_PER_FAMILY} repair rows "
          f"(their wrong attempts fail, feedback from the python_tests verifier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
