"""Generate the graded task sets: verifiable tasks with a difficulty level, for measuring learning.

    python datasets/graded-tasks/make.py                      # write python/ and math/ here
    python datasets/graded-tasks/make.py --check              # files = generator, every row sound
    python datasets/graded-tasks/make.py --check FILE ...     # every row of these files sound
    python datasets/graded-tasks/make.py --family python --seed 7 --heldout-only --out FILE
                                                              # a fresh held-out set for seed 7

Two families, both compositional: a task is a chain of 1-3 steps (its `level`), each step drawn
from a small vocabulary of operations with constants, so a held-out task is a new combination
of steps the model has seen, never a train task with other names:

* **python** (the `python_tests` verifier, HumanEval fields): a one-line function whose
  docstring says the steps in words. Integer chains ("Add 3 to x, then multiply by 2" ->
  `return (x + 3) * 2`) over add / subtract / multiply / modulo / floor-divide / square /
  negate / absolute value, and list pipelines ("Return the sum of the numbers in xs that are
  greater than 3, each times 2" -> `return sum(v * 2 for v in xs if v > 3)`): a filter, a map
  and a reduction (list / sum / count), each optional. 5-6 asserts on fixed inputs.
* **math** (the `math_answer` verifier, GSM8K fields): a start amount and 1-3 events (buys k
  more, gives k away, gets k times as many), e.g. "Mia has 7 shells. She buys 5 more, then gives
  away 3. How many shells does Mia have now?", answered one equation per line, then `#### 9`.

**Disjoint by behaviour.** A task's signature is what its tests pin down: for python the
outputs of the reference on the test inputs (so two chains that compute the same function are
one task, whatever their names or wording), for math the start and the steps (the question with
its name and object taken out). No held-out task has a train task's signature, and no two
held-out tasks share one. The held-out set of any `--seed` is drawn against the shipped train
set (always from the shipped seed), so a fresh held-out set for a new seed is disjoint from the
train set too; with --heldout-only nothing shipped is touched.

**Sound rows.** Every row carries a `wrong_solution` (python: one constant changed or one step
dropped; math: the answer off by one) besides its reference. `--check` names the task id of
every row whose reference fails its tests, whose wrong solution passes them, whose signature
repeats a train task's (overlap) or another row's of the same file. Python rows are run in a
child interpreter (this generator's own code, not sandboxed); tests/test_graded_tasks.py runs a
sample through the real `python_tests` and `math_answer` verifiers in their sandbox.

Standard library only; deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261206
SIZES = {"python": (2000, 256), "math": (2000, 256)}  # train, held-out per family set
# Level 1 is a small space (python: 118 behaviours, 1-step chains and pipelines; train's
# longer chains already compute ~50 of them, "add 3, then add 2" is "add 5"), so train takes
# 1 task in 40 at level 1 (50 of 2000) and held-out 1 in 20 (13 of 256); the rest alternate
# levels 2 and 3 (python: ~3,200 and ~12,000 behaviours).


def train_level(i: int) -> int:
    return 1 if i % 40 == 0 else 2 + i % 2


def heldout_level(i: int) -> int:
    return 1 if i % 20 == 0 else 2 + i % 2
FAMILIES = ("python", "math")

# ---------------------------------------------------------------------------------------------
# python: integer chains and list pipelines
# ---------------------------------------------------------------------------------------------

INT_ARGS = ["x", "n", "value", "num"]
LIST_ARGS = ["xs", "nums", "values", "items"]
STEMS = ["compute", "transform", "calc", "process", "apply", "get", "make", "find", "eval", "adjust"]
NOUNS = ["score", "total", "level", "price", "step", "height", "width", "age", "count", "speed",
         "label", "title", "token", "batch", "row", "box", "item", "point", "mark", "code"]
INT_INPUTS = [0, 1, -4, 7, 13, 22, 100]
LIST_INPUTS = [[], [3], [1, 4, 6], [-2, 5, 8, 3], [10, 0, 7, 2, 9]]

# op -> (first phrase, later phrase, code of expression e); {k} the constant, {a} the argument.
INT_OPS: Dict[str, Tuple[str, str, str]] = {
    "add": ("Add {k} to {a}", "add {k}", "{e} + {k}"),
    "sub": ("Subtract {k} from {a}", "subtract {k}", "{e} - {k}"),
    "mul": ("Multiply {a} by {k}", "multiply by {k}", "{e} * {k}"),
    "mod": ("Take {a} modulo {k}", "take it modulo {k}", "{e} % {k}"),
    "div": ("Divide {a} by {k}, rounding down", "divide by {k}, rounding down", "{e} // {k}"),
    "square": ("Square {a}", "square it", "{e} ** 2"),
    "neg": ("Negate {a}", "negate it", "-{e}"),
    "abs": ("Take the absolute value of {a}", "take the absolute value", "abs({e})"),
}
CONST_RANGE = {"add": (1, 20), "sub": (1, 20), "mul": (2, 12), "mod": (2, 12), "div": (2, 12)}
FILTERS = {"gt": ("greater than {k}", "v > {k}"), "lt": ("less than {k}", "v < {k}"),
           "even": ("even", "v % 2 == 0"), "odd": ("odd", "v % 2 == 1")}
MAPS = {"add": ("each plus {k}", "v + {k}"), "mul": ("each times {k}", "v * {k}"),
        "square": ("each squared", "v ** 2")}


def _atom(code: str) -> bool:
    return code.isidentifier() or code.startswith("abs(")


def int_chain_code(arg: str, steps: Sequence[Tuple[str, Optional[int]]]) -> str:
    """`steps` = [(op, k)]: each step wraps the expression so far, parenthesised unless it is a
    bare name or a call."""
    e = arg
    for op, k in steps:
        inner = e if _atom(e) or op == "abs" else f"({e})"
        e = INT_OPS[op][2].format(e=inner, k=k)
    return e


def int_chain_doc(arg: str, steps: Sequence[Tuple[str, Optional[int]]]) -> str:
    parts = [INT_OPS[steps[0][0]][0].format(a=arg, k=steps[0][1])]
    parts += ["then " + INT_OPS[op][1].format(k=k) for op, k in steps[1:]]
    return ", ".join(parts) + "."


def draw_int_steps(rng: random.Random, level: int) -> List[Tuple[str, Optional[int]]]:
    steps: List[Tuple[str, Optional[int]]] = []
    while len(steps) < level:
        op = rng.choice(list(INT_OPS))
        if steps and op == steps[-1][0] and op in ("neg", "abs", "square"):
            continue  # -(-x), abs(abs(x)): a step that says nothing new
        lo_hi = CONST_RANGE.get(op)
        steps.append((op, rng.randint(*lo_hi) if lo_hi else None))
    return steps


def list_code(arg: str, filt, mp, red: str) -> str:
    cond = f" if {FILTERS[filt[0]][1].format(k=filt[1])}" if filt else ""
    item = MAPS[mp[0]][1].format(k=mp[1]) if mp else "v"
    if not filt and not mp:
        return {"sum": f"sum({arg})", "count": f"len({arg})", "list": f"list({arg})"}[red]
    if red == "sum":
        return f"sum({item} for v in {arg}{cond})"
    if red == "count":
        return f"len([v for v in {arg}{cond}])"
    return f"[{item} for v in {arg}{cond}]"


def list_doc(arg: str, filt, mp, red: str) -> str:
    subject = f"the numbers in {arg}"
    if filt:
        subject += " that are " + FILTERS[filt[0]][0].format(k=filt[1])
    if mp:
        subject += ", " + MAPS[mp[0]][0].format(k=mp[1])
    return {"list": f"Return a list of {subject}.", "sum": f"Return the sum of {subject}.",
            "count": f"Return how many of {subject} there are."}[red]


def draw_list_spec(rng: random.Random, level: int):
    """level = (a filter) + (a map) + (a reduction other than list): 1..3."""
    while True:
        filt = mp = None
        if rng.random() < 0.6:
            f = rng.choice(list(FILTERS))
            filt = (f, rng.randint(0, 9) if f in ("gt", "lt") else None)
        if rng.random() < 0.6:
            m = rng.choice(list(MAPS))
            mp = (m, (rng.randint(1, 12) if m == "add" else rng.randint(2, 6)) if m != "square" else None)
        red = rng.choice(["list", "sum", "count"])
        if red == "count" and mp:
            continue  # a map does not change a count
        if (filt is not None) + (mp is not None) + (red != "list") == level:
            return filt, mp, red


def _eval_fn(arg: str, code: str):
    return eval(f"lambda {arg}: {code}")  # this generator's own code


def python_task(rng: random.Random, level: int) -> Optional[Dict[str, Any]]:
    """One task (without task_id); None for a draw the tests cannot pin down."""
    fname = f"{rng.choice(STEMS)}_{rng.choice(NOUNS)}"
    if rng.random() < 0.5:
        arg = rng.choice(INT_ARGS)
        steps = draw_int_steps(rng, level)
        code, doc, inputs = int_chain_code(arg, steps), int_chain_doc(arg, steps), INT_INPUTS
        wrong = int_chain_code(arg, _perturb_int(rng, steps))
    else:
        arg = rng.choice(LIST_ARGS)
        filt, mp, red = draw_list_spec(rng, level)
        code, doc, inputs = list_code(arg, filt, mp, red), list_doc(arg, filt, mp, red), LIST_INPUTS
        wrong = list_code(arg, *_perturb_list(rng, filt, mp, red))
    outs = [_eval_fn(arg, code)(list(i) if isinstance(i, list) else i) for i in inputs]
    if len(set(map(repr, outs))) == 1:
        return None  # a constant function ("(x * 4) % 2"): `return 0` would pass
    if [_eval_fn(arg, wrong)(list(i) if isinstance(i, list) else i) for i in inputs] == outs:
        return None  # the tests cannot tell the near miss from the reference
    prompt = f'def {fname}({arg}):\n    """{doc}"""\n'
    test = "def check(candidate):\n" + "".join(
        f"    assert candidate({i!r}) == {o!r}\n" for i, o in zip(inputs, outs))
    return {"prompt": prompt, "canonical_solution": f"    return {code}\n", "entry_point": fname,
            "test": test, "instruction": "Complete this Python function.\n\n```python\n" + prompt + "```",
            "level": level, "wrong_solution": f"    return {wrong}\n"}


def _perturb_int(rng, steps):
    """One constant moved by 1, or (no constant) one step dropped or swapped for another op."""
    steps = list(steps)
    with_k = [i for i, (_, k) in enumerate(steps) if k is not None]
    if with_k:
        i = rng.choice(with_k)
        op, k = steps[i]
        lo, hi = CONST_RANGE[op]
        steps[i] = (op, k + 1 if k < hi else k - 1)
    elif len(steps) > 1:
        steps.pop(rng.randrange(len(steps)))
    else:
        steps = [("add", 1)] if steps[0][0] != "add" else [("sub", 1)]
    return steps


def _perturb_list(rng, filt, mp, red):
    if filt and filt[1] is not None:
        return (filt[0], filt[1] + 1), mp, red
    if mp and mp[1] is not None:
        return filt, (mp[0], mp[1] + 1), red
    if filt:
        return ("odd" if filt[0] == "even" else "even", None), mp, red
    other = {"list": "sum", "sum": "count", "count": "sum"}[red]
    if mp and other == "count":  # a count ignores the map: not a different task
        other = "list"
    return filt, mp, other


# ---------------------------------------------------------------------------------------------
# math: a start amount and 1-3 events
# ---------------------------------------------------------------------------------------------

PEOPLE = [("Tom", "He"), ("Anna", "She"), ("Ben", "He"), ("Mia", "She"), ("Sam", "He"), ("Lily", "She"),
          ("Max", "He"), ("Zoe", "She"), ("Leo", "He"), ("Emma", "She"), ("Jack", "He"), ("Ella", "She")]
THINGS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "coins", "cards", "eggs", "shells"]
MATH_SUFFIX = "End your answer with '#### <number>'."
EVENTS = {"add": ("buys {k} more", "{a} + {k} = {r}"), "sub": ("gives away {k}", "{a} - {k} = {r}"),
          "mul": ("gets {k} times as many", "{a} * {k} = {r}")}


def math_task(rng: random.Random, level: int) -> Dict[str, Any]:
    name, pron = rng.choice(PEOPLE)
    things = rng.choice(THINGS)
    while True:
        start = rng.randint(2, 20)
        total, steps, lines = start, [], []
        for _ in range(level):
            op = rng.choice(["add", "sub", "mul"] if total <= 30 else ["add", "sub"])
            if op == "add":
                k = rng.randint(1, 9)
                r = total + k
            elif op == "sub":
                if total < 2:
                    break
                k = rng.randint(1, min(9, total - 1))
                r = total - k
            else:
                k = rng.randint(2, 3)
                r = total * k
            lines.append(EVENTS[op][1].format(a=total, k=k, r=r))
            steps.append((op, k))
            total = r
        if len(steps) == level:
            break
    events = [EVENTS[op][0].format(k=k) for op, k in steps]
    said = events[0] if level == 1 else ", then ".join(events)
    question = f"{name} has {start} {things}. {pron} {said}. How many {things} does {name} have now?"
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {total}",
            "instruction": question + "\n" + MATH_SUFFIX, "target": str(total), "level": level,
            "wrong_solution": "\n".join(lines[:-1] + [f"#### {total + 1}"])}


# ---------------------------------------------------------------------------------------------
# sets, signatures and checks
# ---------------------------------------------------------------------------------------------

MAKERS = {"python": python_task, "math": math_task}
PREFIX = {"python": "gpy", "math": "gmath"}
PY_FIELDS = ["task_id", "level", "prompt", "canonical_solution", "entry_point", "test", "instruction",
             "wrong_solution"]
MATH_FIELDS = ["task_id", "level", "question", "answer", "instruction", "target", "wrong_solution"]


def signature(family: str, row: Dict[str, Any]) -> Tuple[str, str]:
    """What a task's tests pin down, with names and wording taken out (module docstring)."""
    if family == "math":
        nums = [int(v) for v in re.findall(r"-?\d+", row["question"])]
        steps = []
        for line in row["answer"].splitlines()[:-1]:
            a, op, k, _ = re.match(r"(-?\d+) ([-+*]) (\d+) = (-?\d+)", line).groups()
            steps.append(({"+": "add", "-": "sub", "*": "mul"}[op], int(k)))
        return ("math", repr((nums[0], tuple(steps))))
    outs = re.findall(r"== (.*)\n", row["test"])
    kind = "list" if row["test"].startswith("def check(candidate):\n    assert candidate([") else "int"
    return (kind, repr(outs))


