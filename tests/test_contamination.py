"""Contamination check (elastic/eval/contamination.py) on hand-computed cases.

The cache is written by the project's own writer (ShardCache.commit over pack_documents'
arrays, plans by save_plans) with a word-level tokenizer, so token ids are known by hand:
"w<k>" is id k + 2 (0 is EOS, 1 is PAD).
"""

import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from elastic.data.packing import pack_documents
from elastic.data.pipeline import DataPlan
from elastic.data.shards import Piece, Shard
from elastic.data.store import ShardCache
from elastic.data.tokenizer import EOS, PAD, TokenizerInfo
from elastic.eval.contamination import (BASE, cache_ngrams, contamination, item_text, ngram_hashes,
                                        normalize_words, text_ngrams_overlap)
from elastic.eval.spec import Doc, TaskSpec

SEQ = 16
M = 2**64


def ref_hash(gram):
    h = 0
    for t in gram:
        h = (h * int(BASE) + int(t)) % M
    return h


def ref_set(docs, n):
    return {ref_hash(d[i:i + n]) for d in docs for i in range(len(d) - n + 1)}


def w(*ks):
    return " ".join(f"w{k}" for k in ks)


def ids(*ks):
    return [k + 2 for k in ks]


# Training shard: A (20 tokens, crosses the row cut at 16), B (5 tokens, too short for a 13-gram),
# C (18 tokens). Held-out shard: E (20 tokens).
A, B, C, E = ids(*range(0, 20)), ids(*range(50, 55)), ids(*range(60, 78)), ids(*range(80, 100))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from elastic.data.builder import save_plans

    d = tmp_path_factory.mktemp("run")
    vocab = {EOS: 0, PAD: 1, **{f"w{k}": k + 2 for k in range(100)}, "[UNK]": 102}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    info = TokenizerInfo(json=tok.to_str(), vocab_size=len(vocab), eos_id=0, pad_id=1, bytes_per_token=1.0)
    train_shard = Shard(0, (Piece("/corpus/train.txt", "text", 0, -1, 100),))
    held_shard = Shard(1, (Piece("/corpus/held.txt", "text", 0, -1, 100),))
    train = DataPlan(shards=[train_shard], tokenizer=info, seq_len=SEQ, text_field="text", seed=0, shuffle=False)
    held = DataPlan(shards=[held_shard], tokenizer=info, seq_len=SEQ, text_field="text", seed=0, shuffle=False)
    cache = ShardCache(str(d / "cache"), train)
    packed = pack_documents([A, B, C], SEQ, eos_id=0, pad_id=1)
    # The packing this test relies on: A continues into row 1, the last row is padded.
    assert packed["doc_ids"][0].tolist() == [0] * 16 and (packed["doc_ids"][-1] == -1).any()
    cache.commit(train_shard, packed, {}, {})
    cache.commit(held_shard, pack_documents([E], SEQ, eos_id=0, pad_id=1), {}, {})
    save_plans({"train": train, "eval": held}, str(d / "cache"))
    return str(d)


def test_hash_matches_a_pure_python_reference():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**31 - 1, size=200).astype(np.int32)
    for n in (1, 2, 13):
        got = ngram_hashes(x, n)
        assert got.dtype == np.uint64 and len(got) == len(x) - n + 1
        assert got.tolist() == [ref_hash(x[i:i + n]) for i in range(len(x) - n + 1)]
    assert ngram_hashes(np.arange(5), 1).tolist() == [0, 1, 2, 3, 4]
    assert ngram_hashes(np.arange(2), 2).tolist() == [(0 * int(BASE) + 1) % M]
    assert len(ngram_hashes(np.arange(12), 13)) == 0 and len(ngram_hashes(np.arange(13), 13)) == 1
    assert len(ngram_hashes(np.zeros(0, np.int64))) == 0


@pytest.mark.parametrize("n", [3, 13])
def test_cache_ngrams_stay_inside_documents_of_the_training_split(run_dir, n):
    """Exactly the windows inside A, B, C (A's across the row cut included); none through an
    EOS, into padding, or from the held-out shard."""
    h, info = cache_ngrams(run_dir, n=n)
    assert h.tolist() == sorted(ref_set([A, B, C], n))
    assert info["shards_scanned"] == 1 and info["shards_skipped_other_split"] == 1
    assert info["split_source"] == "plans" and info["tokens_scanned"] == 43
    assert info["distinct_ngrams"] == len(h) and info["seconds"] >= 0
    across_cut = ref_hash(A[4:4 + n])  # A[4..16]: row 0's last tokens and row 1's first
    assert across_cut in set(h.tolist())
    crossing = ref_hash((A + B)[20 - n + 1: 20 + 1])  # A's tail then B's head (EOS skipped)
    assert crossing not in set(h.tolist())
    he, _ = cache_ngrams(run_dir, n=n, splits="eval")
    assert he.tolist() == sorted(ref_set([E], n))
    ha, _ = cache_ngrams(run_dir, n=n, splits="all")
    assert ha.tolist() == sorted(ref_set([A, B, C, E], n))


