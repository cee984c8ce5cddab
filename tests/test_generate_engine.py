"""The generation engine (elastic/generation/generate.py, decoder.py, static_cache.py, sampling.py)
against the reference path, a teacher-forced forward and itself; plus CPU guards for what the
CUDA path needs.

Exactness (CPU, fp32): greedy tokens equal generate_reference's (KV cache and recompute) and the
argmax of one full forward over prompt + completion; log-probabilities within 1e-5 (plus 1e-5
relative) of that forward's log_softmax; a seed gives the same tokens twice and in every mode;
continuous batching (fewer slots than prompts, rows ending at different steps, GRPO-style
repeated prompts) gives each prompt exactly the tokens it gets alone. Models have sharpened
weights (x4) so greedy choices and samples are not decided by last-bit near-ties.

GPU guards: the decode step is traced by dynamo as one full graph (a graph break would mean a
host sync or a data-dependent shape, which a CUDA graph cannot hold) per batch bucket, with no
recompile for a new call; every tensor it reads keeps its storage and shape from step to step
(the cache is written in place, no per-step mask or state is allocated outside the step); and
inductor compiles it without falling back on complex values.
"""

import math
import warnings

import pytest
import torch

from elastic.model import ModelArgs, Transformer
from elastic.generation.decoder import CachedDecoder
from elastic.generation.generate import generate, run_decoder
from elastic.generation.reference import generate_reference
from elastic.generation.sampling import SamplingParams, counter_uniform, sample
from elastic.generation.step import compiled_decode_step, decode_step

PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], [3, 1, 4, 1, 5, 9, 2]]
N_NEW = 32
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95)
MODES = ["eager", "fixed"]


def _model(kind: str) -> Transformer:
    extra = dict(tie_embeddings=False, qkv_bias=True) if kind == "bias_untied" else {}
    m = Transformer(ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                              max_seq_len=64, **extra))
    m.init_weights(seed=3)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(4)
            elif name.endswith(".bias"):
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return m.eval()


@pytest.fixture(scope="module")
def models():
    return {k: _model(k) for k in ("gqa_tied", "bias_untied")}