def _draw(family: str, rng: random.Random, level: int, taken: set) -> Dict[str, Any]:
    for _ in range(10000):
        row = MAKERS[family](rng, level)
        if row is None:
            continue
        sig = signature(family, row)
        if sig not in taken:
            taken.add(sig)
            return row
    raise RuntimeError(f"{family}: no new level-{level} task in 10000 draws")


def generate_train(family: str, seed: int = SEED) -> List[Dict[str, Any]]:
    """The train set: always from the shipped seed's stream (so every held-out seed is drawn
    against the same train set); distinct signatures."""
    rng = random.Random(f"{family}-train-{seed}")
    n_train = SIZES[family][0]
    taken: set = set()
    rows = []
    for i in range(n_train):
        rows.append(dict(task_id=f"{PREFIX[family]}/train-{i}", **_draw(family, rng, train_level(i), taken)))
    return rows


def generate_heldout(family: str, train: List[Dict[str, Any]], seed: int = SEED,
                     n: Optional[int] = None) -> List[Dict[str, Any]]:
    """Held-out tasks for `seed` (levels by `heldout_level`), none with a train task's signature.
    Task ids name the seed, so two seeds' sets never mix ids."""
    rng = random.Random(f"{family}-heldout-{seed}")
    n = SIZES[family][1] if n is None else n
    taken = {signature(family, r) for r in train}
    tag = "heldout" if seed == SEED else f"heldout{seed}"
    return [dict(task_id=f"{PREFIX[family]}/{tag}-{i}", **_draw(family, rng, heldout_level(i), taken))
            for i in range(n)]


