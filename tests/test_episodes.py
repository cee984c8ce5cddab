"""Multi-turn episodes (elastic/generation/episodes.py): a turn continued from the episode's KV
cache slot (only the feedback prefilled) gives the tokens and log-probabilities of a fresh
single-turn generate() over the whole history with the turn's seed; episodes of different lengths
and turn counts share a batch; the total bound ends an episode with "length"; the spans rebuild
the sequence. Tiny random model (sharpened weights, as tests/test_generate_engine.py), CPU fp32."""

import pytest
import torch

from elastic.generation.episodes import EpisodeBatch, generate_turns, turn_seed
from elastic.generation.generate import generate
from elastic.model import ModelArgs, Transformer

PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99], [250], [3, 1, 4, 1, 5, 9, 2]]
FEEDBACK = [[1, 2, 3], [200, 201], [9, 8, 7, 6, 5, 4], [77]]
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95)
N_NEW = 12


@pytest.fixture(scope="module")
def model():
    m = Transformer(ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                              max_seq_len=128))
    m.init_weights(seed=3)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return m.eval()


def _fb(i, turn, completion):
    return [t + turn for t in FEEDBACK[i]]


def _check_spans(e, prompt):
    """Prompt, then policy and feedback spans alternating, tile the sequence exactly."""
    assert e.tokens[:e.prompt_len] == prompt
    pieces, at = [], e.prompt_len
    for t, (a, b) in enumerate(e.policy_spans):
        assert a == at and b > a and len(e.logprobs[t]) == b - a
        at = b
        if t < len(e.feedback_spans):
            fa, fb = e.feedback_spans[t]
            assert fa == at
            at = fb
    assert at == len(e.tokens)
    assert len(e.feedback_spans) == e.turns - 1
    mask = e.loss_mask()
    assert sum(mask) == sum(b - a for a, b in e.policy_spans)


@pytest.mark.parametrize("mode", ["eager", "fixed"])
@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_continuation_equals_full_reprefill(model, mode, sampling):
    kw = SAMPLED if sampling == "sampled" else {}
    seeds = [11, 12, 13, 14]
    eps = generate_turns(model, PROMPTS, N_NEW, 3, _fb, max_total_tokens=128, seed=seeds, mode=mode, **kw)
    for i, e in enumerate(eps):
        _check_spans(e, PROMPTS[i])
        assert e.turns == 3 and e.finish_reason == "turns"
        for t in range(3):
            history = e.tokens[:e.policy_spans[t][0]]
            ref = generate(model, [history], N_NEW, seed=[turn_seed(seeds[i], t)], mode="eager", **kw)[0]
            got = e.turn(t)
            assert got.tokens == ref.tokens, f"episode {i} turn {t}"
            assert got.finish_reason == ref.finish_reason
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-5, rtol=0)
        for t in range(2):
            fa, fb = e.feedback_spans[t]
            assert e.tokens[fa:fb] == _fb(i, t, None)


def test_mixed_lengths_and_turn_counts(model):
    """Episode 0 stops after turn 0, episode 2 after turn 1, the others run 3 turns; episode 1
    answers with a stop token early. Each equals the same episode run alone."""
    stop = [generate(model, [PROMPTS[1]], N_NEW, seed=[6], **SAMPLED)[0].tokens[3]]  # ends episode 1's answer 0 early

    def fb(i, turn, c):
        if i == 0 or (i == 2 and turn == 1):
            return None
        return _fb(i, turn, c)

    kw = dict(max_total_tokens=128, stop_token_ids=stop, seed=5, **SAMPLED)
    eps = generate_turns(model, PROMPTS, N_NEW, 3, fb, mode="eager", **kw)
    assert [e.turns for e in eps] == [1, 3, 2, 3]
    assert [e.finish_reason for e in eps] == ["done", "turns", "done", "turns"]
    assert eps[1].finish_reasons[0] == "stop" and eps[1].turns == 3
    for i, e in enumerate(eps):
        _check_spans(e, PROMPTS[i])
        alone = generate_turns(model, [PROMPTS[i]], N_NEW, 3, lambda _, t, c: fb(i, t, c), mode="eager",
                               **dict(kw, seed=[5 + i]))[0]
        assert alone.tokens == e.tokens and alone.policy_spans == e.policy_spans
        torch.testing.assert_close(torch.tensor(sum(alone.logprobs, [])), torch.tensor(sum(e.logprobs, [])),
                                   atol=1e-5, rtol=0)


def test_feedback_arrives_out_of_round(model):
    """The session API: episode 1's feedback comes a round late; the others go on meanwhile, and
    every episode still equals its single-turn re-prefill."""
    b = EpisodeBatch(model, PROMPTS[:3], N_NEW, max_total_tokens=128, seed=[1, 2, 3], mode="eager", **SAMPLED)
    assert b.decode() == [0, 1, 2] and b.idle() == [0, 1, 2]
    b.extend(0, FEEDBACK[0])
    b.extend(2, FEEDBACK[2])
    assert b.decode() == [0, 2]
    b.extend(1, FEEDBACK[1])
    b.extend(2, FEEDBACK[2])
    assert b.decode() == [1, 2]
    assert [e.turns for e in b.episodes] == [2, 2, 3]
    for i, e in enumerate(b.episodes):
        _check_spans(e, PROMPTS[i])
        for t in range(e.turns):
            ref = generate(model, [e.tokens[:e.policy_spans[t][0]]], N_NEW, seed=[turn_seed(i + 1, t)], mode="eager",
                           **SAMPLED)[0]
            assert e.turn(t).tokens == ref.tokens


def test_overflow_ends_with_length(model):
    # Prompt 3 (7 tokens) + 12 + 1 feedback + ...: a bound of 30 is reached inside turn 1.
    eps = generate_turns(model, [PROMPTS[3]], N_NEW, 5, lambda i, t, c: [77], max_total_tokens=30, mode="eager")
    e = eps[0]
    _check_spans(e, PROMPTS[3])
    assert len(e.tokens) == 30 and e.finish_reason == "length" and e.finish_reasons[-1] == "length"
    assert len(e.turn(e.turns - 1).tokens) < N_NEW
    # Feedback that does not fit (with room for one answer token) is not appended.
    eps = generate_turns(model, [PROMPTS[3]], N_NEW, 3, lambda i, t, c: [1] * 20, max_total_tokens=30, mode="eager")
    e = eps[0]
    assert e.turns == 1 and e.feedback_spans == [] and e.finish_reason == "length" and len(e.tokens) == 7 + N_NEW
