"""RL tasks: what a policy is prompted with and what its verifiers check, read from task files.

A :class:`Task` is a plain picklable value (shipped to reward actors by value): its id, the
prompt text the policy sees (before any chat template), and whatever its verifiers need: a
code-optimisation ``problem``, Python ``tests``, a reference ``answer``, a regex ``pattern``,
and the whole row as read (``fields``, which a user's reward function receives).

Task files are JSONL or Parquet, on local disk or any pyarrow filesystem (``s3://``, ``gs://``,
``hdfs://``...). Field names are mapped by config (``rl.fields``, our name -> the file's): the
defaults read HumanEval rows (``task_id``, ``prompt``, ``entry_point``, ``test``), MBPP rows
(``test_list``, ``test_setup_code``) and GSM8K/MATH rows (``answer``). A row that cannot be a
task (bad JSON, a missing or empty field its verifiers need, a duplicate id, tests that do not
parse) is counted and reported by line, never fatal; a file with no usable row is a one-line
:class:`TaskError` naming the file.

Ids: the mapped ``id`` field when the row has one, else ``<file stem>/<row number>``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from elastic.reward.verifiers.code_opt.problems import Problem, ProblemError
from elastic.reward.verifiers.python_tests.verifier import PythonTests

# Our field names and the names they are read from by default (rl.fields overrides any).
DEFAULT_FIELDS: Dict[str, str] = {
    "id": "task_id", "prompt": "prompt", "answer": "answer", "pattern": "pattern",
    # python_tests (HumanEval: code_prompt is the signature + docstring a body continues)
    "code_prompt": "prompt", "entry_point": "entry_point", "test": "test",
    "test_list": "test_list", "test_setup": "test_setup_code",
}
MAX_BAD_SHOWN = 5


class TaskError(ProblemError):
    """A task file that cannot be used; the message is one line naming the file (and line).
    A ProblemError, so every entry point reports it as a one-line data error (exit code 2)."""


@dataclass
class Task:
    id: str
    prompt: str
    problem: Optional[Problem] = None
    tests: Optional[PythonTests] = None
    answer: Optional[str] = None
    pattern: Optional[str] = None
    fields: Dict[str, Any] = field(default_factory=dict)
    where: str = ""  # "file:line", for messages
    # The row's `reveal_answer: true`: multi-turn feedback in rl.feedback=details mode may show
    # this task's gold answer after a wrong turn (teacher forcing); never otherwise
    # (elastic/reward/feedback.py).
    reveal_answer: bool = False


@dataclass
class TaskSet:
    """The usable tasks of one file (in file order) and what was skipped."""

    path: str
    tasks: Dict[str, Task]
    rows: int = 0
    bad: int = 0
    bad_examples: List[str] = field(default_factory=list)

    def describe(self) -> str:
        s = f"{len(self.tasks)} tasks from {self.path}"
        if self.bad:
            s += f", {self.bad} bad rows skipped (e.g. {self.bad_examples[0]})"
        return s


def tasks_from_problems(problems: Dict[str, Problem], prompt_of: Optional[Callable[[Problem], str]] = None) -> Dict[str, Task]:
    """Code-optimisation problems as tasks (the ``code_opt`` verifier's form)."""
    return {pid: Task(pid, prompt_of(p) if prompt_of else p.statement, problem=p, where=p.root)
            for pid, p in problems.items()}


def _open_rows(path: str) -> Iterator[Tuple[str, Any]]:
    """(where, row dict or an Exception) for each row of a JSONL or Parquet file."""
    import pyarrow.fs as pafs

    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
    else:
        fs, inner = pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        info = fs.get_file_info(inner)
    except Exception as e:  # bad URI, no credentials...
        raise TaskError(f"{path}: cannot open ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if info.type != pafs.FileType.File:
        raise TaskError(f"{path}: task file not found")
    name = Path(inner).name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(inner, filesystem=fs)
        except Exception as e:
            raise TaskError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0][:200]})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}:row {i + 1}", row
        return
    if not (name.endswith(".jsonl") or name.endswith(".json") or name.endswith(".jsonl.gz")):
        raise TaskError(f"{path}: task files are .jsonl, .jsonl.gz or .parquet")
    compression = "gzip" if name.endswith(".gz") else None
    with fs.open_input_stream(inner, compression=compression) as f:
        data = f.read()
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines()):
        if not line.strip():
            continue
        where = f"{path}:{i + 1}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            yield where, ValueError(f"not JSON ({e.msg})")
            continue
        yield where, row if isinstance(row, dict) else ValueError("not a JSON object")