def ordered(family: str, row: Dict[str, Any]) -> Dict[str, Any]:
    return {k: row[k] for k in (PY_FIELDS if family == "python" else MATH_FIELDS)}


def sft_row(family: str, row: Dict[str, Any]) -> Dict[str, Any]:
    if family == "python":
        answer = "```python\n" + row["prompt"] + row["canonical_solution"] + "```"
    else:
        answer = row["answer"]
    return {"messages": [{"role": "user", "content": row["instruction"]},
                         {"role": "assistant", "content": answer}]}


def render(family: str, train, heldout) -> Dict[str, str]:
    def jsonl(rows):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return {"train.jsonl": jsonl(ordered(family, r) for r in train),
            "heldout.jsonl": jsonl(ordered(family, r) for r in heldout),
            "sft.jsonl": jsonl(sft_row(family, r) for r in train),
            "heldout_sft.jsonl": jsonl(sft_row(family, r) for r in heldout)}


def _python_results(rows: List[Dict[str, Any]], field: str) -> List[bool]:
    """Run each row's `field` body against its check in one child interpreter (the generator's
    own rows: not sandboxed; a wrong body may raise, loop it cannot: bodies are one expression)."""
    progs = [{"src": r["prompt"] + r[field], "test": r["test"], "entry": r["entry_point"]} for r in rows]
    runner = ("import json, sys\nout = []\nfor p in json.load(sys.stdin):\n    env = {}\n    try:\n"
              "        exec(p['src'], env); exec(p['test'], env); env['check'](env[p['entry']]); out.append(True)\n"
              "    except Exception:\n        out.append(False)\nprint(json.dumps(out))\n")
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-I", "-c", runner], input=json.dumps(progs), capture_output=True,
                           text=True, cwd=d, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"check runner failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


