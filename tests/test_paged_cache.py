"""The paged KV cache (elastic/generation/paged_cache.py) against the static cache, and its block
accounting.

Exactness (CPU, fp32): on a GRPO-like batch (prompts repeated group_size times, mixed lengths,
stop tokens ending rows at different steps) with continuous batching (fewer slots than rows),
greedy and sampled, the paged cache gives the static cache's tokens and finish reasons exactly
and its log-probs within 1e-6 (they were bitwise equal when this was written: the decode step
gathers the same values into the same [b, Hkv, kv_len, D] shape for the same SDPA call).
Accounting: every block returns to the pool when the rows finish; a group's prompt is stored
once (full blocks shared, one partial block per row); a batch of mixed lengths holds fewer KV
bytes than slots x the longest sequence.
"""

import pytest
import torch

from elastic.config import ConfigError, from_dict
from elastic.generation.generate import generate, run_decoder
from elastic.generation.paged_cache import PagedDecoder
from elastic.generation.sampling import SamplingParams
from elastic.model import ModelArgs, Transformer

GROUP = 3
BASE = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], list(range(20, 57))]
PROMPTS = [p for p in BASE for _ in range(GROUP)]  # a GRPO batch: each prompt group_size times
N_NEW = 16
SAMPLED = dict(temperature=0.9, top_k=50, top_p=0.95, seed=7)


@pytest.fixture(scope="module")
def model():
    m = Transformer(ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=96))
    m.init_weights(seed=3)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(4)  # sharpened, as in test_generate_engine: no last-bit near-ties
    return m.eval()


@pytest.fixture(scope="module")
def stops(model):
    """Stop tokens that end some rows early, greedy and sampled: tokens produced a few steps in."""
    greedy, sampled = generate(model, BASE, N_NEW), generate(model, PROMPTS, N_NEW, **SAMPLED)
    return sorted({greedy[0].tokens[4], sampled[1].tokens[5], sampled[GROUP * 2].tokens[3]})


def _decoder(model, slots, block_size, mode="eager", params=SamplingParams(0.0, 0, 1.0), capacity=None):
    cap = capacity or max(len(p) for p in PROMPTS) + N_NEW
    return PagedDecoder(model, slots, cap, params, mode, block_size)


@pytest.mark.parametrize("sampling,mode,max_batch,block_size", [("greedy", "eager", 12, 4), ("sampled", "eager", 4, 16),
                                                                ("sampled", "fixed", 5, 8)])
def test_paged_equals_static(model, stops, sampling, mode, max_batch, block_size):
    kw = SAMPLED if sampling == "sampled" else {}
    common = dict(stop_token_ids=stops, max_batch=max_batch, mode=mode, **kw)
    static = generate(model, PROMPTS, N_NEW, **common)
    paged = generate(model, PROMPTS, N_NEW, kv_cache="paged", block_size=block_size, **common)
    assert {c.finish_reason for c in static} == {"stop", "length"}  # rows end at different steps
    for i, (a, b) in enumerate(zip(static, paged)):
        assert a.tokens == b.tokens and a.finish_reason == b.finish_reason, f"row {i}"
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-6, rtol=0)


def test_blocks_are_freed_and_memory_follows_the_tokens(model, stops):
    dec = _decoder(model, 6, 4)
    seeds = list(range(len(PROMPTS)))
    out = run_decoder(dec, PROMPTS, seeds, N_NEW, stops)
    c = dec.cache
    st = c.stats()
    assert st["blocks_in_use"] == 0 and sorted(c.free) == list(range(1, c.num_blocks))  # all back (0: null block)
    assert all(r == 0 for r in c.ref) and not any(c.blocks) and int(c.table.abs().sum()) == 0
    # Static: every slot holds the longest sequence. Paged: at most what the live rows have written.
    per_token = c.block_bytes // c.bs
    static_bytes = dec.slots * dec.capacity * per_token
    assert 0 < st["peak_bytes"] < static_bytes / 2
    written = max(len(p) for p in PROMPTS) + max(len(o.tokens) for o in out)
    assert st["peak_blocks"] <= dec.slots * -(-written // c.bs)
    with pytest.raises(ValueError, match="paged"):
        PagedDecoder(model, 2, 16, SamplingParams(0.0, 0, 1.0), "graphs")


def test_a_groups_prompt_is_stored_once(model):
    bs, n, prompt = 8, 8, list(range(30, 67))  # 37 tokens: 4 full blocks + 5 tokens
    dec = _decoder(model, n, bs, capacity=64)
    toks, _ = dec.prefill(list(range(n)), [prompt] * n, list(range(n)))
    c = dec.cache
    assert c.in_use == 4 + n  # the full blocks once, one partial block per row (its own tokens go there)
    assert len({tuple(b[:4]) for b in c.blocks}) == 1 and len({b[4] for b in c.blocks}) == n
    # Each row's copy of the partial block holds the prompt's keys, as a lone prefill writes them.
    alone = _decoder(model, 1, bs, capacity=64)
    alone_toks, _ = alone.prefill([0], [prompt], [0])
    for layer in range(model.args.n_layers):
        ref = alone.cache.k[layer][alone.cache.blocks[0]]
        for s in range(n):
            torch.testing.assert_close(c.k[layer][c.blocks[s]][:, :, :], ref, atol=0, rtol=0)
    assert toks == alone_toks * n
    dec.release(list(range(n // 2)))
    assert c.in_use == 4 + n // 2  # shared blocks stay while any row holds them
    dec.release(list(range(n // 2, n)))
    assert c.in_use == 0


def test_options_are_checked():
    m = Transformer(ModelArgs(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16))
    with pytest.raises(ValueError, match="kv_cache"):
        generate(m, [[1]], 2, kv_cache="ring")
    with pytest.raises(ValueError, match="block_size"):
        generate(m, [[1]], 2, kv_cache="paged", block_size=0)
    with pytest.raises(ConfigError, match="generation.kv_cache"):
        from_dict({"generation": {"kv_cache": "ring"}})
    with pytest.raises(ConfigError, match="generation.block_size"):
        from_dict({"generation": {"block_size": 0}})
    assert from_dict({"generation": {"kv_cache": "paged", "block_size": 32}}).generation.block_size == 32
