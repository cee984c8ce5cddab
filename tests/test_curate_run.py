"""jobs/curate.py end to end on a real local Ray cluster, on planted data: every planted document
is removed for its reason and nothing else is; the output is the same whatever the workers and
blocks; a crashed run resumes without redoing finished blocks; pretraining plans on the output."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from elastic.config.schema import CurateSection
from elastic.data.curate.dedup import jaccard
from tests.curate_helpers import FRENCH, GERMAN, near_copy, prose


def planted(root):
    """Four JSONL files; the planted documents come after the originals they copy."""
    good = {f"g{i:02d}": prose(i) for i in range(24)}
    long_a = prose(100, sentences=40)
    long_b = prose(101, sentences=40)
    near_hi = near_copy(long_a, 90, seed=1)
    near_lo = near_copy(long_b, 4, seed=2)
    assert jaccard(long_a, near_hi) > 0.85 and jaccard(long_b, near_lo) < 0.4
    line = "The quiet river of the town carried a boat with the farmer and the teacher."
    removed = {
        "exact1": (good["g03"], "exact_dup"),
        "exact2": (good["g05"].replace("The ", "the  "), "exact_dup"),  # same after normalisation
        "near_hi": (near_hi, "near_dup"),
        "german": (GERMAN + " " + GERMAN, "lang:de"),
        "french": (FRENCH + " " + FRENCH, "lang:fr"),
        "lorem": (prose(200) + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", "c4:lorem_ipsum"),
        "curly": (prose(201) + "\nThe value of the setting is {x} in the file of the project.", "c4:curly_bracket"),
        "short": (prose(202, sentences=2), "gopher:min_doc_words"),
        "repeat": ("\n".join([line] * 12), "gopher_rep:dup_line_frac"),
        "toxic": (prose(203) + " What the fuck is this.", "toxic"),
    }
    kept_extra = {
        "long_a": long_a, "long_b": long_b, "near_lo": near_lo,
        "pii": prose(204) + "\nWrite to john.doe@gmail.com or call 415-555-2671 from 8.8.8.8 today.",
    }
    first = list(good.items()) + [("long_a", long_a), ("long_b", long_b)]
    later = [(k, v[0]) for k, v in removed.items()] + [("near_lo", near_lo), ("pii", kept_extra["pii"])]
    rows = first + later
    files = [rows[:13], rows[13:26], rows[26:32], rows[32:]]
    os.makedirs(root, exist_ok=True)
    for n, chunk in enumerate(files):
        with open(os.path.join(root, f"part{n}.jsonl"), "w") as f:
            for k, v in chunk:
                f.write(json.dumps({"id": k, "text": v}) + "\n")
            if n == 1:
                f.write("{not json\n")
    kept = set(good) | set(kept_extra)
    return kept, {k: v[1] for k, v in removed.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("curate-in")
    kept, removed = planted(str(root))
    return str(root), kept, removed


# 21 kB blocks: the planted files (16, 21, 9 and 9 kB) make 3 blocks, none split.
BLOCK_MB = 0.021


def _cs(src, out, **kw):
    return dataclasses.replace(CurateSection(), source=src, output=str(out), glob="*.jsonl", **kw)


def _removed_reasons(out):
    import pyarrow.parquet as pq

    d = os.path.join(out, "removed")
    rows = []
    for p in sorted(os.listdir(d)):
        rows += pq.read_table(os.path.join(d, p), columns=["id", "reason", "dup_of"]).to_pylist()
    return rows


@pytest.fixture(scope="module")
def first_run(ray_local, corpus, tmp_path_factory):
    from elastic.launch.curate import run_curation

    src, _, _ = corpus
    out = tmp_path_factory.mktemp("curate-a")
    return run_curation(_cs(src, out, workers=1, block_mb=BLOCK_MB), say=lambda s: None)


def test_each_planted_doc_removed_for_its_reason(first_run, corpus):
    from elastic.launch.curate import read_curated

    _, kept, removed = corpus
    rows = _removed_reasons(first_run.output)
    assert {r["id"]: r["reason"] for r in rows} == removed
    dup_of = {r["id"]: r["dup_of"] for r in rows if r["dup_of"]}
    assert dup_of == {"exact1": "g03", "exact2": "g05", "near_hi": "long_a"}  # the earlier copy survives
    out = read_curated(first_run.data_dir).to_pylist()
    assert {r["id"] for r in out} == kept
    pii = next(r["text"] for r in out if r["id"] == "pii")
    assert "john.doe@gmail.com" not in pii and "email@example.com" in pii and "8.8.8.8" not in pii
    rep = json.loads(open(first_run.report_path).read())
    assert rep["docs_in"] == len(kept) + len(removed) and rep["docs_out"] == len(kept)
    assert rep["pii_redactions"]["email"] == 1 and rep["pii_redactions"]["phone"] == 1 and rep["pii_redactions"]["ip"] == 1
    assert rep["bad_rows"]["counts"] == {"bad_json": 1} and "part1.jsonl:14" in rep["bad_rows"]["examples"][0]
    assert rep["funnel"][0]["docs"] == rep["docs_in"] and rep["funnel"][-1]["docs"] == rep["docs_out"]
    assert set(rep["examples"]) == set(removed.values())
    assert rep["bytes_out"] < rep["bytes_in"] and rep["docs_per_s"] > 0
    assert os.path.getsize(first_run.funnel_path) > 1000
    assert first_run.report["blocks"] == 3 and sorted(os.listdir(first_run.data_dir)) == [
        f"part-{i:05d}.parquet" for i in range(3)]


def test_same_output_with_other_workers_and_blocks(first_run, corpus, tmp_path):
    from elastic.launch.curate import read_curated, run_curation

    src, _, _ = corpus
    res = run_curation(_cs(src, tmp_path / "b", workers=2, block_mb=100), say=lambda s: None)
    assert res.report["blocks"] == 1 and first_run.report["blocks"] == 3
    a, b = read_curated(first_run.data_dir), read_curated(res.data_dir)
    assert a.equals(b)  # same documents, same text, same order
    assert _removed_reasons(first_run.output) == _removed_reasons(res.output)
    # the same blocks at another worker count: the very same bytes
    res2 = run_curation(_cs(src, tmp_path / "c", workers=2, block_mb=BLOCK_MB), say=lambda s: None)
    for p in sorted(os.listdir(first_run.data_dir)):
        assert open(os.path.join(first_run.data_dir, p), "rb").read() == open(os.path.join(res2.data_dir, p), "rb").read()


def test_one_large_file_is_split_into_blocks_with_the_same_output(first_run, corpus, tmp_path):
    from elastic.launch.curate import read_curated, run_curation

    src, _, _ = corpus
    one = tmp_path / "one"
    one.mkdir()
    with open(one / "all.jsonl", "wb") as out:
        for n in range(4):
            out.write(open(os.path.join(src, f"part{n}.jsonl"), "rb").read())
    res = run_curation(_cs(str(one), tmp_path / "o", workers=2, block_mb=0.01), say=lambda s: None)
    assert res.report["files"] == 1 and res.report["blocks"] > 4
    assert read_curated(res.data_dir).equals(read_curated(first_run.data_dir))
    assert _removed_reasons(res.output) == _removed_reasons(first_run.output)
    assert "all.jsonl:27" in res.report["bad_rows"]["examples"][0]  # the line in the whole file


def test_crash_and_resume_redoes_no_finished_block(first_run, corpus, tmp_path):
    from elastic.launch.curate import Layout, read_curated, run_curation

    src, _, _ = corpus
    cs = _cs(src, tmp_path / "r", workers=2, block_mb=BLOCK_MB)
    with pytest.raises(InterruptedError):
        run_curation(cs, say=lambda s: None, stop_after_blocks=2)
    lay = Layout(cs.output)
    done = sorted(os.listdir(lay.blocks))
    assert done == ["block-00000.json", "block-00000.parquet", "block-00001.json", "block-00001.parquet"]
    stamps = {p: os.stat(os.path.join(lay.blocks, p)).st_mtime_ns for p in done}
    said = []
    res = run_curation(cs, say=said.append)
    assert res.report["resumed"] == {"blocks_done_before": 2, "blocks_run": 1}
    assert "resuming: 2 blocks already done" in said[0]
    assert {p: os.stat(os.path.join(lay.blocks, p)).st_mtime_ns for p in done} == stamps
    assert read_curated(res.data_dir).equals(read_curated(first_run.data_dir))
    # a finished curation rerun does nothing again; another config on the same output is refused
    again = run_curation(cs, say=lambda s: None)
    assert again.report["resumed"] == {"blocks_done_before": 3, "blocks_run": 0}
    from elastic.config import ConfigError

    with pytest.raises(ConfigError, match="curate.output"):
        run_curation(dataclasses.replace(cs, lang_min_score=0.5), say=lambda s: None)


def test_output_is_a_pretraining_source(first_run, tmp_path):
    from elastic.config import load_config
    from elastic.data.documents import read_shard
    from elastic.launch.data_plans import plan_job_data

    cfg = load_config(None, [f"data.source={first_run.data_dir}", "data.format=parquet", "data.text_field=text",
                             "data.vocab_size=300", "data.seq_len=32", "data.shard_mb=0.01", "eval.every_steps=0"])
    plan = plan_job_data(cfg, str(tmp_path), "pretrain").train
    docs = [d for s in plan.shards for d in read_shard(s, "text")[0]]
    assert len(docs) == first_run.report["docs_out"] and plan.num_shards >= 1


def test_bad_config_and_input_are_one_line_before_work(tmp_path, capsys):
    from jobs.curate import main

    assert main(["--set", "curate.stages=[unicode,nope]"]) == 2
    assert main(["--set", f"curate.source={tmp_path}/missing", "--set", f"curate.output={tmp_path}/o"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("config error: curate.stages") and err[1].startswith("data error:")
    assert not os.path.exists(tmp_path / "o")
