"""KV-cache generation (elastic/generation/generate.py) against transformers and against itself.

Models are random-init transformers models (no download) with a wide init
(initializer_range 0.3) so next-token distributions are peaked and greedy choices are not
near-ties; ours loads the same weights through elastic.model.hf.from_pretrained.
Tolerances (fp32, CPU): log-probabilities within 1e-4 of transformers' and within 1e-5
between our own code paths (cache vs recompute, generation vs one forward pass), plus
1e-5 relative (log-probabilities here reach ~10 in magnitude; only summation order differs).
"""

import pytest
import torch

from elastic.generation.generate import filter_logits, generate
from elastic.model.hf import from_pretrained

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], [3, 1, 4, 1, 5, 9, 2]]
N_NEW = 40


def _hf_model(kind: str, tmp_path):
    if kind == "llama":  # GQA, untied
        cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       tie_word_embeddings=False, initializer_range=0.3, rms_norm_eps=1e-6,
                                       pad_token_id=0, eos_token_id=None, bos_token_id=None)
        cls = transformers.LlamaForCausalLM
    else:  # q/k/v biases, tied
        cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       tie_word_embeddings=True, initializer_range=0.3, pad_token_id=0,
                                       eos_token_id=None, bos_token_id=None)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    if kind == "qwen2":
        with torch.no_grad():  # HF initialises biases to zero; make them matter
            for layer in hf.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    d = tmp_path / kind
    hf.save_pretrained(d)
    return hf, from_pretrained(str(d)).eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {k: _hf_model(k, tmp_path_factory.mktemp("hf")) for k in ("llama", "qwen2")}


def _hf_generate(hf, prompts, n_new, stop=None):
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False, pad_token_id=0,
                          eos_token_id=stop, return_dict_in_generate=True, output_logits=True)
    new = out.sequences[:, L:]
    logp = torch.stack(out.logits, 1).float().log_softmax(-1).gather(-1, new[..., None])[..., 0]
    return new, logp


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate(models, kind):
    hf, ours = models[kind]
    new, logp = _hf_generate(hf, PROMPTS, N_NEW)
    got = generate(ours, PROMPTS, N_NEW)
    for i, c in enumerate(got):
        assert c.tokens == new[i].tolist(), f"prompt {i}"
        assert c.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(c.logprobs), logp[i], atol=1e-4, rtol=0)
    assert len({tuple(c.tokens) for c in got}) > 1  # not a degenerate constant output


def test_greedy_stop_token_matches_transformers(models):
    hf, ours = models["llama"]
    free = generate(ours, PROMPTS, N_NEW)
    stop = free[1].tokens[6]  # some row emits it a few steps in
    new, _ = _hf_generate(hf, PROMPTS, N_NEW, stop=stop)
    got = generate(ours, PROMPTS, N_NEW, stop_token_ids=[stop])
    n_stopped = 0
    for i, c in enumerate(got):
        ref = new[i].tolist()
        if stop in ref:
            ref = ref[:ref.index(stop) + 1]  # transformers pads after the stop token
            assert c.finish_reason == "stop" and c.tokens[-1] == stop
            n_stopped += 1
        else:
            assert c.finish_reason == "length"
        assert c.tokens == ref, f"prompt {i}"
        assert stop not in c.tokens[:-1]
    assert 0 < n_stopped


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_kv_cache_equals_recompute(models, kind):
    _, ours = models[kind]
    for kw in (dict(), dict(temperature=0.9, top_p=0.95, seed=[1, 2, 3, 4])):
        a = generate(ours, PROMPTS, 24, **kw)
        b = generate(ours, PROMPTS, 24, use_cache=False, **kw)
        for x, y in zip(a, b):
            assert x.tokens == y.tokens and x.finish_reason == y.finish_reason
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=1e-5)


def test_seeded_sampling_reproducible_and_independent_of_batch(models):
    _, ours = models["qwen2"]
    kw = dict(temperature=1.0, top_k=100, top_p=0.98)
    a = generate(ours, PROMPTS, 30, seed=[10, 11, 12, 13], **kw)
    b = generate(ours, PROMPTS, 30, seed=[10, 11, 12, 13], **kw)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    # The same (prompt, seed) alone, and in another batch at another position.
    alone = generate(ours, [PROMPTS[1]], 30, seed=[11], **kw)[0]
    mixed = generate(ours, [PROMPTS[3], [77, 78], PROMPTS[1]], 30, seed=[99, 98, 11], **kw)[2]
    assert alone.tokens == a[1].tokens == mixed.tokens
    # GRPO-style: one prompt, several seeds → different completions.
    group = generate(ours, [PROMPTS[0]] * 4, 30, seed=[1, 2, 3, 4], **kw)
    assert len({tuple(c.tokens) for c in group}) > 1
    # An int seed gives prompt i the seed `seed + i`.
    base = generate(ours, PROMPTS[:2], 30, seed=5, **kw)
    assert base[1].tokens == generate(ours, [PROMPTS[1]], 30, seed=6, **kw)[0].tokens


