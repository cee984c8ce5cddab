"""The layout holds: no import circle anywhere in `elastic`, and every import (at top level or
inside a function) points down the package table of docs/architecture.md, which is read here as
the rule, so the page and the code cannot drift apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| `([\w.]+)` \| (.+?) \| (.+?) \|$")


def layer_table() -> Dict[str, Tuple[int, Set[str]]]:
    """{package: (floor, packages it may import)} from the page's package table."""
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(2)] = (int(m.group(1)), set(re.findall(r"`([\w.]+)`", m.group(4))))
    return rows


def modules() -> Dict[str, Path]:
    """Every module of the package and of jobs/, by dotted name (a package by its __init__)."""
    out = {}
    for root in ("elastic", "jobs"):
        for p in (REPO / root).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: Dict[str, Path]) -> Iterator[Tuple[str, int]]:
    """(module imported, line) for every import of `path` that names a module of this tree; a
    `from package import name` counts as importing the submodule when `name` is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # an attribute of a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                yield t, node.lineno


def owner(module: str, table: Dict[str, Tuple[int, Set[str]]]) -> str:
    """The table row a module belongs to: the longest package name that is its prefix."""
    best = ""
    for pkg in table:
        if (module == pkg or module.startswith(pkg + ".")) and len(pkg) > len(best):
            best = pkg
    return best


def graph() -> Dict[str, Dict[str, int]]:
    known = modules()
    return {m: dict(imports(m, p, known)) for m, p in known.items()}


def circles(g: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_whole_package():
    assert circles(graph()) == []


def test_circle_finder_finds_a_circle():
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_the_table_is_itself_downward_and_names_real_packages():
    table = layer_table()
    assert len(table) >= 15, f"the package table of {PAGE.name} was not found or lost rows: {sorted(table)}"
    known = modules()
    for pkg, (floor, allowed) in table.items():
        assert any(k == pkg or k.startswith(pkg + ".") for k in known), \
            f"{PAGE.name} names {pkg}, which is not a module or package of this tree"
        for dep in allowed:
            assert dep in table, f"{pkg} may import {dep}, which has no row"
            assert table[dep][0] < floor, f"{pkg} (floor {floor}) may import {dep} (floor {table[dep][0]}): not downward"


def test_every_import_points_down_the_table():
    table = layer_table()
    g = graph()
    assert g.pop("elastic") == {}, "elastic/__init__.py imports nothing: `import elastic.x` must not load other rooms"
    unplaced = [m for m in g if not owner(m, table)]
    assert not unplaced, f"modules with no row in {PAGE.name}: {unplaced}"
    bad = []
    for m, deps in sorted(g.items()):
        mine = owner(m, table)
        for dep, line in sorted(deps.items()):
            theirs = owner(dep, table)
            if theirs != mine and theirs not in table[mine][1]:
                bad.append(f"{known_path(m)}:{line} imports {dep} ({mine} may not import {theirs})")
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)


def test_every_package_of_the_tree_has_a_row():
    """A new package gets a row (and so a rule) when it is made."""
    table = layer_table()
    packages = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "elastic").glob("*/__init__.py")}
    packages |= {f"elastic.{p.stem}" for p in (REPO / "elastic").glob("*.py") if p.stem != "__init__"}
    assert packages - set(table) == set(), f"packages without a row in {PAGE.name}: {packages - set(table)}"


def known_path(module: str) -> str:
    return str(modules()[module].relative_to(REPO))
