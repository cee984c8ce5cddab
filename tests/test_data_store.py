"""The shard cache: the same samples at every world size, each shard tokenized once (and no
pipeline at all once every shard is cached), a bounded build window, and a shard cut short
mid-write detected and rebuilt, never read.

Everything runs for real: the store builder is a Ray actor, builds are Ray tasks writing Arrow
IPC files, readers are the worker-side code the trainer uses.
"""

import json
import os
import time

import numpy as np
import pytest
import ray

from elastic.data import Cursor, prepare_data_plan
from elastic.data.reader import RankBatches, SampleStream
from elastic.data.store import PLANS_DIR, ShardCache, packing_key, shard_key
from elastic.records import read_records
from tests.helpers import make_text_corpus, open_store, whole_epoch

B = 6


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    corpus = make_text_corpus(d / "corpus", n_docs=50, seed=3)
    return prepare_data_plan(str(corpus), "**/*.txt", "auto", "text", "", 300, 1.0, 32, 2 / 1024, 11, True,
                             tokenizer_save_path=str(d / "tok.json"), tokenize_cpus=0.5)


def _builds(cache_root, plan):
    return read_records(ShardCache(str(cache_root), plan).builds_log)


def _global_batches(stream, world, steps):
    """Per step: the concatenation of every rank's rows, each rank reading on its own."""
    per_rank = []
    for r in range(world):
        it = RankBatches(stream, Cursor(), B, r, world)
        per_rank.append([it.next() for _ in range(steps)])
        it.close()
    out = []
    for s in range(steps):
        parts = [per_rank[r][s] for r in range(world)]
        assert len({p.cursor for p in parts}) == 1  # every rank advances the same cursor
        out.append({k: np.concatenate([p.rows[k] for p in parts]) for k in ("sample_id", "tokens", "labels")})
    return out