def test_without_plans_every_shard_is_scanned_and_info_says_so(run_dir, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    shutil.rmtree(d / "cache" / "plans")
    h, info = cache_ngrams(str(d), n=13)
    assert h.tolist() == sorted(ref_set([A, B, C, E], 13))
    assert info["split_source"].startswith("no plans") and info["notes"]


def test_contamination_per_task(run_dir):
    docs = {
        "dirty": [Doc(id="verbatim", text=w(*range(2, 18))),                    # inside A, across its row cut
                  Doc(id="partial", text=w(*range(0, 13), *range(90, 96))),     # 7 13-grams, the first in A
                  Doc(id="short", text=w(60, 61, 62))],                         # < 13 tokens
        "clean": [Doc(id="heldout", text=w(*range(80, 100))),                   # only in the held-out shard
                  Doc(id="shuffled", text=w(*range(19, -1, -1)))],
    }
    types = {"dirty": "perplexity", "clean": TaskSpec(task="clean", type="perplexity", data="x")}
    info = {}
    got = contamination(docs, types, run_dir, scan_info=info)
    assert got["dirty"] == {"items": 3, "items_with_ngrams": 2, "contaminated": 2, "contaminated_fraction": 1.0,
                            "mean_overlap": pytest.approx((1.0 + 1 / 7) / 2), "contaminated_ids": ["verbatim", "partial"]}
    assert got["clean"] == {"items": 2, "items_with_ngrams": 2, "contaminated": 0, "contaminated_fraction": 0.0,
                            "mean_overlap": 0.0, "contaminated_ids": []}
    assert info["shards_scanned"] == 1 and info["tokens_scanned"] == 43
    # The same from a precomputed cache set, and the held-out item is found in the eval split.
    h, _ = cache_ngrams(run_dir)
    assert contamination(docs, types, run_dir, cache_hashes=h) == got
    ev = contamination({"clean": docs["clean"]}, types, run_dir, splits="eval")["clean"]
    assert ev["contaminated_ids"] == ["heldout"]


def test_item_text_per_type():
    mc = Doc(id="1", context="Q: 2+2?", choices=["3", "4"], gold=1)
    assert item_text(mc, "multiple_choice") == "Q: 2+2? 4"
    assert item_text(mc, "multiple_choice", target_delimiter="\n") == "Q: 2+2?\n4"
    assert item_text(Doc(id="2", context="Q", target="A"), "generation") == "Q A"
    assert item_text(Doc(id="3", context="def f():\n", test="assert f()"), "code") == "def f():\n"
    assert item_text(Doc(id="4", text="whole text"), "perplexity") == "whole text"
    with pytest.raises(ValueError):
        item_text(mc, "nonsense")


def test_word_level_overlap_hand_cases():
    assert normalize_words("Don't STOP, me-now!\n ok") == ["dont", "stop", "menow", "ok"]
    items = ["The quick brown fox jumps", "Nothing here at all", "short", "Don't stop me now"]
    corpus = ["the QUICK, brown fox! jumps over", "dont stop", "me now"]  # n-grams never span two texts
    got = text_ngrams_overlap(items, iter(corpus), n=3)
    assert got["overlap"] == [1.0, 0.0, None, 0.0]
    assert got["items"] == 4 and got["items_with_ngrams"] == 3 and got["contaminated"] == 1
    assert got["contaminated_ids"] == [0] and got["contaminated_fraction"] == pytest.approx(1 / 3)
    got = text_ngrams_overlap(["a b c d e"], ["x A b c D y"], n=3)  # "a b c", "b c d" found, "c d e" not
    assert got["overlap"] == [pytest.approx(2 / 3)] and got["mean_overlap"] == pytest.approx(2 / 3)
    words = " ".join(f"word{i}" for i in range(13))
    assert text_ngrams_overlap([words], [f"Prefix. {words.upper()}!"])["contaminated"] == 1
    assert text_ngrams_overlap([words], [words.rsplit(" ", 1)[0]])["contaminated"] == 0


def test_windows_across_record_batches_and_chunks_are_kept(run_dir, tmp_path, monkeypatch):
    """A document longer than one record batch (341 rows of 16), read one batch per chunk: the
    windows across the chunk cut are produced once, like the rest."""
    import elastic.eval.contamination as contam

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(f"{run_dir}/tokenizer.json", d / "tokenizer.json")
    info = TokenizerInfo(json=Tokenizer.from_file(str(d / "tokenizer.json")).to_str(), vocab_size=103, eos_id=0,
                         pad_id=1, bytes_per_token=1.0)
    shard = Shard(0, (Piece("/corpus/long.txt", "text", 0, -1, 100),))
    plan = DataPlan(shards=[shard], tokenizer=info, seq_len=SEQ, text_field="text", seed=0, shuffle=False)
    doc = np.random.default_rng(1).integers(2, 102, size=341 * SEQ + 100).tolist()
    short = ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
    meta = ShardCache(str(d / "cache"), plan).commit(shard, pack_documents([doc, short], SEQ, 0, 1), {}, {})
    assert meta.batches == 2
    monkeypatch.setattr(contam, "CHUNK_TOKENS", 1)
    h, info = cache_ngrams(str(d), n=13, splits="all")
    assert h.tolist() == sorted(ref_set([doc, short], 13))
    assert info["ngrams_scanned"] == len(doc) - 12 + len(short) - 12
