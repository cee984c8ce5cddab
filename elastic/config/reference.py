"""The config reference (docs/config.md), generated from the schema itself.

Every field of every section of :class:`elastic.config.schema.Config`, in declaration order,
with its type, its default and the comment written above it (or after it on its line) in the
schema's source. The comments are read from the source with :mod:`tokenize` and matched to
fields with :mod:`ast`, so the schema stays plain dataclasses with ordinary comments: adding a
field with a comment above it is all it takes, then regenerate the page::

    .venv/bin/python -m elastic.config reference --write

``tests/test_config_reference.py`` fails when docs/config.md and the schema disagree.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import os
import tokenize
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from elastic.config.schema import Config

REGENERATE = ".venv/bin/python -m elastic.config reference --write"
DEFAULT_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "config.md")


@dataclass(frozen=True)
class FieldDoc:
    key: str        # dotted, e.g. "data.build_ahead" or "model.lora.rank"
    type: str       # the annotation as written in the source
    default: str    # the default, as YAML/JSON would spell it
    comment: str    # the source comment, one paragraph ("" when the field has none)


@dataclass(frozen=True)
class SectionDoc:
    key: str        # "data", "model.lora"
    doc: str        # the section class's docstring ("" when none)
    fields: Tuple[FieldDoc, ...]


@lru_cache(maxsize=None)
def _source_comments(path: str) -> Dict[str, Tuple[str, Dict[str, str]]]:
    """{class name: (docstring, {field name: comment})} for every class in a source file."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    comments: Dict[int, str] = {}   # line -> comment text
    code_lines = set()              # lines holding code tokens
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string[1:].strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER, tokenize.ENCODING):
            for line in range(tok.start[0], tok.end[0] + 1):
                code_lines.add(line)
    out: Dict[str, Tuple[str, Dict[str, str]]] = {}
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.ClassDef):
            continue
        per_field: Dict[str, str] = {}
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above: List[str] = []
            line = stmt.lineno - 1
            while line in comments and line not in code_lines:  # a block of whole-line comments
                above.insert(0, comments[line])
                line -= 1
            inline = [comments[ln] for ln in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                      if ln in comments and ln in code_lines]
            per_field[stmt.target.id] = " ".join(t for t in above + inline if t)
        out[node.name] = (inspect.cleandoc(ast.get_docstring(node) or ""), per_field)
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _spell(v: Any) -> str:
    try:
        return json.dumps(v)
    except TypeError:
        return repr(v)


def sections(root: type = Config) -> List[SectionDoc]:
    """Every section (nested sections such as model.lora after their parent), in order."""
    out: List[SectionDoc] = []

    def walk(cls: type, prefix: str) -> None:
        doc, comments = _source_comments(inspect.getsourcefile(cls)).get(cls.__name__, ("", {}))
        hints = typing.get_type_hints(cls)
        fields, nested = [], []
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                nested.append((f.name, hints[f.name]))
                continue
            tp = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            fields.append(FieldDoc(f"{prefix}.{f.name}", tp, _spell(_default(f)), comments.get(f.name, "")))
        out.append(SectionDoc(prefix, doc, tuple(fields)))
        for name, sub in nested:
            walk(sub, f"{prefix}.{name}")

    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        walk(hints[f.name], f.name)
    return out


def all_fields(root: type = Config) -> List[FieldDoc]:
    return [fd for s in sections(root) for fd in s.fields]


def undocumented(root: type = Config) -> List[str]:
    """Keys of the fields that have no comment in the schema's source."""
    return [fd.key for fd in all_fields(root) if not fd.comment]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped; outside `code`, < > & as entities (a
    comment's `<run dir>` would otherwise be taken for an HTML tag)."""
    parts = text.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def render_markdown(root: type = Config) -> str:
    secs = sections(root)
    n = sum(len(s.fields) for s in secs)
    lines = [
        "# Config reference",
        "",
        "<!-- Generated from elastic/config/schema.py by `python -m elastic.config reference --write`;",
        "     do not edit by hand: tests/test_config_reference.py fails when this page and the schema disagree. -->",
        "",
        "Every field of every section, its type, its default and the comment on it in",
        "[`elastic/config/schema.py`](../elastic/config/schema.py), generated from that file. A job takes a",
        "YAML file (`--config FILE`, sections as below) and `--set key.sub=value` overrides (repeatable);",
        "a bad key, type or value stops the job before Ray starts, with one `config error:` line naming",
        "the key ([troubleshooting](troubleshooting.md#config-error)). Cross-field rules (for example a",
        "global batch that every world size in `min_workers..max_workers` must split) are checked in",
        "[`elastic/config/load.py`](../elastic/config/load.py). The same reference prints on the command",
        "line:",
        "",
        "```bash",
        ".venv/bin/python -m elastic.config reference       # this page, as Markdown",
        ".venv/bin/python -m elastic.config --help          # the same fields as plain text",
        "```",
        "",
        f"{len(secs)} sections, {n} fields. Sections: "
        + ", ".join(f"[`{s.key}`](#{s.key.replace('.', '')})" for s in secs) + ".",
        "",
    ]
    for s in secs:
        lines += [f"## {s.key}", ""]
        if s.doc:
            lines += [" ".join(s.doc.split()), ""]
        if not s.fields:
            lines += ["(no fields of its own)", ""]
            continue
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for fd in s.fields:
            lines.append(f"| <a id=\"{fd.key}\"></a>`{fd.key}` | `{_cell(fd.type)}` | `{_cell(fd.default)}` | "
                         f"{_cell(fd.comment) or '(no comment in the schema)'} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_text(root: type = Config, width: int = 100) -> str:
    """The same fields for a terminal: `key  type = default` then the comment, indented."""
    import textwrap

    out: List[str] = []
    for s in sections(root):
        out.append(f"[{s.key}]" + (f"  {' '.join(s.doc.split())}" if s.doc else ""))
        for fd in s.fields:
            out.append(f"  {fd.key}: {fd.type} = {fd.default}")
            if fd.comment:
                out += textwrap.wrap(fd.comment, width, initial_indent="      ", subsequent_indent="      ")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def page_is_current(path: Optional[str] = None) -> bool:
    path = path or DEFAULT_PAGE
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == render_markdown()
    except OSError:
        return False