def test_world_sizes_1_2_3_read_the_same_samples_step_for_step(ray_local, plan, tmp_path):
    _, stream = open_store(plan, tmp_path / "cache")
    per_epoch = len(whole_epoch(stream)["sample_id"])
    steps = per_epoch // B + 3  # into the second epoch
    ref = _global_batches(stream, 1, steps)
    for world in (2, 3):
        got = _global_batches(stream, world, steps)
        for s in range(steps):
            assert got[s]["sample_id"].tolist() == ref[s]["sample_id"].tolist(), (world, s)
            assert (got[s]["tokens"] == ref[s]["tokens"]).all() and (got[s]["labels"] == ref[s]["labels"]).all()
    ids = [i for b in ref[: per_epoch // B] for i in b["sample_id"].tolist()]
    assert len(ids) == len(set(ids))  # within an epoch no sample repeats


def test_a_rank_reads_only_its_own_rows(ray_local, plan, tmp_path):
    _, stream = open_store(plan, tmp_path / "cache")
    it = RankBatches(stream, Cursor(), B, 1, 3, prefetch_steps=0)
    for _ in range(5):
        assert len(it.next().rows["sample_id"]) == B // 3
    assert stream.rows_read == 5 * B // 3


def test_a_hold_file_holds_every_batch_until_it_is_gone(ray_local, plan, tmp_path, monkeypatch):
    """ELASTIC_FAULT_DATA_HOLD (the elastic drill's pause while Ray resizes a run): while the file
    exists no batch is produced, with or without prefetch (batches a prefetching reader made
    before the hold still come out); once it is removed, reading goes on where it stopped."""
    import threading

    _, stream = open_store(plan, tmp_path / "cache")
    hold = tmp_path / "hold"
    monkeypatch.setenv("ELASTIC_FAULT_DATA_HOLD", str(hold))
    ref = RankBatches(stream, Cursor(), B, 0, 1, prefetch_steps=0)
    expected = [ref.next().rows["sample_id"].tolist() for _ in range(2)]
    for prefetch in (0, 2):
        it = RankBatches(stream, Cursor(), B, 0, 1, prefetch_steps=prefetch)
        hold.touch()
        got = []
        reader = threading.Thread(target=lambda: got.append(it.next()))
        reader.start()
        reader.join(timeout=1.5)
        held = reader.is_alive() and not got
        hold.unlink()
        reader.join(timeout=30)
        assert held, prefetch
        got.append(it.next())
        assert [b.rows["sample_id"].tolist() for b in got] == expected, prefetch
        it.close()


def test_each_shard_is_built_once_and_reused_by_restarts(ray_local, plan, tmp_path):
    root = tmp_path / "cache"
    builder, stream = open_store(plan, root)
    first = whole_epoch(stream)
    builds = _builds(root, plan)
    assert sorted(b["shard_id"] for b in builds) == sorted(s.shard_id for s in plan.shards)
    assert all(b["cpu_s"] > 0 and b["samples"] >= 0 for b in builds)
    # Two more "restarts" (fresh builders and readers, as after a relaunch or a resize) and a
    # second epoch: nothing is tokenized again, and with every shard in the cache no Ray Data
    # pipeline starts (its actors would compete with the workers' start).
    for _ in range(2):
        builder, stream = open_store(plan, root)
        again = whole_epoch(stream)
        assert again["sample_id"].tolist() == first["sample_id"].tolist()
        report = ray.get(builder.report.remote())
        assert report["stats"]["built"] == 0 and report["stats"]["reused"] == plan.num_shards
        assert report["stats"]["pipelines"] == 0, report
    it = RankBatches(stream, Cursor(epoch=1), B, 0, 1)
    for _ in range(len(first["sample_id"]) // B):
        it.next()
    it.close()
    assert len(_builds(root, plan)) == plan.num_shards


def test_a_killed_builder_restarts_with_its_plans_from_storage(ray_local, plan, tmp_path):
    """The builder's constructor gets the path of its plans, not the plans (elastic/data/builder.py):
    a restart reads them again from the cache root and reuses what is built."""
    from elastic.data.builder import load_plans, save_plans

    root = tmp_path / "cache"
    path = save_plans({"train": plan}, str(root))
    assert os.path.isfile(path) and load_plans(path)["train"] == plan
    assert save_plans({"train": plan}, str(root)) == path  # written once, by content
    builder, _ = open_store(plan, root)
    first = ray.get(builder.meta.remote("train", 0))
    pid = ray.get(builder.__ray_call__.remote(lambda self: os.getpid()))
    ray.kill(builder, no_restart=False)  # as if its process died: Ray restarts it
    deadline = time.time() + 60
    while ray.get(builder.__ray_call__.remote(lambda self: os.getpid()), timeout=30) == pid:  # the kill is asynchronous
        assert time.time() < deadline, "the builder was not restarted"
        time.sleep(0.2)
    again = ray.get(builder.meta.remote("train", 0), timeout=30)
    assert again.to_dict() == first.to_dict()
    report = ray.get(builder.report.remote())
    assert report["stats"]["reused"] == 1 and report["stats"]["built"] == 0, report


def test_a_changed_tokenizer_or_seq_len_gets_its_own_cache(ray_local, plan, tmp_path):
    import dataclasses

    longer = dataclasses.replace(plan, seq_len=48)
    assert packing_key(longer) != packing_key(plan)
    other_tok = dataclasses.replace(plan, tokenizer=dataclasses.replace(plan.tokenizer, json=plan.tokenizer.json + " "))
    assert packing_key(other_tok) != packing_key(plan)
    root = tmp_path / "cache"
    _, s1 = open_store(plan, root)
    a = whole_epoch(s1)
    _, s2 = open_store(longer, root)
    b = whole_epoch(s2)
    assert a["tokens"].shape[1] == 32 and b["tokens"].shape[1] == 48
    assert len(_builds(root, longer)) == longer.num_shards  # built, not reused from the seq 32 cache
    assert sorted(os.listdir(root)) == sorted([packing_key(plan), packing_key(longer), PLANS_DIR])


def test_build_window_is_bounded(ray_local, plan, tmp_path):
    """Tokenization runs at most `build_ahead` shards ahead of the reader, and the first batch
    does not wait for the epoch."""
    root = tmp_path / "cache"
    ahead = 2
    builder, stream = open_store(plan, root, build_ahead=ahead)
    it = RankBatches(stream, Cursor(), B, 0, 1, prefetch_steps=0)
    it.next()
    time.sleep(3)  # let anything that was going to be scheduled run
    pos = it.cursor.shard_pos
    built = len(_builds(root, plan))
    assert built <= pos + 1 + ahead < plan.num_shards, (built, pos)
    while it.cursor.shard_pos < pos + 3:
        it.next()
    time.sleep(3)
    assert len(_builds(root, plan)) <= it.cursor.shard_pos + 1 + ahead
    assert len(_builds(root, plan)) > built  # and it follows the reader


def _reference(plan, root):
    _, stream = open_store(plan, root)
    return whole_epoch(stream)


def test_a_build_killed_mid_write_is_detected_and_rebuilt(ray_local, plan, tmp_path):
    """The first attempt of one shard writes half its file at the final name (as a store
    without atomic writes would) and its process dies; the builder retries, and the stream is
    exactly the one of an undisturbed cache."""
    ref = _reference(plan, tmp_path / "ref")
    victim = plan.shards[int(np.argmax([s.size for s in plan.shards]))].shard_id
    root = tmp_path / "cache"
    builder, stream = open_store(plan, root, task_env={"ELASTIC_FAULT_CACHE_CUT": f"shard={victim}"})
    got = whole_epoch(stream)
    assert got["sample_id"].tolist() == ref["sample_id"].tolist()
    assert (got["tokens"] == ref["tokens"]).all()
    report = ray.get(builder.report.remote())
    failed = [e for e in report["events"] if e["event"] == "build_failed"]
    assert [e["shard_id"] for e in failed] == [victim] and report["stats"]["failed_attempts"] == 1
    mine = [b for b in _builds(root, plan) if b["shard_id"] == victim]
    assert [b["attempt"] for b in mine] == [1]  # one committed build: the retry


def test_a_cut_short_cache_file_is_never_read_and_is_rebuilt(ray_local, plan, tmp_path):
    """A committed shard whose data file is then cut short (lost bytes, a partial copy) fails
    the commit check on the next start: the builder rebuilds it; readers see the right rows."""
    root = tmp_path / "cache"
    ref = _reference(plan, root)
    cache = ShardCache(str(root), plan)
    order = [plan.shards[i] for i in range(plan.num_shards)]
    victim = max(order, key=lambda s: s.size)
    path = cache.data_path(shard_key(victim))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    meta, why = cache.load(victim)
    assert meta is None and "bytes" in why
    builder, stream = open_store(plan, root)
    got = whole_epoch(stream)
    assert got["sample_id"].tolist() == ref["sample_id"].tolist() and (got["tokens"] == ref["tokens"]).all()
    report = ray.get(builder.report.remote())
    assert report["stats"]["rebuilt"] == 1 and report["stats"]["built"] == 1
    assert [e["shard_id"] for e in report["events"] if e["event"] == "rebuild"] == [victim.shard_id]
    assert os.path.getsize(path) == size


def test_a_file_cut_under_a_running_reader_is_rebuilt_before_it_is_read(ray_local, plan, tmp_path):
    """The reader already holds the shard's commit record (memoised) when the file is cut: the
    read fails on the footer, the builder checks, discards and rebuilds it, the read is retried."""
    root = tmp_path / "cache"
    ref = _reference(plan, root)
    builder, stream = open_store(plan, root)
    for i in range(plan.num_shards):
        stream.meta(i)  # memoise every record, open no file
    victim = plan.shards[stream.shard_index(0, 1)]
    path = ShardCache(str(root), plan).data_path(shard_key(victim))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    got = whole_epoch(stream)
    assert got["sample_id"].tolist() == ref["sample_id"].tolist() and (got["tokens"] == ref["tokens"]).all()
    report = ray.get(builder.report.remote())
    assert [e["shard_id"] for e in report["events"] if e["event"] == "read_failed"] == [victim.shard_id]
    assert report["stats"]["rebuilt"] == 1


def test_commit_record_matches_the_cached_rows(ray_local, plan, tmp_path):
    root = tmp_path / "cache"
    _, stream = open_store(plan, root)
    whole_epoch(stream)
    cache = ShardCache(str(root), plan)
    for shard in plan.shards:
        meta, why = cache.load(shard)
        assert meta is not None, why
        with open(cache.meta_path(shard_key(shard))) as f:
            assert json.load(f)["samples"] == meta.samples
        rows = cache.reader(meta).rows(np.arange(meta.samples))
        assert int(rows["n_real"].sum()) == meta.tokens


def test_sample_stream_needs_no_earlier_shard(ray_local, plan, tmp_path):
    """The stream's walk from a cursor asks only for shards at or after it."""
    root = tmp_path / "cache"
    _, full = open_store(plan, root)
    it = RankBatches(full, Cursor(), B, 0, 1, prefetch_steps=0)
    while it.cursor.shard_pos < 3:
        it.next()
    cur = it.cursor
    builder, _ = open_store(plan, root)
    stream = SampleStream(plan, "train", builder, str(root))
    resumed = RankBatches(stream, cur, B, 0, 1, prefetch_steps=0)
    resumed.next()
    before = {stream.shard_index(cur.epoch, p) for p in range(cur.shard_pos)}
    assert not before & set(stream.metas), (before, set(stream.metas))
