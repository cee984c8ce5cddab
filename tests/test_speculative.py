"""Speculative decoding (elastic/generation/speculative.py, draft.py, chunk.py) on CPU, fp32.

Exactness: greedy output with prompt-lookup drafting, with a small draft model and with the
policy as its own draft is token for token the engine's plain greedy output (continuous
batching, stop tokens), log-probabilities within 1e-5. Distribution: with sampling (temperature,
top-k) the joint distribution of the first three tokens matches the policy's, computed exactly
by enumerating every sequence (chi-square over 12,000 seeds), for prompt lookup, a good draft
and a deliberately bad one. The policy as its own draft accepts every draft.
"""

import pytest
import torch
from scipy.stats import chi2 as chi2_dist

from elastic.generation.draft import lookup
from elastic.generation.generate import generate
from elastic.generation.sampling import filter_logits
from elastic.generation.speculative import SpecStats
from elastic.model import ModelArgs, Transformer

PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], [3, 1, 4, 1, 5, 9, 2, 3, 1, 4]]


def _model(seed, vocab=300, dim=64, layers=2, scale=4.0):
    m = Transformer(ModelArgs(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=4, n_kv_heads=2,
                              ffn_hidden=2 * dim, max_seq_len=128))
    m.init_weights(seed=seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return m.eval()


@pytest.fixture(scope="module")
def policy():
    return _model(3)


def test_lookup_proposes_what_followed_the_latest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 3) == [7, 1]
    assert lookup([1, 2, 3, 4, 5, 2], 3, 3) == [3, 4, 5]   # falls back to a 1-gram
    assert lookup([1, 2, 3], 3, 2) == []
    assert lookup([5, 5, 5, 5, 5], 3, 2) == [5, 5, 5]   # a loop: the match with k tokens after it


@pytest.mark.parametrize("draft", ["ngram", "small", "self"])
def test_greedy_is_token_for_token_plain_greedy(policy, draft):
    d = {"ngram": "ngram", "small": _model(5, dim=32, layers=1), "self": policy}[draft]
    ref = generate(policy, PROMPTS, 40, stop_token_ids=[7])
    stats = SpecStats()
    out = generate(policy, PROMPTS, 40, stop_token_ids=[7], draft=d, draft_tokens=3, max_batch=3, spec_stats=stats)
    for a, b in zip(out, ref):
        assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
    assert stats.tokens == sum(len(c.tokens) for c in ref) and stats.proposed > 0
    if draft == "self":
        assert stats.acceptance_rate == 1.0 and stats.tokens_per_round > 3


def _joint(model, prompt, params, n_new=3):
    """Exact probability of every sequence of n_new tokens under the filtered policy."""
    V = model.args.vocab_size
    seqs = torch.cartesian_prod(*[torch.arange(V)] * n_new)
    with torch.no_grad():
        logits = model(torch.cat((torch.tensor(prompt).expand(len(seqs), -1), seqs), 1)).float()
    logits = logits[:, len(prompt) - 1:-1]
    probs = filter_logits(logits.reshape(-1, V), *params).softmax(-1).reshape(len(seqs), n_new, V)
    return seqs, probs.gather(-1, seqs[..., None])[..., 0].double().prod(-1)


@pytest.mark.parametrize("draft", ["ngram", "good", "bad"])
def test_sampling_keeps_the_policy_distribution(draft):
    """12,000 seeds, one prompt: the first three tokens' joint frequencies match the policy's
    exact filtered distribution (chi-square, p ~ 1e-4); the bad draft is peaked elsewhere."""
    V, n, params = 4, 12000, (1.2, 3, 1.0)
    pol = _model(11, vocab=V, dim=16, layers=1, scale=2.0)
    d = {"ngram": "ngram", "good": _model(12, vocab=V, dim=16, layers=1, scale=2.0),
         "bad": _model(13, vocab=V, dim=16, layers=1, scale=12.0)}[draft]
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    stats = SpecStats()
    out = generate(pol, [prompt] * n, 3, temperature=params[0], top_k=params[1], seed=7, draft=d, draft_tokens=2,
                   spec_stats=stats, max_batch=n)
    seqs, probs = _joint(pol, prompt, params)
    got = torch.tensor([c.tokens for c in out])
    cell = (got * torch.tensor([V * V, V, 1])).sum(-1)
    counts = torch.bincount(cell, minlength=V ** 3).double()
    assert counts[probs == 0].sum() == 0
    keep = probs > 0
    chi2 = (((counts - n * probs) ** 2) / (n * probs))[keep].sum().item()
    assert chi2 < chi2_dist.ppf(1 - 1e-4, int(keep.sum()) - 1), chi2
    assert stats.proposed > 0 and 0 < stats.accepted < stats.proposed
    # log-probs are the raw policy's
    with torch.no_grad():
        ref = pol(torch.tensor([prompt + out[0].tokens])).float()[0, len(prompt) - 1:-1].log_softmax(-1)
    torch.testing.assert_close(torch.tensor(out[0].logprobs), ref.gather(-1, torch.tensor(out[0].tokens)[:, None])[:, 0],
                               atol=1e-5, rtol=1e-5)


def test_sampling_is_a_function_of_the_seed_and_the_self_draft_accepts_all(policy):
    kw = dict(temperature=0.9, top_k=40, seed=[4, 5, 6, 7], draft=policy, draft_tokens=3)
    stats = SpecStats()
    a = generate(policy, PROMPTS, 24, max_batch=2, spec_stats=stats, **kw)
    b = generate(policy, PROMPTS[::-1], 24, **{**kw, "seed": [7, 6, 5, 4]})
    assert [c.tokens for c in a] == [c.tokens for c in b[::-1]]
    assert stats.acceptance_rate > 0.98


@pytest.mark.parametrize("override, ok", [("generation.draft=ngram", True), ("generation.draft=/no/such/dir", False),
                                          ("generation.draft_tokens=0", False), ("generation.draft_ngram=0", False)])
def test_generation_config_is_validated(override, ok):
    from elastic.config import ConfigError, load_config

    if ok:
        assert load_config(None, [override], job="grpo").generation.draft == "ngram"
        return
    with pytest.raises(ConfigError, match=r"^generation\.draft"):
        load_config(None, [override], job="grpo")
