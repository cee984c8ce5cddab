"""The shipped code-optimisation problems (datasets/code-opt) as instruction data.

One prompt per problem, used both for SFT (statement → the reference and the fast solution,
two rows per problem) and for GRPO rollouts, so the policy sees the same prompt at RL time
that it was fine-tuned on. Read straight from the problem directories (format in
datasets/README.md) with no dependency on the reward service.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

import yaml

from elastic.data.sources import DataError

LANGUAGE_NAME = {"c": "C", "cpp": "C++"}
FENCE_TAG = {"c": "c", "cpp": "cpp"}


def problem_ids(problems_dir: str) -> List[str]:
    d = Path(problems_dir)
    if not d.is_dir():
        raise DataError(f"{problems_dir}: no such problem directory")
    return sorted(p.name for p in d.iterdir() if (p / "problem.yaml").is_file())


def _meta(problem_dir: Path) -> dict:
    try:
        return yaml.safe_load((problem_dir / "problem.yaml").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DataError(f"{problem_dir / 'problem.yaml'}: unreadable ({e})") from None


def prompt_text(problem_dir: "str | Path") -> str:
    """The user message for a problem: the task, the answer format, then the statement."""
    d = Path(problem_dir)
    lang = _meta(d)["language"]
    statement = (d / "statement.md").read_text().strip()
    return (f"Write a complete {LANGUAGE_NAME[lang]} program that solves the problem below. It must be correct "
            f"and as fast as possible. Answer with the program in one ```{FENCE_TAG[lang]} code block.\n\n{statement}")


def _solution(d: Path, stem: str) -> tuple[str, str]:
    for ext, lang in ((".c", "c"), (".cpp", "cpp")):
        p = d / f"{stem}{ext}"
        if p.is_file():
            return lang, p.read_text()
    raise DataError(f"{d}: no {stem}.c or {stem}.cpp")


def completion_text(language: str, source: str) -> str:
    return f"```{FENCE_TAG[language]}\n{source.rstrip()}\n```"


def sft_rows(problems_dir: str, ids: Iterable[str]) -> List[Dict[str, str]]:
    """Two rows per problem: its statement answered by the reference solution and by the fast one."""
    rows = []
    for pid in ids:
        d = Path(problems_dir) / pid
        prompt = prompt_text(d)
        ref_lang, ref = _solution(d, "reference")
        fast_lang, fast = _solution(d / "solutions", "fast")
        rows.append({"prompt": prompt, "completion": completion_text(ref_lang, ref), "problem": pid, "solution": "reference"})
        rows.append({"prompt": prompt, "completion": completion_text(fast_lang, fast), "problem": pid, "solution": "fast"})
    return rows


def write_jsonl(rows: Sequence[dict], path: str) -> str:
    """Write rows atomically (a relaunch never reads half a file)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)
    return path