def _teacher_forced(model, prompt, tokens):
    """(argmax, log p(token)) at every completion position, from one forward without cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).float()[0, len(prompt) - 1:-1]
    logp = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    return logits.argmax(-1).tolist(), logp


def _close(a, b):
    torch.testing.assert_close(torch.tensor(a), torch.as_tensor(b), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("kind", ["gqa_tied", "bias_untied"])
@pytest.mark.parametrize("mode", MODES)
def test_greedy_equals_reference_and_a_full_forward(models, kind, mode):
    m = models[kind]
    got = generate(m, PROMPTS, N_NEW, mode=mode)
    refs = (generate_reference(m, PROMPTS, N_NEW), generate_reference(m, PROMPTS, N_NEW, use_cache=False),
            generate(m, PROMPTS, N_NEW, use_cache=False))
    for i, (p, c) in enumerate(zip(PROMPTS, got)):
        for r in refs:
            assert c.tokens == r[i].tokens and c.finish_reason == r[i].finish_reason == "length", f"prompt {i}"
            _close(c.logprobs, r[i].logprobs)
        argmax, logp = _teacher_forced(m, p, c.tokens)
        assert c.tokens == argmax, f"prompt {i}: not the argmax of a full forward"
        _close(c.logprobs, logp)
    assert len({tuple(c.tokens) for c in got}) > 1


@pytest.mark.parametrize("mode", MODES)
def test_sampled_logprobs_equal_a_teacher_forced_forward(models, mode):
    """Log-probs of sampled tokens are of the raw logits, before temperature / top-k / top-p."""
    m = models["bias_untied"]
    got = generate(m, PROMPTS, N_NEW, seed=[4, 5, 6, 7], mode=mode, **SAMPLED)
    greedy = generate(m, PROMPTS, N_NEW, mode=mode)
    assert [c.tokens for c in got] != [c.tokens for c in greedy]  # really sampled
    for p, c in zip(PROMPTS, got):
        _close(c.logprobs, _teacher_forced(m, p, c.tokens)[1])


def test_seeded_sampling_is_reproducible_in_every_mode(models):
    m = models["gqa_tied"]
    runs = [generate(m, PROMPTS, N_NEW, seed=[10, 11, 12, 13], mode=mode, **SAMPLED) for mode in MODES + MODES]
    runs.append(generate(m, PROMPTS, N_NEW, seed=[10, 11, 12, 13], use_cache=False, **SAMPLED))
    for r in runs[1:]:
        assert [c.tokens for c in r] == [c.tokens for c in runs[0]]
    # One prompt, several seeds (a GRPO group): different completions.
    group = generate(m, [PROMPTS[0]] * 4, N_NEW, seed=[1, 2, 3, 4], **SAMPLED)
    assert len({tuple(c.tokens) for c in group}) > 1
    # seed=None follows torch's global RNG.
    torch.manual_seed(5)
    a = generate(m, PROMPTS, 8, **SAMPLED)
    torch.manual_seed(5)
    assert [c.tokens for c in generate(m, PROMPTS, 8, **SAMPLED)] == [c.tokens for c in a]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("max_batch", [1, 2, 3])
def test_continuous_batching_gives_each_prompt_its_tokens_alone(models, mode, max_batch):
    """Fewer slots than prompts: finished rows' slots take the next prompts (prefilled into that
    slot only). Stop tokens end rows at different steps; prompts repeat (GRPO groups, prefilled
    once and copied). Each prompt's completion equals the one it gets alone."""
    m = models["gqa_tied"]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[1], [200, 201]]
    seeds = [21, 22, 23, 24, 25, 26, 27]
    free = [generate(m, [p], N_NEW, seed=[s], **SAMPLED)[0] for p, s in zip(prompts, seeds)]
    stops = [free[0].tokens[3], free[3].tokens[10]]
    alone = [generate(m, [p], N_NEW, seed=[s], stop_token_ids=stops, **SAMPLED)[0] for p, s in zip(prompts, seeds)]
    assert {c.finish_reason for c in alone} == {"stop", "length"}
    assert len({len(c.tokens) for c in alone}) > 2  # rows end at different steps
    got = generate(m, prompts, N_NEW, seed=seeds, stop_token_ids=stops, max_batch=max_batch, mode=mode, **SAMPLED)
    for i, (a, c) in enumerate(zip(alone, got)):
        assert c.tokens == a.tokens and c.finish_reason == a.finish_reason, f"prompt {i}"
        _close(c.logprobs, a.logprobs)
    greedy = generate(m, prompts, N_NEW, stop_token_ids=stops, max_batch=max_batch, mode=mode)
    assert [c.tokens for c in greedy] == [generate(m, [p], N_NEW, stop_token_ids=stops)[0].tokens for p in prompts]


def test_on_finish_streams_each_completion_once_in_finish_order(models):
    m = models["gqa_tied"]
    prompts = PROMPTS + [[9, 9, 9], [100]]
    free = generate(m, prompts, N_NEW, seed=list(range(6)), **SAMPLED)
    stop = free[2].tokens[3]
    calls = []
    got = generate(m, prompts, N_NEW, seed=list(range(6)), stop_token_ids=[stop], max_batch=3,
                   on_finish=lambda i, c: calls.append((i, len(c.tokens), c.finish_reason)), **SAMPLED)
    assert sorted(i for i, _, _ in calls) == list(range(6))
    assert all(n == len(got[i].tokens) and r == got[i].finish_reason for i, n, r in calls)
    assert any(r == "stop" for _, _, r in calls)
    # Streaming order: a prompt admitted later finishes later than one that stopped early.
    assert calls[0][2] == "stop" and calls[0][1] < N_NEW


def test_stop_sequences_end_a_row_after_the_sequence(models):
    m = models["gqa_tied"]
    free = generate(m, PROMPTS, N_NEW, seed=[1, 2, 3, 4], **SAMPLED)
    seq = free[1].tokens[6:8]
    got = generate(m, PROMPTS, N_NEW, seed=[1, 2, 3, 4], stop_sequences=[seq], **SAMPLED)
    for f, c in zip(free, got):
        end = next((j + 1 for j in range(1, len(f.tokens)) if f.tokens[j - 1:j + 1] == seq), None)
        if end is None:
            assert c.tokens == f.tokens and c.finish_reason == "length"
        else:
            assert c.tokens == f.tokens[:end] and c.finish_reason == "stop"
    assert got[1].finish_reason == "stop" and len(got[1].tokens) <= 8
    with pytest.raises(ValueError, match="empty sequence"):
        generate(m, PROMPTS, 4, stop_sequences=[[]])


