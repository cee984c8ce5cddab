"""Resolve a data source (directory + glob, files, pyarrow filesystem URIs) into a sorted file list.

Everything here runs on the driver before any worker starts, so a missing path or an
unreadable file is a one-line :class:`DataError` instead of a failure deep inside a job.
"""

from __future__ import annotations

import fnmatch
import os
import sysconfig
from dataclasses import dataclass
from typing import List, Optional, Tuple

import pyarrow.fs as pafs


class DataError(ValueError):
    """Bad data input: the message is one line naming the path (and row) at fault."""


@dataclass(frozen=True)
class SourceFile:
    uri: str      # what pyarrow's FileSystem.from_uri (or a local open) takes
    path: str     # path inside the filesystem
    size: int
    format: str   # text | jsonl | parquet


_EXT_FORMAT = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def filesystem_for(uri: str) -> Tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for a local path or any URI pyarrow knows."""
    if "://" in uri:
        try:
            return pafs.FileSystem.from_uri(uri)
        except Exception as e:  # pyarrow raises several types for bad URIs
            raise DataError(f"data.source {uri}: cannot open filesystem ({e})") from None
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def stdlib_source() -> Tuple[str, str]:
    """The running interpreter's standard-library sources: real text, no download."""
    return sysconfig.get_paths()["stdlib"], "**/*.py"


def _infer_format(path: str, declared: str) -> str:
    if declared != "auto":
        return declared
    return _EXT_FORMAT.get(os.path.splitext(path)[1].lower(), "text")


def _matches(rel: str, pattern: str) -> bool:
    if fnmatch.fnmatch(rel, pattern):
        return True
    # "**/x" also matches "x" at the top level.
    return pattern.startswith("**/") and fnmatch.fnmatch(rel, pattern[3:])


def _list_files(fs, base: str, skip: Optional[str] = None) -> list:
    """Every file under `base`, recursively; a top-level directory named `skip` is not listed
    (the stdlib's own site-packages: 43k of its 51k files here, 1 s of listing)."""
    if skip is None:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return [i for i in infos if i.type == pafs.FileType.File]
    out = []
    for i in fs.get_file_info(pafs.FileSelector(base)):
        if i.type == pafs.FileType.File:
            out.append(i)
        elif i.type == pafs.FileType.Directory and i.base_name != skip:
            out += [j for j in fs.get_file_info(pafs.FileSelector(i.path, recursive=True)) if j.type == pafs.FileType.File]
    return out


def _relative(path: str, root: str) -> str:
    """os.path.relpath for a path under root, without its cost per file."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)


def resolve_files(source: str, glob: str = "**/*", fmt: str = "auto") -> List[SourceFile]:
    """Files of `source` in a deterministic (sorted) order; DataError if none are readable."""
    exclude_site_packages = False
    if source == "stdlib":
        source, glob = stdlib_source()
        exclude_site_packages = True
    fs, base = filesystem_for(source)
    scheme = source.split("://", 1)[0] + "://" if "://" in source else ""
    try:
        info = fs.get_file_info(base)
    except Exception as e:
        raise DataError(f"data.source {source}: cannot stat ({e})") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"data.source {source}: no such file or directory")
    if info.type == pafs.FileType.File:
        infos = [info]
        root = os.path.dirname(base)
    else:
        try:
            infos = _list_files(fs, base, skip="site-packages" if exclude_site_packages else None)
        except Exception as e:
            raise DataError(f"data.source {source}: cannot list directory ({e})") from None
        root = base
        infos = [i for i in infos if _matches(_relative(i.path, root), glob)]
        if exclude_site_packages:
            infos = [i for i in infos if "site-packages" not in i.path.split("/")]
    files = [SourceFile(uri=f"{scheme}{i.path}" if scheme else i.path, path=i.path, size=i.size or 0,
                        format=_infer_format(i.path, fmt)) for i in infos]
    files.sort(key=lambda f: f.path)
    if not files:
        raise DataError(f"data.source {source}: no files match data.glob {glob!r}")
    # Readability check: open each file once (cheap; metadata only for Parquet).
    for f in files:
        check_readable(f)
    return files


def check_readable(f: SourceFile) -> None:
    fs, path = filesystem_for(f.uri)
    try:
        if f.format == "parquet":
            import pyarrow.parquet as pq

            pq.ParquetFile(fs.open_input_file(path))
        else:
            with fs.open_input_stream(path) as s:
                s.read(1)
    except Exception as e:
        raise DataError(f"{f.uri}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