def test_logprobs_equal_a_forward_pass(models):
    """Log-probs are of the raw logits (before temperature / top-k / top-p), position by position."""
    _, ours = models["llama"]
    got = generate(ours, PROMPTS, 20, temperature=0.7, top_k=20, top_p=0.9, seed=[4, 5, 6, 7])
    for p, c in zip(PROMPTS, got):
        seq = torch.tensor([p + c.tokens])
        with torch.no_grad():
            logp = ours(seq).float().log_softmax(-1)[0, len(p) - 1:-1]
        ref = logp.gather(-1, torch.tensor(c.tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-5, rtol=1e-5)


def test_stop_tokens_end_rows_and_other_rows_continue(models):
    _, ours = models["llama"]
    free = generate(ours, PROMPTS, 30, temperature=1.0, seed=[1, 2, 3, 4])
    stops = {free[0].tokens[4], free[2].tokens[9]}
    got = generate(ours, PROMPTS, 30, temperature=1.0, seed=[1, 2, 3, 4], stop_token_ids=stops)
    for f, c in zip(free, got):
        cut = next((i for i, t in enumerate(f.tokens) if t in stops), None)
        if cut is None:
            assert c.tokens == f.tokens and c.finish_reason == "length"
        else:
            assert c.tokens == f.tokens[:cut + 1] and c.finish_reason == "stop"
    assert got[0].finish_reason == "stop" and len(got[0].tokens) <= 5


def test_on_finish_streams_each_completion_once_as_it_ends(models):
    _, ours = models["llama"]
    free = generate(ours, PROMPTS, 30, temperature=1.0, seed=[1, 2, 3, 4])
    stop = free[2].tokens[3]
    calls = []
    got = generate(ours, PROMPTS, 30, temperature=1.0, seed=[1, 2, 3, 4], stop_token_ids=[stop],
                   on_finish=lambda i, c: calls.append((i, len(c.tokens), c.finish_reason)))
    assert sorted(i for i, _, _ in calls) == [0, 1, 2, 3]
    assert [n for _, n, _ in calls] == sorted(n for _, n, _ in calls)  # in the order rows ended
    assert all(n == len(got[i].tokens) and r == got[i].finish_reason for i, n, r in calls)
    assert calls[0][2] == "stop" and calls[0][1] < 30


def test_sampling_filters(models):
    _, ours = models["qwen2"]
    greedy = generate(ours, PROMPTS, 12)
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        got = generate(ours, PROMPTS, 12, temperature=1.5, seed=[1, 2, 3, 4], **kw)
        assert [c.tokens for c in got] == [c.tokens for c in greedy]
    x = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    kept = torch.isfinite(filter_logits(x, 1.0, top_k=0, top_p=0.8))[0].tolist()
    assert kept == [True, True, False, False]  # softmax ≈ .64, .24, .09, .03: the top two reach .8


def test_bad_generation_input(models):
    _, ours = models["llama"]
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        generate(ours, [[1], []], 4)
    with pytest.raises(ValueError, match=r"prompts\[0\] has token id 300"):
        generate(ours, [[1, 300]], 4)
    with pytest.raises(ValueError, match="seed: 1 seeds for 2 prompts"):
        generate(ours, [[1], [2]], 4, temperature=1.0, seed=[1])


def test_default_forward_is_one_document_per_row(models):
    _, ours = models["llama"]
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad():
        a = ours(tokens)
        b = ours(tokens, torch.arange(4).expand(2, 4), torch.zeros_like(tokens))
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_generate_benchmark_smoke(tmp_path):
    """bench/generate_throughput.py runs every system, and the engine agrees token for token with
    its recompute mode and the reference path (its exit status checks that in fp32)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "gen.json"
    r = subprocess.run([sys.executable, str(repo / "bench" / "generate_throughput.py"), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    assert [row["batch"] for row in rows] == [1, 2]
    for row in rows:
        assert row["tokens"] == 8 * row["batch"]
        assert set(row["tokens_per_s"]) == {"ours", "recompute", "reference", "hf", "int8"}  # int4: CUDA only
        assert {k: v for k, v in row["same_tokens_fraction"].items() if k != "int8"} == {"recompute": 1.0, "reference": 1.0, "hf": 1.0}
        assert 0 < row["ours_fraction_of_bound"] < 1
        q = row["quantized"]["int8"]  # generation.weights=int8 beside the full-precision engine
        assert q["tokens_per_s_vs_full"] > 0 and 0 < q["logprob_abs_delta_mean"] <= q["logprob_abs_delta_max"] < 0.05
        assert q["weight_bytes_in_memory"] < q["full_weight_bytes_in_memory"]
    assert "bound = batch x" in r.stdout and list(tmp_path.iterdir()) == [out]
