"""Malformed rows are counted and skipped; missing or unreadable input is a one-line error
before any worker starts."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elastic.data import Cursor, DataError, prepare_data_plan
from elastic.data.documents import BadRows, read_shard
from elastic.data.reader import RankBatches
from elastic.data.shards import plan_shards
from elastic.data.sources import resolve_files
from tests.conftest import REPO

GOOD = "def f(x):\n    return x + 1\n" * 20


def _mixed_corpus(d):
    d.mkdir()
    lines = [json.dumps({"text": GOOD}), "{not json", json.dumps({"body": GOOD}), json.dumps({"text": 42}),
             json.dumps({"text": "   "}), "", json.dumps({"text": GOOD + "ok"})]
    raw = "\n".join(lines).encode() + b'\n{"text": "bad \xff utf8"}\n'
    (d / "a.jsonl").write_bytes(raw)
    pq.write_table(pa.table({"text": [GOOD, None, "", GOOD * 2]}), d / "b.parquet")
    (d / "c.txt").write_bytes(b"caf\xe9 latin-1 text")
    (d / "d.txt").write_text("")
    (d / "e.txt").write_text(GOOD)
    return d


def test_each_malformed_kind_is_counted_and_skipped(tmp_path):
    d = _mixed_corpus(tmp_path / "c")
    files = resolve_files(str(d))
    docs, bad = [], None
    from elastic.data.documents import BadRows

    bad = BadRows(keep=20)
    for s in plan_shards(files, 1 << 20):
        got, b = read_shard(s, "text", keep_examples=20)
        docs += got
        bad.merge(b)
    assert bad.counts == {"bad_json": 1, "missing_field": 3, "empty_text": 3, "invalid_utf8": 2}, bad.counts
    assert len(docs) == 5  # 2 JSONL + 2 Parquet + 1 text file
    assert any("a.jsonl:2" in e for e in bad.examples)  # file and line are named
    assert any("b.parquet:row1" in e for e in bad.examples)


def test_bad_rows_travel_through_the_pipeline(ray_local, tmp_path):
    from tests.helpers import open_store

    d = _mixed_corpus(tmp_path / "c")
    plan = prepare_data_plan(str(d), "**/*", "auto", "text", "", 300, 1.0, 16, 1.0, 0, False,
                             tokenizer_save_path=str(tmp_path / "tok.json"))
    _, stream = open_store(plan, tmp_path / "cache")
    for rank in (0, 1):  # every rank counts the whole global batch's bad rows, whatever rows it reads
        it = RankBatches(stream, Cursor(), 2, rank, 2)
        bad = BadRows()
        for _ in range(3):
            bad.merge(it.next().bad_rows)
        it.close()
        assert bad.total == 9
        assert bad.counts["missing_field"] == 3


def test_missing_and_unreadable_paths_are_one_line_errors(tmp_path):
    with pytest.raises(DataError) as e:
        resolve_files(str(tmp_path / "nope"))
    assert "no such file" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "x.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(DataError) as e:
        resolve_files(str(tmp_path))
    assert "x.parquet" in str(e.value) and "unreadable" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="no files match"):
        resolve_files(str(tmp_path), glob="*.jsonl")


def test_job_with_missing_source_fails_before_ray_starts(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "pretrain.py"), "--set", f"data.source={tmp_path}/missing",
                        "--set", f"run.storage_path={tmp_path}/runs"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.startswith("data error:")]
    assert err and "missing: no such file or directory" in err[0], r.stderr
    assert "Started a local Ray instance" not in r.stdout + r.stderr