def _math_passes(row: Dict[str, Any], text: str) -> bool:
    m = re.findall(r"####\s*(-?[\d,]*\.?\d+)", text)
    return bool(m) and m[-1].replace(",", "") == row["target"]


def problems(family: str, rows: List[Dict[str, Any]], train: List[Dict[str, Any]],
             is_train: bool) -> List[str]:
    """One line per unsound row: `<task_id>: <what>` (module docstring, "Sound rows")."""
    bad: List[str] = []
    if family == "python":
        ref, wrong = _python_results(rows, "canonical_solution"), _python_results(rows, "wrong_solution")
    else:
        ref = [_math_passes(r, r["answer"]) for r in rows]
        wrong = [_math_passes(r, r["wrong_solution"]) for r in rows]
    train_sigs = {} if is_train else {signature(family, t): t["task_id"] for t in train}
    seen: Dict[Tuple[str, str], str] = {}
    for r, ok, w in zip(rows, ref, wrong):
        tid = r.get("task_id", "?")
        if not ok:
            bad.append(f"{tid}: the reference fails its own tests")
        if w:
            bad.append(f"{tid}: the wrong solution passes")
        sig = signature(family, r)
        if sig in train_sigs:
            bad.append(f"{tid}: overlaps train task {train_sigs[sig]} (same tests)")
        if sig in seen:
            bad.append(f"{tid}: same tests as {seen[sig]} in this file")
        seen.setdefault(sig, tid)
    return bad


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not JSON ({e.msg})")
    return rows


