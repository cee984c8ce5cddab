"""Packing loses and duplicates no token, also through the real store (builder tasks on Ray,
the shard cache, the reader)."""

import os
from collections import Counter

import numpy as np
import pytest

from elastic.data import Cursor, prepare_data_plan
from elastic.data.packing import labels_for, pack_documents, unpack_tokens
from elastic.data.reader import RankBatches
from elastic.data.tokenizer import from_json
from tests.helpers import open_store, whole_epoch


def test_pack_roundtrip_across_sample_boundaries():
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 500, size=n).tolist() for n in [1, 7, 64, 3, 130, 0, 31]]
    out = pack_documents(docs, seq_len=16, eos_id=0, pad_id=1)
    flat = [t for d in docs for t in d + [0]]
    assert unpack_tokens(out["tokens"], out["doc_ids"]) == flat  # order too, not only multiset
    assert out["tokens"].shape[1] == 16 and int(out["n_real"].sum()) == len(flat)
    assert out["positions"].max() < 16
    labels = out["labels"]  # packing emits the targets
    assert (labels == labels_for(out["tokens"], out["doc_ids"])).all()
    # No target crosses a document boundary or points into padding; the last column has none.
    same_doc = (out["doc_ids"][:, 1:] == out["doc_ids"][:, :-1]) & (out["doc_ids"][:, 1:] >= 0)
    assert ((labels[:, :-1] != -100) == same_doc).all() and (labels[:, -1] == -100).all()
    # Where there is a target it is the next token.
    has = labels[:, :-1] != -100
    assert (labels[:, :-1][has] == out["tokens"][:, 1:][has]).all()


def test_pack_target_masks_learn_only_marked_tokens():
    """SFT: only tokens flagged in the target mask (and the EOS after a learned last token) are
    targets; a prompt token is never a target, even at a document start."""
    prompt, completion = [5, 6, 7], [8, 9]
    docs = [prompt + completion, [3, 4]]
    masks = [[False] * 3 + [True] * 2, [False, False]]
    out = pack_documents(docs, seq_len=16, eos_id=0, pad_id=1, target_masks=masks)
    row_tokens, row_labels = out["tokens"][0].tolist(), out["labels"][0].tolist()
    assert row_tokens[:10] == [5, 6, 7, 8, 9, 0, 3, 4, 0, 1]
    # Targets: position i predicts token i+1. Learned tokens: 8, 9 and the EOS after 9.
    assert row_labels[:9] == [-100, -100, 8, 9, 0, -100, -100, -100, -100]
    assert sum(lab != -100 for lab in row_labels) == 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "gamma", "delta", "elastic", "ray", "torch", "shard", "\n", "def", "(", ")"]
    for i in range(40):
        n = int(rng.integers(5, 400))
        (d / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(words, size=n)))
    return d


def test_pipeline_token_multiset_equals_input_plus_eos(ray_local, corpus, tmp_path):
    # Tiny shards (2 KiB) so documents are packed across many shards and sample boundaries.
    plan = prepare_data_plan(str(corpus), "**/*.txt", "auto", "text", "", 300, 1.0, 32, 2 / 1024, 0, True,
                             tokenizer_save_path=str(tmp_path / "tok.json"))
    assert plan.num_shards > 5
    tok = from_json(plan.tokenizer.json)
    expected = Counter()
    for f in sorted(corpus.iterdir()):
        expected.update(tok.encode(f.read_text()).ids + [plan.tokenizer.eos_id])
    _, stream = open_store(plan, tmp_path / "cache")
    rows = whole_epoch(stream)
    got = Counter(rows["tokens"][rows["doc_ids"] >= 0].tolist())
    ids = rows["sample_id"].tolist()
    assert got == expected
    assert len(ids) == len(set(ids))  # global sample ids are unique


def test_resume_from_cursor_continues_exactly(ray_local, corpus, tmp_path):
    """Seeking to a cursor yields exactly the rest of the uninterrupted stream (into epoch 2)."""
    plan = prepare_data_plan(str(corpus), "**/*.txt", "auto", "text", "", 300, 1.0, 32, 2 / 1024, 7, True,
                             tokenizer_save_path=str(tmp_path / "tok.json"))
    _, stream = open_store(plan, tmp_path / "cache")
    per_epoch = len(whole_epoch(stream)["sample_id"])
    steps = per_epoch // 4 + 8  # crosses into the second epoch
    full = RankBatches(stream, Cursor(), 4, 0, 1, prefetch_steps=0)
    ref = [full.next().rows["sample_id"].tolist() for _ in range(steps)]
    assert full.cursor.epoch == 1
    part = RankBatches(stream, Cursor(), 4, 0, 1)
    for _ in range(5):
        part.next()
    resumed = RankBatches(stream, part.cursor, 4, 0, 1)
    assert [resumed.next().rows["sample_id"].tolist() for _ in range(steps - 5)] == ref[5:]
    assert resumed.cursor == full.cursor
    part.close()
    resumed.close()


def test_seek_never_reads_shards_before_the_cursor(ray_local, tmp_path):
    """Resuming costs the same however far the run got: the source files *and* the cache files
    of every shard before the cursor are deleted, a fresh builder (a restarted run) serves the
    resumed stream, and it is still exactly the rest; no earlier shard's file is opened."""
    import shutil

    from elastic.data.store import ShardCache, shard_key

    src = tmp_path / "corpus"
    shutil.copytree(make_corpus_dir(tmp_path / "orig"), src)
    plan = prepare_data_plan(str(src), "**/*.txt", "auto", "text", "", 300, 1.0, 64, 2 / 1024, 3, False,
                             tokenizer_save_path=str(tmp_path / "tok.json"))
    cache_root = tmp_path / "cache"
    _, stream = open_store(plan, cache_root)
    full = RankBatches(stream, Cursor(), 4, 0, 1, prefetch_steps=0)
    batches = [full.next().rows["sample_id"].tolist() for _ in range(12)]
    _, stream = open_store(plan, cache_root)
    head = RankBatches(stream, Cursor(), 4, 0, 1, prefetch_steps=0)
    for _ in range(8):
        head.next()
    cur = head.cursor
    assert cur.shard_pos >= 2, cur  # the test needs whole shards behind the cursor
    cache = ShardCache(str(cache_root), plan)
    for shard in plan.shards[: cur.shard_pos]:  # shuffle=False: epoch order is shard id order
        for piece in shard.pieces:
            os.remove(piece.uri)
        os.remove(cache.data_path(shard_key(shard)))
        os.remove(cache.meta_path(shard_key(shard)))
    _, stream = open_store(plan, cache_root)  # a new builder: nothing memoised
    resumed = RankBatches(stream, cur, 4, 0, 1, prefetch_steps=0)
    assert [resumed.next().rows["sample_id"].tolist() for _ in range(4)] == batches[8:]
    assert min(stream.files_opened) >= cur.shard_pos, stream.files_opened


def make_corpus_dir(d):
    from tests.helpers import make_text_corpus

    return make_text_corpus(d, n_docs=40, seed=1)
