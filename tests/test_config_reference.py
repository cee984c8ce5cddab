"""docs/config.md is generated from elastic/config/schema.py and must agree with it; the same
reference prints on the command line; and the config package has no import cycle."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

from elastic.config import reference
from elastic.config.schema import Config

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "config.md"


def _schema_keys(cls=Config, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _schema_keys(hints[f.name], key + ".")
        elif prefix:
            yield key


def test_page_matches_schema():
    want = reference.render_markdown()
    have = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert have == want, (
        "docs/config.md disagrees with elastic/config/schema.py (a field was added, removed or its "
        f"comment/default changed). Regenerate it with:  {reference.REGENERATE}")


def test_every_field_is_listed_with_its_comment():
    docs = {fd.key: fd for fd in reference.all_fields()}
    assert list(docs) == list(_schema_keys())  # every field, in declaration order
    page = PAGE.read_text(encoding="utf-8")
    for key in docs:
        assert f'<a id="{key}"></a>`{key}`' in page, f"{key} is not in docs/config.md; regenerate it: {reference.REGENERATE}"
    b = docs["data.build_ahead"]
    assert (b.type, b.default) == ("int", "2")
    assert b.comment.startswith("Shards tokenized ahead of the train workers' position") and "bounded window" in b.comment
    assert docs["eval.every_steps"].comment == "0 = off"  # an inline comment
    assert docs["model.lora.targets"].default.startswith('["wq", "wk"')  # default_factory
    assert docs["model.dim"].type == "Optional[int]" and docs["model.dim"].default == "null"
    assert docs["rl.heldout"].comment.startswith("Problem ids held out from training")  # a multi-line field


def test_command_line_prints_the_reference():
    run = lambda *a: subprocess.run([sys.executable, "-m", "elastic.config", *a], cwd=REPO, capture_output=True,
                                    text=True, timeout=120)
    md = run("reference")
    assert md.returncode == 0 and md.stdout == reference.render_markdown()
    helped = run("--help")
    assert helped.returncode == 0
    for fd in reference.all_fields():
        assert f"  {fd.key}: {fd.type} = {fd.default}" in helped.stdout
    assert run("reference", "--check").returncode == 0, f"docs/config.md is stale; regenerate it: {reference.REGENERATE}"


def test_check_reports_a_stale_page(tmp_path):
    stale = tmp_path / "config.md"
    stale.write_text(reference.render_markdown().replace("data.build_ahead", "data.build_ahed", 1))
    r = subprocess.run([sys.executable, "-m", "elastic.config", "reference", "--check", str(stale)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and reference.REGENERATE in r.stderr


def _imports(path: Path):
    """Modules a source file imports, at top level or inside functions."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_config_package_has_no_import_cycle():
    pkg = REPO / "elastic" / "config"
    graph = {p.stem: {m.rsplit(".", 1)[-1] for m in _imports(p) if m.startswith("elastic.config.")}
             for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert "load" not in graph["init_from"]  # init_from used to import load lazily, and load init_from

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and n in graph and reaches(n, b, seen + (n,))) for n in graph[a])

    cycles = [m for m in graph if reaches(m, m)]
    assert not cycles, f"import cycles through {cycles}: {graph}"
    # nothing outside elastic.config.* is imported by the package (it sits at the bottom of the layers)
    for p in pkg.glob("*.py"):
        outside = {m for m in _imports(p) if m.startswith("elastic.") and not m.startswith("elastic.config")}
        assert not outside, f"{p.name} imports {outside}"