def test_edge_cases(models):
    m = models["gqa_tied"]
    assert [c.tokens for c in generate(m, PROMPTS, 0)] == [[], [], [], []]
    one = generate(m, PROMPTS, 1)
    assert [c.tokens for c in one] == [c.tokens[:1] for c in generate_reference(m, PROMPTS, 1)]
    assert generate(m, [], 5) == []
    with pytest.raises(ValueError, match="mode"):
        generate(m, PROMPTS, 4, mode="graphs")  # CUDA graphs on a CPU model
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        generate(m, [[1], []], 4)


# ----------------------------------------------------------------------------- sampler

def test_counter_uniform_is_a_fixed_function_and_uniform():
    seeds = torch.arange(4000, dtype=torch.long).repeat_interleave(8) * 7919 + (1 << 40)
    index = torch.arange(8, dtype=torch.long).repeat(4000)
    u = counter_uniform(seeds, index)
    assert torch.equal(u, counter_uniform(seeds, index))
    assert 0 < u.min() and u.max() < 1
    n = u.numel()
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    counts = torch.histc(u.float(), bins=16, min=0, max=1)
    expected = n / 16
    assert ((counts - expected).abs() < 5 * math.sqrt(expected)).all(), counts
    # Neighbouring token indices of one seed, and neighbouring seeds, are uncorrelated.
    grid = u.view(4000, 8)
    for a, b in ((grid[:, :-1], grid[:, 1:]), (grid[:-1], grid[1:])):
        r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
        assert abs(r) < 0.03, r


def test_sample_draws_from_the_filtered_distribution():
    """20,000 rows with the same logits and different seeds: token frequencies match the
    top-k-filtered softmax (chi-square), dropped tokens never appear, log-probs are raw."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 3.0, -1.0])
    n = 20000
    params = SamplingParams(temperature=1.3, top_k=5, top_p=1.0)
    tok, logp = sample(logits.expand(n, -1).contiguous(), params, torch.arange(n, dtype=torch.long) * 31 + 5,
                       torch.full((n,), 3, dtype=torch.long))
    kept = torch.topk(logits, 5).indices
    probs = torch.zeros(8)
    probs[kept] = (logits[kept] / 1.3).softmax(-1)
    counts = torch.bincount(tok, minlength=8).double()
    assert counts[probs == 0].sum() == 0
    chi2 = (((counts - n * probs.double()) ** 2) / (n * probs.double()))[probs > 0].sum().item()
    assert chi2 < 20.5, chi2  # 4 degrees of freedom: p ~ 0.0004
    torch.testing.assert_close(logp, logits.log_softmax(-1)[tok])


# ----------------------------------------------------------------------------- GPU guards on CPU

class _Recorder:
    """Wraps the real step function; records, per call, the bucket, kv_len and every tensor
    argument's (data pointer, shape)."""

    def __init__(self, fn=decode_step):
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)] + [t for a in args if isinstance(a, list) for t in a]
        self.calls.append((args[9], args[10], [(t.data_ptr(), tuple(t.shape)) for t in tensors]))
        return self.fn(*args)


def _run_fixed(model, step_fn, prompts, max_new, seeds, **kw):
    params = SamplingParams(kw.pop("temperature", 0.0), kw.pop("top_k", 0), kw.pop("top_p", 1.0))
    with torch.no_grad():
        dec = CachedDecoder(model, len(prompts), max(len(p) for p in prompts) + max_new, params, "fixed", step_fn=step_fn,
                            kv_bucket=16)
        ptrs = dec.cache.data_ptrs()
        out = run_decoder(dec, prompts, seeds, max_new, **kw)
    return dec, ptrs, out