def family_of(rows) -> str:
    return "python" if rows and "entry_point" in rows[0] else "math"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", nargs="*", metavar="FILE", default=None,
                    help="no FILE: the shipped files match the generator and every row is sound; "
                         "FILEs: every row of these task files is sound (named by task id)")
    ap.add_argument("--family", choices=FAMILIES, action="append", help="default: both")
    ap.add_argument("--seed", type=int, default=SEED, help="held-out seed (train is always the shipped one)")
    ap.add_argument("--heldout-only", action="store_true", help="write only a held-out set, to --out FILE")
    ap.add_argument("--n", type=int, default=None, help="held-out size (default 256)")
    ap.add_argument("--out", default=HERE, help="a directory (family subfolders), or with --heldout-only a file")
    a = ap.parse_args(argv)
    families = a.family or list(FAMILIES)
    if a.check is not None and a.check:  # named files
        bad = []
        for path in a.check:
            rows = read_jsonl(path)
            fam = family_of(rows)
            is_train = os.path.basename(path).startswith("train")
            bad += [f"{path}: {line}" for line in problems(fam, rows, generate_train(fam), is_train)]
        print("\n".join(bad) if bad else f"{len(a.check)} file(s): every row sound", file=sys.stderr if bad else sys.stdout)
        return 1 if bad else 0
    if a.heldout_only:
        if len(families) != 1 or os.path.isdir(a.out):
            ap.error("--heldout-only writes one family's held-out set: give --family and --out FILE")
        train = generate_train(families[0])
        held = generate_heldout(families[0], train, a.seed, a.n)
        bad = problems(families[0], held, train, False)
        if bad:
            print("\n".join(bad), file=sys.stderr)
            return 1
        with open(a.out, "w") as f:
            f.writelines(json.dumps(ordered(families[0], r)) + "\n" for r in held)
        print(f"{families[0]}: {len(held)} held-out tasks for seed {a.seed} -> {a.out} (disjoint from train, all sound)")
        return 0
    status = 0
    for fam in families:
        train = generate_train(fam)
        held = generate_heldout(fam, train, a.seed, a.n)
        bad = problems(fam, train, train, True) + problems(fam, held, train, False)
        files = render(fam, train, held)
        out = os.path.join(a.out, fam)
        if a.check is not None:
            bad += [f"{fam}/{n}: out of date (run python {os.path.relpath(__file__)})" for n, text in files.items()
                    if not os.path.isfile(os.path.join(out, n)) or open(os.path.join(out, n)).read() != text]
        if bad:
            print("\n".join(bad), file=sys.stderr)
            status = 1
            continue
        if a.check is None:
            os.makedirs(out, exist_ok=True)
            for n, text in files.items():
                with open(os.path.join(out, n), "w") as f:
                    f.write(text)
        levels = {lv: sum(r["level"] == lv for r in train) for lv in (1, 2, 3)}
        print(f"{fam}: {len(train)} train (levels 1/2/3: {levels[1]}/{levels[2]}/{levels[3]}), {len(held)} held-out; "
              f"{'up to date' if a.check is not None else 'written to ' + out}; references pass, wrong solutions "
              f"fail, no held-out task shares its tests with a train task")
    return status


if __name__ == "__main__":
    sys.exit(main())
