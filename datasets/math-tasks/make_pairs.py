"""Preference pairs from the math-tasks set, for reward models (jobs/reward_model.py) and DPO.

    python datasets/math-tasks/make_pairs.py          # writes pairs_train.jsonl, pairs_heldout.jsonl
    python datasets/math-tasks/make_pairs.py --check  # regenerate in memory, compare with the files

For each question (train.jsonl -> pairs_train, heldout.jsonl -> pairs_heldout): `prompt` is the
question with its answer format (the rows' `instruction`, the user message of SFT and GRPO),
`chosen` the worked answer, `rejected` the same answer with a wrong result: the last number of
the worked line and the number after '####' both replaced by result + d, d from
{-10, -2, -1, +1, +2, +10} (never negative): one drawn d per train question, every valid d
per held-out question. The two answers differ
only in the arithmetic, so a reward model has to read it to rank them. `margin` is
|d| / (|d| + 1) (larger for a bigger error; reward_model.margin_field can use it).
Deterministic, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261127
DELTAS = (-10, -2, -1, 1, 2, 10)
NUM = re.compile(r"\d+")


def corrupt(answer: str, target: str, d: int) -> str:
    """The answer with the worked line's last number and the '#### N' number set to target + d."""
    work, final = answer.rsplit("\n#### ", 1)
    assert final.strip() == target, (answer, target)
    wrong = int(target) + d
    nums = list(NUM.finditer(work))
    last = [m for m in nums if m.group() == target][-1]
    work = work[:last.start()] + str(wrong) + work[last.end():]
    return f"{work}\n#### {wrong}"


def pairs(rows, rnd, every_delta: bool):
    """One pair per question with a drawn delta (train), or one per valid delta (held out: ~6
    pairs per question, so held-out accuracy rests on ~170 pairs, not 30)."""
    out = []
    for r in rows:
        valid = [d for d in DELTAS if int(r["target"]) + d >= 0]
        for d in (valid if every_delta else [rnd.choice(valid)]):
            rejected = corrupt(r["answer"], r["target"], d)
            assert rejected != r["answer"]
            out.append({"id": f"{r['task_id']}/{d:+d}", "prompt": r["instruction"], "chosen": r["answer"],
                        "rejected": rejected, "margin": round(abs(d) / (abs(d) + 1), 4)})
    return out


def build():
    rnd = random.Random(SEED)
    files = {}
    for src, dst in (("train.jsonl", "pairs_train.jsonl"), ("heldout.jsonl", "pairs_heldout.jsonl")):
        with open(os.path.join(HERE, src)) as f:
            rows = [json.loads(line) for line in f]
        files[dst] = "".join(json.dumps(p) + "\n" for p in pairs(rows, rnd, every_delta=src == "heldout.jsonl"))
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing")
    a = ap.parse_args(argv)
    bad = 0
    for name, text in build().items():
        path = os.path.join(HERE, name)
        if a.check:
            same = os.path.isfile(path) and open(path).read() == text
            print(f"{name}: {'same' if same else 'DIFFERENT'}")
            bad += not same
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path} ({text.count(chr(10))} pairs)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