def test_decode_state_is_static_and_the_cache_written_in_place(models):
    m = models["gqa_tied"]
    prompts = PROMPTS + [[1, 2], [3]]
    free = generate(m, prompts, N_NEW)
    rec = _Recorder()
    dec, ptrs, out = _run_fixed(m, rec, prompts, N_NEW, [0] * 6, stop_token_ids=[free[0].tokens[2], free[4].tokens[5]])
    assert [c.tokens for c in out] == [c.tokens for c in generate(m, prompts, N_NEW, stop_token_ids=[free[0].tokens[2], free[4].tokens[5]])]
    buckets = [b for b, _, _ in rec.calls]
    assert len(set(buckets)) > 1 and buckets == sorted(buckets, reverse=True)  # the batch shrank by buckets
    assert all(b in (1, 2, 4, 8) for b in buckets)
    kvs = [kv for _, kv, _ in rec.calls]  # key length read: grows by buckets of 16 up to the capacity
    assert kvs == sorted(kvs) and kvs[-1] == dec.capacity and len(set(kvs)) > 1
    assert all(kv % 16 == 0 or kv == dec.capacity for kv in kvs)
    first = rec.calls[0][2]
    assert all(c[2] == first for c in rec.calls), "a step input changed storage or shape"
    assert dec.cache.data_ptrs() == ptrs


def test_decode_step_compiles_to_three_full_graphs(models):
    """The CUDA path's compile (elastic/generation/step.compiled_decode_step), with a backend
    that counts dynamo's graphs. fullgraph=True fails on any graph break (a .item()/.tolist(),
    a data-dependent shape): what would break CUDA graph capture. Sizes are symbolic, so one
    graph serves every bucket >= 2, slot count and capacity; batch 1 and a single slot are one
    more each (dynamo specialises size 1); nothing else ever recompiles (a compile of a large
    model costs minutes on a GPU)."""
    m = models["gqa_tied"]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = compiled_decode_step(backend)
    prompts = PROMPTS + [[1, 2], [3]]
    seeds = list(range(6))
    free = generate(m, prompts, N_NEW, seed=seeds, **SAMPLED)
    kw = dict(stop_token_ids=[free[0].tokens[2], free[4].tokens[5]], **SAMPLED)

    def run(n, extra):
        rec = _Recorder(compiled)
        _, _, out = _run_fixed(m, rec, [p + [7] * extra for p in prompts[:n]], N_NEW, seeds[:n], **dict(kw))
        return out, {b for b, _, _ in rec.calls}

    out, buckets = run(6, 0)
    assert [c.tokens for c in out] == [c.tokens for c in generate(m, prompts, N_NEW, seed=seeds, **kw)]
    assert buckets == {4, 8} and len(graphs) == 1
    assert run(6, 9)[1] == {8} and run(3, 0)[1] == {2, 4} and len(graphs) == 1  # other capacity, slots, bucket
    assert 1 in run(2, 5)[1] and len(graphs) == 2
    assert run(1, 2)[1] == {1} and len(graphs) == 3
    for n, extra in ((6, 0), (2, 5), (5, 13), (1, 0), (4, 1)):
        run(n, extra)
    assert len(graphs) == 3, "recompiled for a new generate() call"


def test_decode_step_compiles_with_inductor_without_complex_fallback(models, tmp_path, monkeypatch):
    """The CUDA path's compile with inductor itself, on the CPU backend: same tokens, and no
    complex value in the graph (inductor would leave it to eager)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    m = models["gqa_tied"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*complex.*")
        _, _, out = _run_fixed(m, compiled_decode_step(), PROMPTS, 12, [0] * 4)
    assert [c.tokens for c in out] == [c.tokens for c in generate_reference(m, PROMPTS, 12)]


# ----------------------------------------------------------------------------- CUDA

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["graphs", "compile"])
def test_cuda_graph_modes_equal_eager(mode):
    m = _model("gqa_tied").cuda()
    prompts = PROMPTS + [[1, 2], [3], [4, 5, 6]]
    for kw in (dict(), dict(seed=list(range(7)), **SAMPLED)):
        eager = generate(m, prompts, N_NEW, mode="eager", **kw)
        stops = [eager[0].tokens[3]]
        eager = generate(m, prompts, N_NEW, mode="eager", stop_token_ids=stops, **kw)
        for max_batch in (8, 3):
            got = generate(m, prompts, N_NEW, mode=mode, stop_token_ids=stops, max_batch=max_batch, **kw)
            assert [c.tokens for c in got] == [c.tokens for c in eager], (mode, max_batch, kw)
            for a, b in zip(got, eager):
                torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)
    bf = generate(m.to(torch.bfloat16), prompts, N_NEW, mode=mode)
    assert all(len(c.tokens) == N_NEW for c in bf)
