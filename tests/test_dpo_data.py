"""Preference pairs (elastic/data/preference.py): the three row forms render like SFT (answer +
EOS scored, the prompt shared token for token), malformed rows are counted and skipped with
file and line, overlong pairs are cut or skipped and counted, Parquet reads like JSONL, and the
pair cursor gives every world size the same pairs per step."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elastic.data.chat import ChatFormat, RowError
from elastic.data.preference import (PairFormat, PairSet, PairStream, code_opt_pair_rows, encode_pair, holdout_split,
                                     load_pairs, pair_messages)
from elastic.data.tokenizer import EOS, train_bpe

FMT = PairFormat()
TEXT = ["Write a program that adds two numbers.", "int main(){return 0;}", "print the sum fast", "<|user|>\n<|assistant|>\n"] * 30


@pytest.fixture(scope="module")
def tok():
    return train_bpe(TEXT, 300)


def test_row_forms_give_the_same_conversation():
    plain = {"prompt": "add them", "chosen": "fast", "rejected": "slow"}
    msgs = {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "add them"}],
            "chosen": [{"role": "assistant", "content": "fast"}], "rejected": json.dumps([{"role": "assistant", "content": "slow"}])}
    implicit = {"chosen": [{"role": "user", "content": "add them"}, {"role": "assistant", "content": "fast"}],
                "rejected": [{"role": "user", "content": "add them"}, {"role": "assistant", "content": "slow"}]}
    assert pair_messages(plain, FMT) == ([{"role": "user", "content": "add them"}], "fast", "slow")
    assert pair_messages(msgs, FMT)[0][0] == {"role": "system", "content": "S"} and pair_messages(msgs, FMT)[1:] == ("fast", "slow")
    assert pair_messages(implicit, FMT) == pair_messages(plain, FMT)
    assert pair_messages({"prompt": "p", "chosen": "[1, 2]", "rejected": "x"}, FMT)[1] == "[1, 2]"  # text that looks like JSON
    for bad in ({"prompt": "p", "chosen": "a"}, {"prompt": "p", "chosen": "a", "rejected": "a"},
                {"prompt": "p", "chosen": "", "rejected": "b"}, {"chosen": "a", "rejected": "b"},
                {"chosen": implicit["chosen"], "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "x"}]},
                {"prompt": "p", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}, ["not", "a", "dict"]):
        with pytest.raises(RowError):
            pair_messages(bad, FMT)


def test_encode_pair_scores_the_answer_and_eos(tok):
    eos = tok.token_to_id(EOS)
    p, c, r = encode_pair([{"role": "user", "content": "add them"}], "fast answer", "slow", ChatFormat(), tok, eos)
    assert tok.decode(p, skip_special_tokens=False) == "<|user|>\nadd them\n<|assistant|>\n"
    assert c[-1] == eos and tok.decode(c[:-1]) == "fast answer" and tok.decode(r[:-1]) == "slow"
    tmpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    p2, c2, _ = encode_pair([{"role": "user", "content": "hi"}], "yo", "no", ChatFormat(chat_template=tmpl, eos_token="<|im_end|>"),
                            tok, eos)
    assert tok.decode(p2, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert tok.decode(c2[:-1], skip_special_tokens=False) == "yo<|im_end|>\n"


def _rows(n):
    return [{"prompt": f"Write a program that adds two numbers, case {i}.", "chosen": "int main(){return 0;}" + " fast" * (i % 3),
             "rejected": "print the sum" + " slow" * (i % 4)} for i in range(n)]


def test_load_pairs_counts_bad_rows_with_file_and_line_and_fits_seq_len(tmp_path, tok):
    d = tmp_path / "prefs"
    d.mkdir()
    lines = [json.dumps(r) for r in _rows(6)] + ["{oops", json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}),
                                                 json.dumps({"prompt": "p " * 200, "chosen": "a", "rejected": "b"})]
    (d / "a.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"prompt": ["Write a program", None], "chosen": ["fast", "x"], "rejected": ["slow", "y"]}), d / "b.parquet")
    eos = tok.token_to_id(EOS)
    pairs, bad = load_pairs(str(d), "**/*", "auto", FMT, ChatFormat(), tok, eos, seq_len=64, overlong="truncate")
    assert len(pairs) == 7 and bad.counts == {"bad_json": 1, "bad_pair": 2, "too_long": 1}, bad.counts  # a 412-token prompt
    assert any("a.jsonl:7" in e for e in bad.examples) and any("b.parquet:row1" in e for e in bad.examples)
    assert pairs.where[0].endswith("a.jsonl:1") and pairs.where[-1].endswith("b.parquet:row0")
    # At 45 tokens, 3 of the 7 good pairs are too long (prompt 30-31 + longer answer: 47, 48, 53 tokens;
    # the role headers are one special token each).
    short, bad2 = load_pairs(str(d), "**/*", "auto", FMT, ChatFormat(), tok, eos, seq_len=45, overlong="skip")
    cut, bad3 = load_pairs(str(d), "**/*", "auto", FMT, ChatFormat(), tok, eos, seq_len=45, overlong="truncate")
    assert len(short) == 4 and bad2.counts["too_long"] == 4
    assert len(cut) == 7 and bad3.counts["truncated"] == 3 and bad3.counts["too_long"] == 1
    for ps in (short, cut):
        for i in range(len(ps)):
            p, c, r = ps.pair(i)
            assert len(p) + max(len(c), len(r)) <= 45 and len(c) and len(r)
    full = {tuple(pairs.pair(i)[0]): pairs.pair(i) for i in range(len(pairs))}
    for i in range(len(cut)):  # a cut answer is the start of the full one
        p, c, r = cut.pair(i)
        fp, fc, fr = full[tuple(p)]
        assert fc[:len(c)].tolist() == c.tolist() and fr[:len(r)].tolist() == r.tolist()


def test_pair_set_subset_and_digest():
    ps = PairSet.build([([1, 2], [3], [4, 5]), ([6], [7, 8], [9]), ([10], [11], [12])], ["a", "b", "c"])
    sub = ps.subset([2, 0])
    assert [x.tolist() for x in sub.pair(0)] == [[10], [11], [12]] and [x.tolist() for x in sub.pair(1)] == [[1, 2], [3], [4, 5]]
    assert sub.where == ["c", "a"] and sub.digest() != ps.digest() and ps.subset([0, 1, 2]).digest() == ps.digest()


def test_pair_stream_is_world_size_independent_and_covers_each_epoch():
    s = PairStream(num_pairs=10, seed=3)
    B = 4
    for step in range(6):
        want = s.step(step, B)
        for world in (1, 2, 4):
            got = [x for r in range(world) for x in s.rank_slice(step, B, world, r)]
            assert got == want
    first_epoch = [s.at(p) for p in range(10)]
    assert sorted(first_epoch) == list(range(10)) and sorted(s.at(p) for p in range(10, 20)) == list(range(10))
    assert first_epoch != [s.at(p) for p in range(10, 20)]  # a new permutation each epoch
    assert PairStream(10, 3).step(2, B) == s.step(2, B) and PairStream(10, 4).step(0, 10) != s.step(0, 10)


def test_holdout_split_is_seeded_and_disjoint():
    tr, he = holdout_split(50, 0.1, seed=1)
    assert len(he) == 5 and not set(tr) & set(he) and sorted(tr + he) == list(range(50))
    assert holdout_split(50, 0.1, seed=1) == (tr, he) and holdout_split(50, 0.1, seed=2)[1] != he


def test_code_opt_rows_pair_fast_against_wrong_and_reference():
    rows = code_opt_pair_rows("tests/fixtures/code-opt", ["pair-sum", "range-sum"], ["wrong", "reference"])
    assert [(r["problem"], r["rejected_kind"]) for r in rows] == [("pair-sum", "wrong"), ("pair-sum", "reference"),
                                                                   ("range-sum", "wrong"), ("range-sum", "reference")]
    assert all(r["chosen"].startswith("```") and r["chosen"] != r["rejected"] for r in rows)
    assert rows[0]["prompt"] == rows[1]["prompt"] and "Write a complete" in rows[0]["prompt"]