def _text(row: Dict[str, Any], name: str, fields: Dict[str, str], required: bool) -> Optional[str]:
    key = fields[name]
    v = row.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        if required:
            raise ValueError(f"missing field {key!r}" + (f" (rl.fields.{name})" if key != name else ""))
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and name == "answer":
        return str(v)
    if not isinstance(v, str):
        raise ValueError(f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def row_task(row: Dict[str, Any], where: str, index: int, stem: str, fields: Dict[str, str],
             needs: Sequence[str], python_limits: Tuple[float, int] = (3.0, 512)) -> Task:
    """One row as a Task; ValueError (one line) when it cannot be one. `needs`: what the
    verifiers require of every task ("tests", "answer", "pattern")."""
    from elastic.reward.verifiers.python_tests.verifier import check_tests

    tid = row.get(fields["id"])
    tid = str(tid) if tid is not None and str(tid).strip() else f"{stem}/{index}"
    prompt = _text(row, "prompt", fields, True)
    task = Task(tid, prompt, fields=row, where=where, reveal_answer=row.get("reveal_answer") is True)
    if "answer" in needs:
        task.answer = _text(row, "answer", fields, True)
    task.pattern = _text(row, "pattern", fields, False)
    if "tests" in needs:
        tl = row.get(fields["test_list"])
        if tl is not None and not (isinstance(tl, (list, tuple)) and all(isinstance(t, str) for t in tl)):
            raise ValueError(f"field {fields['test_list']!r} must be a list of strings")
        spec = PythonTests(entry_point=_text(row, "entry_point", fields, False) or "",
                           test=_text(row, "test", fields, False) or "", test_list=list(tl or []),
                           test_setup=_text(row, "test_setup", fields, False) or "",
                           prompt=_text(row, "code_prompt", fields, False) or "",
                           time_limit_s=python_limits[0], memory_mb=python_limits[1])
        check_tests(spec, where)
        task.tests = spec
    return task


def load_tasks(path: str, fields: Optional[Dict[str, str]] = None, needs: Sequence[str] = (),
               python_limits: Tuple[float, int] = (3.0, 512)) -> TaskSet:
    """Read a task file (see the module docstring); bad rows are counted, not fatal."""
    f = dict(DEFAULT_FIELDS)
    unknown = set(fields or {}) - set(DEFAULT_FIELDS)
    if unknown:
        raise TaskError(f"rl.fields: unknown name(s) {', '.join(sorted(unknown))} (known: {', '.join(DEFAULT_FIELDS)})")
    f.update(fields or {})
    stem = Path(path.split("://")[-1]).name.split(".")[0]
    out = TaskSet(path, {})
    for i, (where, row) in enumerate(_open_rows(path)):
        out.rows += 1
        try:
            if isinstance(row, Exception):
                raise row
            t = row_task(row, where, i + 1, stem, f, needs, python_limits)
            if t.id in out.tasks:
                raise ValueError(f"duplicate id {t.id!r} (first at {out.tasks[t.id].where})")
            out.tasks[t.id] = t
        except ValueError as e:
            out.bad += 1
            if len(out.bad_examples) < MAX_BAD_SHOWN:
                msg = str(e)
                out.bad_examples.append(msg if msg.startswith(where) else f"{where}: {msg}")
    if not out.tasks:
        why = f": {out.bad_examples[0]}" if out.bad_examples else ""
        raise TaskError(f"{path}: no usable task in {out.rows} rows{why}")
    return out
