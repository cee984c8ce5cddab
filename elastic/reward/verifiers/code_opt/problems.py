"""Load a code-optimisation problem directory (format: datasets/README.md).

A malformed problem raises :class:`ProblemError` whose message is one line naming the file
and the field, so a broken dataset fails before any evaluation is scheduled. A Problem is a
plain picklable value (tests are read into memory; they are small) so the pool can ship it
to actors on other nodes without a shared filesystem; the benchmark input is *generated*
where it is needed, by the trusted ``gen_bench.py``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import yaml

LANGUAGES = ("c", "cpp")
KINDS = ("algorithmic", "memory_layout", "repeated_work", "io_buffering", "data_structure")
SOURCE_EXT = {"c": ".c", "cpp": ".cpp"}


class ProblemError(ValueError):
    """A malformed problem; the message is one line naming the file and field."""


@dataclass
class TestCase:
    name: str
    input: bytes
    expected: bytes


@dataclass
class Problem:
    id: str
    title: str
    language: str
    kind: str
    time_limit_s: float
    memory_limit_mb: int
    checker: str
    bench_time_limit_s: float
    statement: str
    reference_source: str
    tests: List[TestCase]
    gen_bench_source: str
    root: str = ""
    solutions: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # name -> (language, source)

    @property
    def content_hash(self) -> str:
        """Hash of everything that decides reference behaviour (not solutions or statement)."""
        h = hashlib.sha256()
        for part in (self.id, self.language, self.checker, str(self.time_limit_s), str(self.memory_limit_mb),
                     str(self.bench_time_limit_s), self.reference_source, self.gen_bench_source):
            h.update(part.encode())
            h.update(b"\0")
        for t in self.tests:
            h.update(t.name.encode() + b"\0" + t.input + b"\0" + t.expected + b"\0")
        return h.hexdigest()[:16]


def _req(meta: dict, key: str, typ: type, where: str):
    if key not in meta:
        raise ProblemError(f"{where}: missing field '{key}'")
    v = meta[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, typ) or isinstance(v, bool):
        raise ProblemError(f"{where}: field '{key}' must be {typ.__name__}, got {v!r}")
    return v


_CHECKER = re.compile(r"^(exact|tokens|float:([0-9.eE+-]+))$")


def load_problem(path: "str | Path") -> Problem:
    """Load `path` (the problem directory or its problem.yaml)."""
    root = Path(path)
    if root.name == "problem.yaml":
        root = root.parent
    yml = root / "problem.yaml"
    if not yml.is_file():
        raise ProblemError(f"{yml}: not found")
    try:
        meta = yaml.safe_load(yml.read_text())
    except yaml.YAMLError as e:
        raise ProblemError(f"{yml}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(meta, dict):
        raise ProblemError(f"{yml}: top level must be a mapping")
    w = str(yml)
    pid = _req(meta, "id", str, w)
    if pid != root.name:
        raise ProblemError(f"{w}: field 'id' is {pid!r} but the folder is {root.name!r}")
    title = _req(meta, "title", str, w)
    lang = _req(meta, "language", str, w)
    if lang not in LANGUAGES:
        raise ProblemError(f"{w}: field 'language' must be c|cpp, got {lang!r}")
    kind = _req(meta, "kind", str, w)
    if kind not in KINDS:
        raise ProblemError(f"{w}: field 'kind' must be one of {'|'.join(KINDS)}, got {kind!r}")
    tl = _req(meta, "time_limit_s", float, w)
    ml = _req(meta, "memory_limit_mb", int, w)
    btl = _req(meta, "bench_time_limit_s", float, w)
    for k, v in (("time_limit_s", tl), ("memory_limit_mb", ml), ("bench_time_limit_s", btl)):
        if v <= 0:
            raise ProblemError(f"{w}: field '{k}' must be > 0, got {v}")
    checker = _req(meta, "checker", str, w)
    m = _CHECKER.match(checker)
    if not m:
        raise ProblemError(f"{w}: field 'checker' must be exact|tokens|float:<abs_tol>, got {checker!r}")
    if m.group(2) is not None:
        try:
            float(m.group(2))
        except ValueError:
            raise ProblemError(f"{w}: field 'checker' has a bad tolerance {m.group(2)!r}") from None
    unknown = set(meta) - {"id", "title", "language", "kind", "time_limit_s", "memory_limit_mb", "checker", "bench_time_limit_s"}
    if unknown:
        raise ProblemError(f"{w}: unknown field(s) {', '.join(sorted(unknown))}")
    statement = root / "statement.md"
    if not statement.is_file():
        raise ProblemError(f"{statement}: not found")
    ref = root / f"reference{SOURCE_EXT[lang]}"
    if not ref.is_file():
        raise ProblemError(f"{ref}: not found (language is {lang})")
    tests: List[TestCase] = []
    tdir = root / "tests"
    for inp in sorted(tdir.glob("*.in")) if tdir.is_dir() else []:
        outp = inp.with_suffix(".out")
        if not outp.is_file():
            raise ProblemError(f"{outp}: missing expected output for {inp.name}")
        tests.append(TestCase(inp.stem, inp.read_bytes(), outp.read_bytes()))
    if len(tests) < 3:
        raise ProblemError(f"{tdir}: needs >= 3 .in/.out pairs, found {len(tests)}")
    gen = root / "gen_bench.py"
    if not gen.is_file():
        raise ProblemError(f"{gen}: not found")
    sols: Dict[str, Tuple[str, str]] = {}
    sdir = root / "solutions"
    for p in sorted(sdir.iterdir()) if sdir.is_dir() else []:
        if p.suffix in (".c", ".cpp"):
            sols[p.stem] = ("c" if p.suffix == ".c" else "cpp", p.read_text())
    return Problem(pid, title, lang, kind, tl, ml, checker, btl, statement.read_text(), ref.read_text(), tests,
                   gen.read_text(), str(root.resolve()), sols)


def load_problems(directory: "str | Path") -> Dict[str, Problem]:
    """All problems under `directory` (each `<id>/problem.yaml`), keyed by id."""
    d = Path(directory)
    if not d.is_dir():
        raise ProblemError(f"{d}: problems directory not found")
    out = {}
    for yml in sorted(d.glob("*/problem.yaml")):
        p = load_problem(yml)
        out[p.id] = p
    return out
