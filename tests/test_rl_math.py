"""GRPO math (elastic/rl): hand-computed values on toy batches, and split invariance.

Expected numbers are written out with the arithmetic that produces them, never obtained from
the function under test. The split-invariance tests compare the sum of per-micro-batch loss
shares (and their gradients) with the full-batch loss written independently in the textbook way.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from elastic.config import ConfigError, load_config
from elastic.config import load as config_load
from elastic.rl.algorithms import (ADV_NORMS, KL_ESTIMATORS, LOSS_AGGS, STAT_KEYS, StepCounts, add_stats,
                                   clipped_objective, group_advantages, grpo_loss, kl_per_token, overlong_penalty,
                                   stats_to_tensor, step_counts, summarize, tensor_to_stats, token_entropy,
                                   token_logprobs, token_weights, weight_negatives, zero_variance_groups)
from elastic.rl.seeds import rollout_seed
from elastic.rl.split import split_problems
from tests.conftest import REPO

EPS = 1e-6  # elastic.rl.algorithms.advantages.EPS

# --------------------------------------------------------------------------------------------
# advantages


REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0],
                        [0.5, 0.5, 0.5, 0.5],
                        [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
# row 0: mean 0.5, deviations +-0.5; unbiased var = 4 * 0.25 / (4 - 1) = 1/3
S0 = math.sqrt(1 / 3)  # 0.57735...
# row 1: all equal: deviations 0, std 0 -> advantage 0 / (0 + eps) = 0
# row 2: mean 0.25, deviations [-0.25, -0.25, -0.25, 0.75];
#        unbiased var = (3 * 0.0625 + 0.5625) / 3 = 0.25 -> std 0.5
S2 = 0.5
ADV_GROUP_STD = [[0.5 / (S0 + EPS), -0.5 / (S0 + EPS), -0.5 / (S0 + EPS), 0.5 / (S0 + EPS)],
                 [0.0, 0.0, 0.0, 0.0],
                 [-0.25 / (S2 + EPS), -0.25 / (S2 + EPS), -0.25 / (S2 + EPS), 0.75 / (S2 + EPS)]]
ADV_NONE = [[0.5, -0.5, -0.5, 0.5],
            [0.0, 0.0, 0.0, 0.0],
            [-0.25, -0.25, -0.25, 0.75]]


def test_group_std_advantages_use_the_unbiased_std():
    a = group_advantages(REWARDS, "group_std")
    assert torch.allclose(a, torch.tensor(ADV_GROUP_STD, dtype=torch.float64), rtol=0, atol=1e-12)
    # The population std (divide by G) would give +-0.5 / 0.5 = +-1 in row 0: not what we use.
    assert abs(float(a[0, 0]) - 1.0) > 0.1


def test_no_std_advantages_only_center_the_group():
    a = group_advantages(REWARDS, "none")
    assert torch.allclose(a, torch.tensor(ADV_NONE, dtype=torch.float64), rtol=0, atol=1e-15)


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="adv_norm"):
        group_advantages(REWARDS, "rank")
    with pytest.raises(ValueError, match="group_size 1"):
        group_advantages(torch.ones(3, 1), "none")
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[1.0, float("nan")]]), "group_std")


def test_negative_advantages_are_weighted_and_positive_ones_kept():
    # group rewards [1, 0, 0, 0.5]: centred [0.625, -0.375, -0.375, 0.125]
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.5]], dtype=torch.float64), "none")
    w = weight_negatives(a, 0.1)
    assert torch.allclose(w, torch.tensor([[0.625, -0.0375, -0.0375, 0.125]], dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(weight_negatives(a, 1.0), a)
    assert torch.equal(weight_negatives(a, 0.0), torch.tensor([[0.625, 0.0, 0.0, 0.125]], dtype=torch.float64))
    with pytest.raises(ValueError, match="negative_weight"):
        weight_negatives(a, 1.5)


def test_zero_variance_groups():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0],     # varies
                      [0.5, 0.5, 0.5, 0.5],     # all equal
                      [0.0, 0.0, 0.0, 0.0],     # all failed: all equal
                      [0.3, 0.3, 0.3, 0.3 + 1e-7]], dtype=torch.float64)  # a tiny real difference is signal
    zv = zero_variance_groups(r)
    assert zv.tolist() == [False, True, True, False]
    assert float(zv.double().mean()) == 0.5  # the fraction the step reports: 2 of 4 groups


# --------------------------------------------------------------------------------------------
# clipped objective

CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # ratio clipped to [0.8, 1.28]
RATIOS = [[1.5, 0.5, 1.1],
          [0.5, 1.5, 0.3]]
ADV = [2.0, -1.0]
MASK = [[1, 1, 1],
        [1, 1, 0]]
# per token: -min(r A, clip(r, 0.8, 1.28) A)
# seq 0, A = +2: r=1.5 -> -min(3.0, 2.56) = -2.56 (clipped, high side)
#                r=0.5 -> -min(1.0, 1.6)  = -1.0
#                r=1.1 -> -min(2.2, 2.2)  = -2.2
# seq 1, A = -1: r=0.5 -> -min(-0.5, -0.8) = 0.8 (clipped, low side)
#                r=1.5 -> -min(-1.5, -1.28) = 1.5 (not clipped: the min keeps the worse value)
#                r=0.3 -> -min(-0.3, -0.8) = 0.8 (clipped low, but masked out)
TOKEN_LOSS = [[-2.56, -1.0, -2.2],
              [0.8, 1.5, 0.8]]
# masked sum = -2.56 - 1.0 - 2.2 + 0.8 + 1.5 = -3.46 over 5 tokens, 2 sequences
LOSS_TOKEN_MEAN = -3.46 / 5  # -0.692
LOSS_SEQ_MEAN_TOKEN_MEAN = ((-2.56 - 1.0 - 2.2) / 3 + (0.8 + 1.5) / 2) / 2  # (-1.92 + 1.15) / 2 = -0.385
MAX_NEW = 4
LOSS_DR_GRPO = -3.46 / (2 * MAX_NEW)  # -0.4325
# d loss / d logp for token_mean: unclipped tokens -A r / 5, clipped tokens 0, masked 0
GRAD_TOKEN_MEAN = [[0.0, -2.0 * 0.5 / 5, -2.0 * 1.1 / 5],
                   [0.0, 1.0 * 1.5 / 5, 0.0]]


def _toy(dtype=torch.float64):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.5, -2.5]], dtype=dtype)
    logp = (old + torch.log(torch.tensor(RATIOS, dtype=dtype))).requires_grad_(True)
    return logp, old, torch.tensor(ADV, dtype=dtype), torch.tensor(MASK, dtype=dtype)


def test_clipped_objective_per_token_and_both_clip_sides():
    logp, old, adv, _ = _toy()
    obj = clipped_objective(logp, old, adv, CLIP_LOW, CLIP_HIGH)
    assert torch.allclose(obj.loss, torch.tensor(TOKEN_LOSS, dtype=torch.float64), atol=1e-12)
    assert obj.clipped_low.tolist() == [[False, False, False], [True, False, True]]
    assert obj.clipped_high.tolist() == [[True, False, False], [False, False, False]]


@pytest.mark.parametrize("loss_agg, expected", [
    ("token_mean", LOSS_TOKEN_MEAN),
    ("seq_mean_token_mean", LOSS_SEQ_MEAN_TOKEN_MEAN),
    ("seq_mean_token_sum_norm", LOSS_DR_GRPO),
])
def test_loss_aggregations_on_the_toy_batch(loss_agg, expected):
    logp, old, adv, mask = _toy()
    counts = StepCounts(sequences=2, tokens=5, max_new_tokens=MAX_NEW)
    loss, stats = grpo_loss(logp, old, adv, mask, loss_agg=loss_agg, counts=counts, clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    assert abs(float(loss.detach()) - expected) < 1e-12
    s = summarize(stats)
    assert s["tokens"] == 5 and s["sequences"] == 2
    assert s["clip_low_frac"] == pytest.approx(1 / 5) and s["clip_high_frac"] == pytest.approx(1 / 5)
    assert s["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5)
    assert s["kl_loss"] == 0.0 and s["pg_loss"] == pytest.approx(expected)
    if loss_agg == "token_mean":
        loss.backward()
        assert torch.allclose(logp.grad, torch.tensor(GRAD_TOKEN_MEAN, dtype=torch.float64), atol=1e-12)


def test_step_counts_skip_filtered_rows():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert step_counts(mask) == {"sequences": 2, "tokens": 3}
    with pytest.raises(ValueError, match="at least one"):
        StepCounts(sequences=0, tokens=0, max_new_tokens=4)


# --------------------------------------------------------------------------------------------
# KL estimators

LOG2 = math.log(2.0)
# token a: logp = log 0.5, ref = log 0.25  -> ref - logp = -log 2
# token b: logp = log 0.25, ref = log 0.5  -> ref - logp = +log 2
KL_EXPECTED = {
    "k1": [LOG2, -LOG2],                                 # logp - ref
    "k2": [0.5 * LOG2 ** 2, 0.5 * LOG2 ** 2],             # (logp - ref)^2 / 2 = 0.2402...
    "k3": [0.5 + LOG2 - 1.0, 2.0 - LOG2 - 1.0],           # e^(ref-logp) - (ref-logp) - 1 = 0.1931..., 0.3068...
}


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_estimators(est):
    logp = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    assert torch.allclose(kl_per_token(logp, ref, est), torch.tensor([KL_EXPECTED[est]], dtype=torch.float64), atol=1e-15)
    assert float(kl_per_token(ref, ref, est).abs().max()) == 0.0  # identical policies: 0


@pytest.mark.parametrize("est, expected", [
    # ratio 1 and advantage 0: the policy term is 0, the loss is kl_coef * mean KL over 2 tokens
    ("k3", 0.1 * ((0.5 + LOG2 - 1.0) + (2.0 - LOG2 - 1.0)) / 2),  # 0.1 * 0.5 / 2 = 0.025
    ("k1", 0.1 * (LOG2 - LOG2) / 2),                               # 0
])
def test_kl_term_in_the_loss(est, expected):
    logp = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64)).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    loss, stats = grpo_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 2),
                            loss_agg="token_mean", counts=StepCounts(1, 2, 4), clip_low=0.2, clip_high=0.28,
                            ref_logp=ref, kl_coef=0.1, kl_estimator=est)
    assert abs(float(loss.detach()) - expected) < 1e-15
    assert float(stats["kl_loss"]) == pytest.approx(expected, abs=1e-15)
    assert summarize(stats)["kl_mean"] == pytest.approx(sum(KL_EXPECTED[est]) / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), loss_agg="token_mean",
                  counts=StepCounts(1, 2, 4), clip_low=0.2, clip_high=0.28, kl_coef=0.1)


# --------------------------------------------------------------------------------------------
# overlong penalty

def test_overlong_penalty():
    # max_new_tokens M = 10, buffer B = 4: the ramp starts after M - B = 6 tokens
    lengths = torch.tensor([5, 6, 7, 9, 10, 10])
    truncated = torch.tensor([False, False, False, False, False, True])
    expected = [0.0,                # 5 <= 6
                0.0,                # 6 <= 6
                -(7 - 6) / 4,       # -0.25
                -(9 - 6) / 4,       # -0.75
                -1.0,               # stopped exactly at the budget: the whole soft penalty
                -1.0 - 0.5]         # truncated: soft penalty + truncation_penalty 0.5
    got = overlong_penalty(lengths, truncated, max_new_tokens=10, buffer=4, overlong_penalty=1.0, truncation_penalty=0.5)
    assert got.tolist() == expected
    # off by default: both magnitudes 0 -> no change to any reward
    assert overlong_penalty(lengths, truncated, 10, 4, 0.0, 0.0).abs().max() == 0
    # the soft part scales with overlong_penalty: 9 tokens -> -0.5 * 3 / 4
    assert overlong_penalty(torch.tensor([9]), torch.tensor([False]), 10, 4, 0.5).tolist() == [-0.375]
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([11]), torch.tensor([True]), 10, 4, 1.0)


# --------------------------------------------------------------------------------------------
# split invariance: micro-batch shares with step-wide normalisers add up to the full-batch loss

B, T, V = 8, 6, 11


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([6, 1, 4, 6, 2, 5, 3, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[3] = 0  # a completion of a zero-variance group, filtered out of the step
    old = torch.log_softmax(base, -1).gather(-1, tokens[..., None]).squeeze(-1) + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    theta0 = 0.5 * torch.randn(T, V, generator=g, dtype=torch.float64)
    return base, tokens, mask, old, ref, adv, theta0


def _reference_full_loss(logp, old, ref, adv, mask, loss_agg, kl_coef):
    """The full-batch loss written directly from the formulas (no weights, no elastic.rl)."""
    r = torch.exp(logp - old)
    a = adv[:, None]
    tok = -torch.minimum(r * a, r.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * a)
    tok = tok + kl_coef * (torch.exp(ref - logp) - (ref - logp) - 1)  # k3
    keep = mask.sum(-1) > 0
    if loss_agg == "token_mean":
        return (tok * mask).sum() / mask.sum()
    if loss_agg == "seq_mean_token_mean":
        per_seq = (tok * mask).sum(-1)[keep] / mask.sum(-1)[keep]
        return per_seq.mean()
    return (tok * mask).sum() / (keep.sum() * MAX_NEW)


# How one step's 8 completions may be laid out: one process; 2 ranks x 2 micro-batches;
# 3 uneven ranks with 1-3 micro-batches (what zero-variance filtering leaves).
LAYOUTS = {
    "one": [[list(range(8))]],
    "2x2": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    "uneven": [[[0], [1, 2]], [[3, 4, 5]], [[6], [7], []]],
}


@pytest.mark.parametrize("loss_agg", sorted(LOSS_AGGS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_micro_batch_shares_add_up_to_the_full_batch_loss_and_gradient(loss_agg, layout):
    base, tokens, mask, old, ref, adv, theta0 = _batch()
    kl_coef = 0.05

    # full batch, written independently
    theta_ref = theta0.clone().requires_grad_(True)
    logp_full = torch.log_softmax(base + theta_ref, -1).gather(-1, tokens[..., None]).squeeze(-1)
    want = _reference_full_loss(logp_full, old, ref, adv, mask, loss_agg, kl_coef)
    want.backward()
    want = want.detach()

    # the step's counts, as every rank knows them (here: the sum of each rank's step_counts)
    parts = [step_counts(mask[sum(rank, [])]) for rank in LAYOUTS[layout] if sum(rank, [])]
    counts = StepCounts(sequences=sum(p["sequences"] for p in parts), tokens=sum(p["tokens"] for p in parts),
                        max_new_tokens=MAX_NEW)
    assert (counts.sequences, counts.tokens) == (7, 27)  # 8 completions minus the filtered one; 33 - 6 tokens

    theta = theta0.clone().requires_grad_(True)
    total, stats = torch.zeros((), dtype=torch.float64), None
    for rank in LAYOUTS[layout]:
        for idx in rank:
            if not idx:
                continue
            i = torch.tensor(idx)
            logp = token_logprobs(base[i] + theta, tokens[i], chunk_tokens=4)
            loss, st = grpo_loss(logp, old[i], adv[i], mask[i], loss_agg=loss_agg, counts=counts,
                                 clip_low=CLIP_LOW, clip_high=CLIP_HIGH, ref_logp=ref[i], kl_coef=kl_coef,
                                 kl_estimator="k3")
            loss.backward()  # gradient accumulation, as over micro-batches and (summed) ranks
            total = total + loss.detach()
            stats = st if stats is None else add_stats(stats, st)

    assert abs(float(total) - float(want)) < 1e-12, (float(total), float(want))
    assert torch.allclose(theta.grad, theta_ref.grad, rtol=1e-10, atol=1e-13)
    assert float(theta.grad.abs().sum()) > 0
    assert float(stats["loss"]) == pytest.approx(float(want), abs=1e-12)
    assert float(stats["tokens"]) == 27 and float(stats["sequences"]) == 7


def test_stats_round_trip_and_grad_scale():
    logp, old, adv, mask = _toy()
    counts = StepCounts(2, 5, MAX_NEW)
    loss1, st1 = grpo_loss(logp, old, adv, mask, loss_agg="token_mean", counts=counts, clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    loss2, st2 = grpo_loss(logp, old, adv, mask, loss_agg="token_mean", counts=counts, clip_low=CLIP_LOW,
                           clip_high=CLIP_HIGH, grad_scale=2.0)
    assert float(loss2.detach()) == pytest.approx(2 * float(loss1.detach()))  # world size for FSDP's gradient average
    assert float(st2["loss"]) == pytest.approx(float(st1["loss"]))  # statistics are never scaled
    t = stats_to_tensor(st1)
    assert t.shape == (len(STAT_KEYS),) and t.dtype == torch.float64
    assert {k: float(v) for k, v in tensor_to_stats(t).items()} == {k: float(v) for k, v in st1.items()}


# --------------------------------------------------------------------------------------------
# log-probs and entropy

def _naive_logp(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits / temperature, -1).gather(-1, tokens[..., None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_log_softmax_values_and_gradients(temperature):
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(2, 5, 13, generator=g, dtype=torch.float64)).requires_grad_(True)
    tok = torch.randint(0, 13, (2, 5), generator=g)
    w = torch.randn(2, 5, generator=g, dtype=torch.float64)
    got = token_logprobs(x, tok, temperature=temperature, chunk_tokens=3)  # 10 rows in chunks of 3, 3, 3, 1
    (got * w).sum().backward()
    g_got = x.grad.clone()
    x.grad = None
    want = _naive_logp(x, tok, temperature)
    (want * w).sum().backward()
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(g_got, x.grad, atol=1e-12)
    torch.autograd.gradcheck(lambda z: token_logprobs(z, tok, temperature, chunk_tokens=4), (x.detach().clone().requires_grad_(True),))


def test_token_logprobs_of_bf16_logits_are_float32():
    g = torch.Generator().manual_seed(2)
    x = (4 * torch.randn(3, 7, 50, generator=g)).to(torch.bfloat16).requires_grad_(True)
    tok = torch.randint(0, 50, (3, 7), generator=g)
    got = token_logprobs(x, tok, chunk_tokens=5)
    assert got.dtype == torch.float32
    want = _naive_logp(x.detach().double(), tok)  # the exact log-probs of the same bf16 logits
    assert float((got.detach().double() - want).abs().max()) < 1e-5  # float32 accuracy, not bf16 (~1e-2)
    got.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape


def test_token_entropy():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 9, dtype=torch.float64, generator=g)
    p = torch.softmax(x, -1)
    want = -(p * torch.log(p)).sum(-1)
    assert torch.allclose(token_entropy(x, chunk_tokens=3), want, atol=1e-12)
    # uniform over 4 tokens: log 4; a masked-out (-inf) logit contributes 0, not NaN
    u = torch.tensor([[0.0, 0.0, 0.0, 0.0, float("-inf")]])
    assert token_entropy(u).tolist() == pytest.approx([math.log(4)])


# --------------------------------------------------------------------------------------------
# registries, seeds, problem split

def test_config_names_match_the_registries():
    assert set(config_load.RL_ADV_NORMS) == set(ADV_NORMS)
    assert set(config_load.RL_KL_ESTIMATORS) == set(KL_ESTIMATORS)
    assert set(config_load.RL_LOSS_AGGS) == set(LOSS_AGGS)
    with pytest.raises(ValueError, match="loss_agg"):
        token_weights(torch.ones(1, 2), "sum", StepCounts(1, 2, 4))


def test_rollout_seeds_depend_only_on_coordinates():
    seeds = {rollout_seed(0, s, p, k) for s in range(3) for p in range(4) for k in range(4)}
    assert len(seeds) == 48 and all(0 <= x < 2 ** 63 for x in seeds)
    assert rollout_seed(1, 0, 0, 0) != rollout_seed(0, 0, 0, 0)
    # the same in a fresh process with another hash seed (no reliance on Python's salted hash)
    code = "from elastic.rl.seeds import rollout_seed; print(rollout_seed(7, 3, 2, 1))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == rollout_seed(7, 3, 2, 1)


def test_problem_split():
    s = split_problems(["c", "a", "b", "d"], ["d", "b"])
    assert s.train == ("a", "c") and s.heldout == ("d", "b")
    with pytest.raises(ConfigError) as ei:
        split_problems(["a", "b"], ["x"])
    assert str(ei.value).startswith("rl.heldout:") and "'x'" in str(ei.value)
    with pytest.raises(ConfigError, match="nothing is left"):
        split_problems(["a"], ["a"])


def test_default_heldout_ids_are_shipped_problems():
    cfg = load_config(None, job="grpo")
    root = REPO / cfg.rl.problems
    shipped = [p.name for p in root.iterdir() if (p / "problem.yaml").is_file()]
    s = split_problems(shipped, cfg.rl.heldout)
    assert len(s.heldout) == 5 and len(s.train) == len(shipped) - 5


# --------------------------------------------------------------------------------------------
# dual-clip PPO (rl.clip_ratio_c), checked by hand and against a transcription of verl

C = 3.0  # verl's default clip_ratio_c
# clip range [0.8, 1.28]; per token: max(-A r, -A clip(r)), then min(., -A c) where A < 0
DUAL_RATIOS = [[4.0, 2.5, 0.5, 5.0],
               [5.0, 1.1, 3.5, 0.9]]
DUAL_ADV = [[-1.0, -1.0, -1.0, -2.0],
            [2.0, 2.0, 0.0, -1.0]]
DUAL_TOKEN_LOSS = [[3.0,    # A=-1, r=4: max(4, 1.28) = 4, capped at -A c = 3 (dual)
                    2.5,    # A=-1, r=2.5: max(2.5, 1.28) = 2.5 < 3, unchanged
                    0.8,    # A=-1, r=0.5: max(0.5, 0.8) = 0.8 (low-side clip)
                    6.0],   # A=-2, r=5: max(10, 2.56) = 10, capped at 2 * 3 = 6 (dual)
                   [-2.56,  # A=+2, r=5: max(-10, -2.56) = -2.56; dual clip never touches A > 0
                    -2.2,   # A=+2, r=1.1: -2.2
                    0.0,    # A=0: 0 whatever r is
                    0.9]]   # A=-1, r=0.9: max(0.9, 0.9) = 0.9
DUAL_TOKEN_LOSS_OFF = [[4.0, 2.5, 0.8, 10.0], [-2.56, -2.2, 0.0, 0.9]]
# d loss / d logp = d/dlogp (-A r) = -A r on unclipped tokens, 0 on any clipped one
DUAL_GRAD = [[0.0, 2.5, 0.0, 0.0], [0.0, -2.2, 0.0, 0.9]]


def _dual_toy():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-2.5, -1.5, -4.0, -0.7]], dtype=torch.float64)
    logp = (old + torch.log(torch.tensor(DUAL_RATIOS, dtype=torch.float64))).requires_grad_(True)
    return logp, old, torch.tensor(DUAL_ADV, dtype=torch.float64)


def test_dual_clip_caps_negative_advantages_only():
    logp, old, adv = _dual_toy()
    obj = clipped_objective(logp, old, adv, CLIP_LOW, CLIP_HIGH, clip_ratio_c=C)
    assert torch.allclose(obj.loss, torch.tensor(DUAL_TOKEN_LOSS, dtype=torch.float64), rtol=0, atol=1e-12)
    assert obj.clipped_dual.tolist() == [[True, False, False, True], [False, False, False, False]]
    assert obj.clipped_low.tolist() == [[False, False, True, False], [False, False, False, False]]
    assert obj.clipped_high.tolist() == [[False, False, False, False], [True, False, False, False]]
    obj.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor(DUAL_GRAD, dtype=torch.float64), rtol=0, atol=1e-12)
    # off (the default): the plain clipped loss, no dual statistics
    off = clipped_objective(logp, old, adv, CLIP_LOW, CLIP_HIGH)
    assert torch.allclose(off.loss, torch.tensor(DUAL_TOKEN_LOSS_OFF, dtype=torch.float64), rtol=0, atol=1e-12)
    assert not bool(off.clipped_dual.any())
    for bad in (1.0, 0.5, -3.0):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            clipped_objective(logp, old, adv, CLIP_LOW, CLIP_HIGH, clip_ratio_c=bad)


def test_dual_clip_in_the_loss_and_its_statistics():
    logp, old, adv = _dual_toy()
    mask = torch.ones(2, 4, dtype=torch.float64)
    loss, stats = grpo_loss(logp, old, adv, mask, loss_agg="token_mean", counts=StepCounts(2, 8, MAX_NEW),
                            clip_low=CLIP_LOW, clip_high=CLIP_HIGH, clip_ratio_c=C)
    assert float(loss.detach()) == pytest.approx(sum(map(sum, DUAL_TOKEN_LOSS)) / 8, abs=1e-12)
    s = summarize(stats)
    assert s["clip_dual_frac"] == pytest.approx(2 / 8)
    assert s["clip_low_frac"] == pytest.approx(1 / 8) and s["clip_high_frac"] == pytest.approx(1 / 8)


def _verl_policy_loss_tokens(old_log_prob, log_prob, advantages, cliprange_low, cliprange_high, clip_ratio_c):
    """verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla, per token (before agg_loss),
    transcribed line by line."""
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return pg_losses, pg_clipfrac_lower


@pytest.mark.parametrize("c", [3.0, 1.5, 10.0])
def test_dual_clip_matches_verl_values_and_gradients(c):
    g = torch.Generator().manual_seed(7)
    old = -3 * torch.rand(16, 32, generator=g, dtype=torch.float64)
    delta = 1.5 * torch.randn(16, 32, generator=g, dtype=torch.float64)  # ratios from ~e^-5 to ~e^5
    adv = torch.randn(16, generator=g, dtype=torch.float64)
    adv[3] = 0.0
    logp_a = (old + delta).requires_grad_(True)
    logp_b = (old + delta).requires_grad_(True)
    ours = clipped_objective(logp_a, old, adv, 0.2, 0.28, clip_ratio_c=c)
    want, want_dual = _verl_policy_loss_tokens(old, logp_b, adv[:, None], 0.2, 0.28, c)
    assert torch.allclose(ours.loss, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(ours.clipped_dual.double(), want_dual.double())
    assert bool(ours.clipped_dual.any())  # the random data exercises the cap
    ours.loss.sum().backward()
    want.sum().backward()
    assert torch.allclose(logp_a.grad, logp_b.grad, rtol=1e-12, atol=1e-12)
    # dual clip off equals verl with an unreachable bound
    off = clipped_objective(logp_a.detach(), old, adv, 0.2, 0.28)
    far, _ = _verl_policy_loss_tokens(old, logp_a.detach(), adv[:, None], 0.2, 0.28, 1e30)
    assert torch.allclose(off.loss, far, rtol=1e-12, atol=1e-12)


def test_clip_ratio_c_config_default_off_and_verl_value_accepted():
    assert load_config(None, [], job="grpo").rl.clip_ratio_c == 0.0
    assert load_config(None, ["rl.clip_ratio_c=3.0"], job="grpo").rl.clip_ratio_c == 3.0
    with pytest.raises(ConfigError, match="rl.clip_ratio_c"):
        load_config(None, ["rl.clip_ratio_c=1.0"], job="grpo")


# --------------------------------------------------------------------------------------------
# k3 clamp (verl's low_var_kl: the per-token value is clamped to [-10, 10])

def _verl_low_var_kl(logprob, ref_logprob):
    """verl/trainer/ppo/core_algos.py kl_penalty(..., "low_var_kl"), transcribed."""
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


def test_k3_is_clamped_to_ten_like_verl():
    # ref - logp:      0    1             2.5                3 (e^3-4 = 16.09)  -12 (11 + e^-12)  25 (clamped to 20 first)
    logr = torch.tensor([0.0, 1.0, 2.5, 3.0, -12.0, 25.0], dtype=torch.float64)
    logp = torch.full_like(logr, -1.0).requires_grad_(True)
    ref = logp.detach() + logr
    k = kl_per_token(logp, ref, "k3")
    want = [0.0, math.e - 2.0, math.exp(2.5) - 3.5, 10.0, 10.0, 10.0]
    assert k.tolist() == pytest.approx(want, abs=1e-12)
    assert torch.allclose(k, _verl_low_var_kl(logp.detach(), ref), rtol=0, atol=1e-12)
    k.sum().backward()
    # d k3 / d logp = 1 - e^(ref - logp) where unclamped, 0 where the clamp binds (as in verl)
    assert logp.grad.tolist() == pytest.approx([0.0, 1 - math.e, 1 - math.exp(2.5), 0.0, 0.0, 0.0], abs=1e-12)
    # k1 and k2 are not clamped (neither are they in verl)
    assert float(kl_per_token(logp.detach(), ref, "k2")[3]) == pytest.approx(4.5)
    g = torch.Generator().manual_seed(3)
    a, b = 4 * torch.randn(50, generator=g, dtype=torch.float64), 4 * torch.randn(50, generator=g, dtype=torch.float64)
    assert torch.allclose(kl_per_token(a, b, "k3"), _verl_low_var_kl(a, b), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# NaN / inf on masked tokens never reaches the loss, the gradient or the statistics

@pytest.mark.parametrize("loss_agg", sorted(LOSS_AGGS))
@pytest.mark.parametrize("clip_ratio_c", [0.0, 3.0])
def test_non_finite_values_on_masked_tokens_are_ignored(loss_agg, clip_ratio_c):
    base, tokens, mask, old, ref, adv, theta0 = _batch()
    counts = StepCounts(**step_counts(mask), max_new_tokens=MAX_NEW)
    masked = mask == 0
    assert bool(masked.any()) and bool(masked[3].all())  # padding and a filtered-out row
    ent = torch.rand(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def run(fill):
        """fill(x) puts its values at the masked positions of x."""
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(base + theta, -1).gather(-1, tokens[..., None]).squeeze(-1)
        loss, st = grpo_loss(fill(logp), fill(old), adv, mask, loss_agg=loss_agg, counts=counts,
                             clip_low=CLIP_LOW, clip_high=CLIP_HIGH, clip_ratio_c=clip_ratio_c,
                             ref_logp=fill(ref), kl_coef=0.05, kl_estimator="k3", entropy=fill(ent))
        loss.backward()
        return loss.detach(), theta.grad, st

    def garbage(values):
        v = torch.tensor(values, dtype=torch.float64).repeat(B * T)[: B * T].view(B, T)
        return lambda x: torch.where(masked, v, x)

    finite = run(garbage([-7.0, 3.0, 0.25]))  # finite garbage: what masking must make irrelevant
    for bad in ([float("nan")], [float("inf")], [float("-inf")], [float("nan"), float("inf"), float("-inf")]):
        loss, grad, st = run(garbage(bad))
        assert math.isfinite(float(loss)) and bool(torch.isfinite(grad).all())
        assert float(loss) == float(finite[0])
        assert torch.equal(grad, finite[1])
        for k in STAT_KEYS:
            assert math.isfinite(float(st[k])) and float(st[k]) == float(finite[2][k]), k
    # advantages of a filtered row may be garbage too
    adv_nan = adv.clone()
    adv_nan[3] = float("nan")
    loss, _ = grpo_loss(old.clone(), old, adv_nan, mask, loss_agg=loss_agg, counts=counts, clip_low=CLIP_LOW,
                        clip_high=CLIP_HIGH, clip_ratio_c=clip_ratio_c)
    assert math.isfinite(float(loss))
    # a NaN on a kept token still propagates (the step guard skips that step)
    bad_logp = old.clone()
    bad_logp[0, 0] = float("nan")
    loss, _ = grpo_loss(bad_logp, old, adv, mask, loss_agg=loss_agg, counts=counts, clip_low=CLIP_LOW,
                        clip_high=CLIP_HIGH)
    assert math.isnan(float(loss))


def test_masked_nan_made_the_old_loss_nan():
    """Why the torch.where matters: a mask multiply alone turns a masked NaN into a NaN loss."""
    logp = torch.tensor([[-1.0, float("nan")]])
    mask = torch.tensor([[1.0, 0.0]])
    assert math.isnan(float((logp * mask).sum()))
    loss, _ = grpo_loss(logp, torch.tensor([[-1.0, -1.0]]), torch.tensor([1.0]), mask, loss_agg="token_mean",
                        counts=StepCounts(1, 1, 4), clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    assert float(loss) == -1.0  # ratio 1, A = 1, one token: -min(1, 1)


# --------------------------------------------------------------------------------------------
# a group of one sample is refused, at config time and in the advantage functions

def test_group_of_one_is_an_error_not_a_silent_advantage():
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["rl.group_size=1"], job="grpo")
    assert str(ei.value).startswith("rl.group_size: must be >= 2") and "\n" not in str(ei.value)
    for fn in (lambda r: group_advantages(r, "group_std"), lambda r: group_advantages(r, "none"), zero_variance_groups):
        with pytest.raises(ValueError, match="at least 2 samples"):
            fn(torch.tensor([[1.0], [0.0]]))
    # the smallest group, G = 2: +-0.5 / (std + eps) with the unbiased std |r1 - r2| / sqrt(2)
    a = group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64), "group_std")
    s = 1 / math.sqrt(2)
    assert a[0].tolist() == pytest.approx([0.5 / (s + EPS), -0.5 / (s + EPS)], abs=1e-12)
