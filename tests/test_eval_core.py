"""Evaluation core: lm-eval's request conventions by hand, tree-shared scoring against one
forward per pair, metrics by hand, and what a GPU needs (select, one host transfer)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from elastic.eval import loglik
from elastic.eval.evaluate import judge_answer
from elastic.eval.metrics import aggregate, from_sums, partial_sums
from elastic.eval.requests import (LLRequest, build_context, cut_at_stops, encode_pair, extract_regex,
                                   normalize_for_match, rolling_windows, draw_shots, truncate_left)
from elastic.eval.spec import Doc, EvalConfigError, TaskSpec, spec_from_dict
from elastic.model.llama import ModelArgs, Transformer


def char_encode(s: str):
    """A toy tokenizer: one id per character; merges across a boundary never happen."""
    return [ord(c) % 97 for c in s]


def word_encode(s: str):
    """A toy tokenizer where a leading space belongs to the following word (like GPT-2's BPE)."""
    import re

    return [hash(w) % 1000 for w in re.findall(r" ?\S+|\s+", s)]


def test_encode_pair_moves_trailing_space_into_continuation():
    ctx, cont = encode_pair(word_encode, "Question: 2+2?\nAnswer: ", "4", prefix_id=0)
    # "Answer:" then " 4": the space went to the continuation, encoded as one token with "4"
    assert ctx == word_encode("Question: 2+2?\nAnswer:")
    assert cont == word_encode(" 4")


def test_encode_pair_empty_context_is_the_prefix_token():
    assert encode_pair(char_encode, "", "ab", prefix_id=7) == ([7], char_encode("ab"))


def test_rolling_windows_tile_every_token_once_like_lm_eval():
    toks = list(range(10, 40))
    w = list(rolling_windows(toks, prefix_id=1, max_len=8))
    # hand-derived from lm-eval's get_rolling_token_windows + make_disjoint_window
    assert w[0] == ([1], toks[:8])
    assert w[1] == ([toks[7]], toks[8:16])
    assert w[2] == ([toks[15]], toks[16:24])
    assert w[3] == (toks[21:24], toks[24:30])  # a short last window keeps up to max_len of context
    assert [t for _, b in w for t in b] == toks
    assert all(len(a) + len(b) - 1 <= 8 for a, b in w)


def test_truncate_left_keeps_the_last_max_len_plus_one():
    ctx, cont = truncate_left(list(range(20)), [100, 101], max_len=8)
    assert ctx + cont == (list(range(20)) + [100, 101])[-9:]
    with pytest.raises(ValueError):
        truncate_left([1], list(range(10)), max_len=8)


def test_fewshot_draws_follow_lm_eval():
    """One Random(seed) per task, used up in item order; n + 1 drawn from the item's own file
    and the item dropped (lm-eval 0.4 api/samplers.py)."""
    import random as _random

    spec = TaskSpec(task="t", type="multiple_choice", data="x", num_fewshot=2, description="D\n\n")
    pool = [Doc(id=str(i), context=f"Q{i}", choices=["a", "b"], gold=i % 2) for i in range(6)]
    shots = draw_shots(spec, pool, pool, same_file=True)
    rnd = _random.Random(1234)
    for d, got in zip(pool, shots):
        want = [x for x in rnd.sample(pool, 3) if x.id != d.id][:2]
        assert got == want and d not in got
    ctx = build_context(spec, pool[3], shots[3])
    assert ctx == "D\n\n" + "".join(f"{s.context} {s.choices[s.gold]}\n\n" for s in shots[3]) + "Q3"
    first = TaskSpec(task="t", type="multiple_choice", data="x", num_fewshot=2, fewshot_sampler="first_n")
    dev = [Doc(id=f"d{i}", context=f"E{i}", choices=["a"], gold=0) for i in range(4)]
    assert draw_shots(first, pool[:2], dev, same_file=False) == [dev[:2], dev[:2]]


def test_generation_text_rules():
    assert cut_at_stops("12\n\nQuestion: next", ["Question:", "\n\n"]) == "12"
    assert extract_regex("so #### 1,234 done", r"#### (\-?[0-9\.\,]+)") == "1,234"
    assert extract_regex("nothing", r"#### (\d+)") == "[invalid]"
    assert extract_regex("a 1 b 22 c", r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1) == "22"
    assert normalize_for_match("$1,234.", False, [",", "\\$", "(?s).*#### ", "\\.$"]) == "1234"
    spec = TaskSpec(task="g", type="generation", data="x", extract="regex", pattern=r"#### (\-?[0-9\.\,]+)",
                    regexes_to_ignore=[",", "\\$", "(?s).*#### ", "\\.$"])
    assert judge_answer(spec, "calc <<2*3=6>> #### 6", "6")["exact_match"] == 1.0
    assert judge_answer(spec, "#### 7", "6")["exact_match"] == 0.0
    m = TaskSpec(task="m", type="generation", data="x", extract="math_answer")
    assert judge_answer(m, "The answer is \\boxed{\\frac{1}{2}}", "0.5")["exact_match"] == 1.0


def test_metrics_by_hand():
    mc = TaskSpec(task="m", type="multiple_choice", data="x")
    recs = [{"lls": [-1.0, -2.0], "chars": [1, 10], "gold": 1},   # acc: 0 (argmax 0); norm: -1/1 vs -2/10 -> 1
            {"lls": [-3.0, -0.5], "chars": [3, 3], "gold": 1}]    # acc 1, norm 1
    m = aggregate(mc, recs)
    assert m["acc"] == 0.5 and m["acc_norm"] == 1.0 and m["n"] == 2
    assert from_sums(mc, partial_sums(mc, recs[:1])) == {"n": 1, "acc": 0.0, "acc_norm": 1.0}
    pp = TaskSpec(task="p", type="perplexity", data="x")
    recs = [{"ll": -10.0, "words": 4, "bytes": 20, "tokens": 8}, {"ll": -6.0, "words": 4, "bytes": 12, "tokens": 8}]
    m = aggregate(pp, recs)
    assert m["word_perplexity"] == pytest.approx(math.exp(16 / 8))
    assert m["bits_per_byte"] == pytest.approx(16 / 32 / math.log(2))
    assert m["token_perplexity"] == pytest.approx(math.exp(1.0))
    code = TaskSpec(task="c", type="code", data="x", samples=4, k=[1, 2], temperature=0.8)
    m = aggregate(code, [{"verdicts": ["ok", "wrong_answer", "ok", "timeout"]}, {"verdicts": ["wrong_answer"] * 4}])
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx((1 - 1 / 6) / 2)


def test_spec_errors_are_one_line_and_name_the_field(tmp_path):
    with pytest.raises(EvalConfigError, match="unknown key 'num_fewshots'"):
        spec_from_dict({"task": "t", "type": "multiple_choice", "data": "x", "num_fewshots": 2}, source="t.yaml")
    with pytest.raises(EvalConfigError, match="type: 'mc'"):
        spec_from_dict({"task": "t", "type": "mc", "data": "x"})
    with pytest.raises(EvalConfigError, match="k: \\[4\\]"):
        spec_from_dict({"task": "t", "type": "code", "data": "x", "k": 4, "samples": 2, "temperature": 0.5})
    spec = spec_from_dict({"task": "t", "type": "perplexity", "data": "d.jsonl"}, base=str(tmp_path))
    assert spec.data == str(tmp_path / "d.jsonl")


def _tiny(max_seq_len=48, vocab=97):
    torch.manual_seed(0)
    m = Transformer(ModelArgs(vocab_size=vocab, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                              max_seq_len=max_seq_len))
    m.init_weights(seed=0)
    return m.eval()


def _one_pair(model, ctx, cont, max_len):
    inp = (ctx + cont)[-(max_len + 1):][:-1]
    with torch.no_grad():
        lp = model(torch.tensor([inp])).float().log_softmax(-1)[0, len(inp) - len(cont):]
    t = torch.tensor(cont)
    return lp.gather(1, t[:, None]).sum().item(), bool((lp.argmax(-1) == t).all())


def test_trie_scoring_equals_one_forward_per_pair():
    """Choices sharing their item's context, items sharing a few-shot prefix, contexts cut on
    the left, items alone wider than a row: every number as if each pair ran alone."""
    model = _tiny()
    rnd = random.Random(1)
    shot = [rnd.randrange(97) for _ in range(30)]  # a shared "few-shot" prefix
    reqs = []
    for i in range(30):
        ctx = [rnd.randrange(97) for _ in range(rnd.randrange(1, 70))]
        if i % 3 == 0:
            ctx = shot + ctx[:10]
        conts = [[rnd.randrange(97) for _ in range(rnd.randrange(1, 7))] for _ in range(rnd.randrange(1, 5))]
        reqs.append(LLRequest(ctx, conts))
    reqs.append(LLRequest(shot + [5] * 14, [[1], [2, 3, 4, 5, 6, 7, 8]]))  # one choice fits, one is cut
    trees, _ = loglik.plan_trees(reqs, 48, 96)
    assert any(len(t.nodes) > 1 and t.nodes[1].parent == 0 and t.nodes[1].target is None for t in trees)  # a shared prefix
    got = loglik.score(model, reqs, max_len=48, token_budget=200, row_cap=96)
    n_pairs = 0
    for r, g in zip(reqs, got):
        assert len(g) == len(r.continuations)
        for c, (ll, greedy) in zip(r.continuations, g):
            ref_ll, ref_greedy = _one_pair(model, r.context, c, 48)
            assert ll == pytest.approx(ref_ll, abs=1e-4)
            assert greedy == ref_greedy
            n_pairs += 1
    assert loglik.forward_count(reqs, 48, 200, 96) < n_pairs / 4


def test_trie_mask_isolates_items_and_choices():
    # nodes: 0 shared prefix; 1, 2 two items' contexts; 3 a choice of item 1; 4 padding
    node = torch.tensor([[0, 0, 1, 1, 3, 2, 2, 4]])
    anc = torch.tensor(np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 1]], dtype=bool))
    m = loglik.trie_mask(node, anc)[0, 0]
    assert m[4, :4].all()                         # the choice sees its item and the prefix
    assert m[5, :2].all() and not m[5, 2:5].any()  # item 2 sees the prefix, not item 1 or its choice
    assert not m[7, :7].any() and m[7, 7]         # padding sees only itself
    assert m.diagonal().all()                     # every query has a key (no NaN rows)


def test_scoring_sends_only_scored_positions_through_the_head():
    """`select`: the output projection sees N scored positions, not B x T (memory at 128k vocab)."""
    model = _tiny()
    seen = []
    h = model.output.register_forward_hook(lambda mod, inp, out: seen.append(tuple(out.shape)))
    loglik.score(model, [LLRequest([1, 2, 3, 4, 5], [[6, 7], [8]])], max_len=48)
    h.remove()
    assert seen == [(3, 97)]  # 2 tokens of the first continuation + 1 of the second
