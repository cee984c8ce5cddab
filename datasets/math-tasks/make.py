"""Generate the math-tasks set: GSM8K-style word problems with one or two arithmetic steps.

    python datasets/math-tasks/make.py          # writes train.jsonl, heldout.jsonl,
                                                # sft.jsonl, heldout_sft.jsonl here
    python datasets/math-tasks/make.py --check  # regenerate in memory, compare with the files

Deterministic (fixed seed, standard library only). Six templated families (add, subtract,
multiply, share equally, add-then-subtract, multiply-then-add) on small numbers (sums of 2..7,
products of 2..6), with names, objects and numbers drawn per question. The held-out questions
are drawn first (they do not change with --train-per-family); no train question uses the
numbers of a held-out question of its family, so a held-out question is never a train question
with other names. Its arithmetic facts ("7 + 5 = 12") may occur in train answers of other
families (add_sub's first step is an addition, mul_add's a product; division facts occur only
in `div`): the script prints how many held-out questions use only facts seen in training.
100 questions per family: a tiny model trained from scratch on 20 per family memorised them
and got held-out arithmetic wrong (memorised results; datasets/README.md).

Row fields: task_id "math/<family>-<n>", question, answer (GSM8K form: one line of worked
solution, then "#### <number>"), instruction (the user message: the question and the answer
format), and target (the number, as text).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from typing import Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261126
TRAIN_PER_FAMILY = 100
HELDOUT_PER_FAMILY = 5
SUFFIX = "End your answer with '#### <number>'."

PEOPLE = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Emma", "Jack", "Ella"]
THINGS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "coins", "cards", "eggs", "shells"]

Q = Tuple[str, str, int, tuple]  # question, worked line, answer, numbers


def _add(rng, name, things) -> Q:
    a, b = rng.randint(2, 7), rng.randint(2, 7)
    r = a + b
    return (f"{name} has {a} {things} and buys {b} more. How many {things} does {name} have now?",
            f"{name} has {a} + {b} = {r} {things}.", r, (a, b))


def _sub(rng, name, things) -> Q:
    b = rng.randint(2, 7)
    a = b + rng.randint(1, 6)
    r = a - b
    return (f"{name} has {a} {things} and gives {b} of them to a friend. How many {things} does {name} have left?",
            f"{name} has {a} - {b} = {r} {things} left.", r, (a, b))


def _mul(rng, name, things) -> Q:
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    r = a * b
    return (f"{name} buys {a} bags with {b} {things} in each bag. How many {things} does {name} buy?",
            f"{name} buys {a} * {b} = {r} {things}.", r, (a, b))


def _div(rng, name, things) -> Q:
    b, q = rng.randint(2, 5), rng.randint(2, 6)
    a = b * q
    return (f"{name} shares {a} {things} equally among {b} friends. How many {things} does each friend get?",
            f"Each friend gets {a} / {b} = {q} {things}.", q, (a, b))


def _add_sub(rng, name, things) -> Q:
    a, b = rng.randint(2, 7), rng.randint(2, 7)
    c = rng.randint(1, a + b - 1)
    s = a + b
    r = s - c
    return (f"{name} has {a} {things}, finds {b} more and then loses {c}. How many {things} does {name} have now?",
            f"{name} has {a} + {b} = {s} {things}, then {s} - {c} = {r}.", r, (a, b, c))


def _mul_add(rng, name, things) -> Q:
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    c = rng.randint(1, 6)
    p = a * b
    r = p + c
    return (f"{name} buys {a} boxes of {b} {things} and gets {c} more as a gift. How many {things} does {name} have?",
            f"{name} buys {a} * {b} = {p} {things}, then {p} + {c} = {r}.", r, (a, b, c))


FAMILIES: List[Tuple[str, Callable[..., Q]]] = [("add", _add), ("sub", _sub), ("mul", _mul), ("div", _div),
                                                ("add_sub", _add_sub), ("mul_add", _mul_add)]


def instruction_for(question: str) -> str:
    return f"{question}\n{SUFFIX}"


_EQ = re.compile(r"\d+ [-+*/] \d+ = \d+")


def _row(fam: str, i: int, question: str, work: str, r: int) -> dict:
    return {"task_id": f"math/{fam}-{i}", "question": question, "answer": f"{work}\n#### {r}",
            "instruction": instruction_for(question), "target": str(r)}


def generate(seed: int = SEED, train_per_family: int = TRAIN_PER_FAMILY) -> Tuple[List[dict], List[dict]]:
    """Held-out questions first (so they do not depend on the train size), each family's with
    distinct numbers; then the train questions, which never use the numbers of a held-out
    question of their family. A held-out question's arithmetic facts ("7 + 5 = 12") can still
    occur in train answers of other families (add_sub's first step is an addition, ...)."""
    rng = random.Random(seed)
    train: List[dict] = []
    heldout: List[dict] = []
    questions: set = set()
    held_numbers: Dict[str, set] = {fam: set() for fam, _ in FAMILIES}

    def draw(fam: str, make: Callable[..., Q], avoid: set, where: str) -> Q:
        for _ in range(5000):
            q = make(rng, rng.choice(PEOPLE), rng.choice(THINGS))
            if q[0] not in questions and q[3] not in avoid:
                questions.add(q[0])
                return q
        raise RuntimeError(f"{fam}: could not draw a {where} question")

    held: Dict[str, List[Q]] = {}
    for fam, make in FAMILIES:
        held[fam] = []
        for _ in range(HELDOUT_PER_FAMILY):
            q = draw(fam, make, held_numbers[fam], "held-out")
            held_numbers[fam].add(q[3])
            held[fam].append(q)
    for fam, make in FAMILIES:
        for i in range(train_per_family):
            question, work, r, _ = draw(fam, make, held_numbers[fam], "train")
            train.append(_row(fam, i, question, work, r))
        for j, (question, work, r, _) in enumerate(held[fam]):
            heldout.append(_row(fam, train_per_family + j, question, work, r))
    return train, heldout


def fact_coverage(train: List[dict], heldout: List[dict]) -> Tuple[int, int]:
    """(held-out questions whose every equation occurs in a train answer, held-out questions)."""
    facts = {e for row in train for e in _EQ.findall(row["answer"])}
    return sum(set(_EQ.findall(r["answer"])) <= facts for r in heldout), len(heldout)


_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def verify(train: List[dict], heldout: List[dict]) -> None:
    rows = train + heldout
    ids = [r["task_id"] for r in rows]
    assert len(set(ids)) == len(ids), "duplicate task ids"
    train_q = {r["question"] for r in train}
    for r in heldout:
        assert r["question"] not in train_q, f"{r['task_id']}: same question as a train row"
    for r in rows:
        m = _FINAL.findall(r["answer"])
        assert m and m[-1] == r["target"], f"{r['task_id']}: answer does not end with '#### {r['target']}'"
        # the worked line's equations hold
        for lhs, rhs in re.findall(r"(\d+ [-+*/] \d+) = (\d+)", r["answer"]):
            assert eval(lhs) == int(rhs), f"{r['task_id']}: {lhs} != {rhs}"  # noqa: S307 (own text)
        assert r["answer"].count("\n") == 1


def sft_row(row: dict) -> dict:
    return {"messages": [{"role": "user", "content": row["instruction"]},
                         {"role": "assistant", "content": row["answer"]}]}


def render(train: List[dict], heldout: List[dict]) -> Dict[str, str]:
    def jsonl(rows):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    return {"train.jsonl": jsonl(train), "heldout.jsonl": jsonl(heldout),
            "sft.jsonl": jsonl([sft_row(r) for r in train]),
            "heldout_sft.jsonl": jsonl([sft_row(r) for r in heldout])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify the files here match the generator")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--train-per-family", type=int, default=TRAIN_PER_FAMILY,
                    help="train questions per family (the held-out questions do not change with it)")
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
    covered, n = fact_coverage(train, heldout)
    print(f"math-tasks: {len(FAMILIES)} families, {len(train)} train, {len(heldout)} held-out questions "
          f"({'up to date' if args.check else 'written to ' + args.out}); {covered}/{n} held-out questions use "
          f"only equations that occur in train answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
