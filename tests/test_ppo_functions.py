"""PPO-with-critic math (elastic/rl/algorithms/gae.py, value_loss.py, kl_controller.py): hand-computed values,
then agreement with verl's own functions.

Expected numbers are written out with the arithmetic that produces them, never obtained from the
function under test. Most inputs are dyadic (0.5, 0.25, ...) so the hand values are exact.

The "verl reference" section holds verbatim copies of verl's functions (verl itself is not
installed: its wheel depends on ray, tensordict and transformers>=5.5.3, which would pull a
different torch), from https://github.com/volcengine/verl at commit
b178a3cd56f58b2d502255daba591e92833930a7 (verl/trainer/ppo/core_algos.py,
verl/utils/torch_functional.py); these functions are identical in the released wheel verl 0.9.1.
The pre-#2337 GAE is from the parent of commit 0332866857d541f5bd4f46ee4d9bd782a6354aa3. Only the
``verl_F.`` prefix was dropped and ``agg_loss`` cut down to the modes compared.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elastic.config import ConfigError, load_config
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.gae import (gae_advantages_returns, last_token_index, masked_mean, masked_var, masked_whiten,
                            token_level_rewards)
from elastic.rl.algorithms.kl_controller import (AdaptiveKLController, FixedKLController, build_kl_controller,
                                      kl_controller_from_state_dict)
from elastic.rl.algorithms.value_loss import clipped_value_loss

F64 = torch.float64


def t64(x):
    return torch.tensor(x, dtype=F64)


def whiten_by_hand(xs):
    """Sample mean and unbiased (n - 1) std with the statistics module, verl's +1e-8 under the root."""
    mean = statistics.mean(xs)
    var = statistics.variance(xs)  # divides by n - 1
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


# --------------------------------------------------------------------------------------------
# GAE, 1 x 3, full mask. gamma = 0.5, lam = 0.5 (gamma * lam = 0.25).

GAMMA, LAM = 0.5, 0.5
R_1x3 = [[0.0, 0.0, 1.0]]
V_1x3 = [[0.5, 0.25, 0.5]]
# t=2: nextvalue 0:          delta = 1 + 0.5*0 - 0.5     = 0.5     A2 = 0.5
# t=1: nextvalue V2 = 0.5:   delta = 0 + 0.5*0.5 - 0.25  = 0       A1 = 0 + 0.25*0.5        = 0.125
# t=0: nextvalue V1 = 0.25:  delta = 0 + 0.5*0.25 - 0.5  = -0.375  A0 = -0.375 + 0.25*0.125 = -0.34375
A_1x3 = [-0.34375, 0.125, 0.5]
# returns = A + V (before whitening) = [-0.34375 + 0.5, 0.125 + 0.25, 0.5 + 0.5]
RET_1x3 = [[0.15625, 0.375, 1.0]]


def test_gae_1x3_by_hand():
    adv, ret = gae_advantages_returns(t64(R_1x3), t64(V_1x3), torch.ones(1, 3), GAMMA, LAM)
    assert torch.equal(ret, t64(RET_1x3))  # dyadic: exact
    # whitening: mean = (-0.34375 + 0.125 + 0.5) / 3 = 0.09375; deviations -0.4375, 0.03125, 0.40625;
    # squares sum 0.19140625 + 0.0009765625 + 0.1650390625 = 0.357421875; unbiased var = / 2 = 0.1787109375
    var = 0.357421875 / 2
    expected = [d / math.sqrt(var + 1e-8) for d in (-0.4375, 0.03125, 0.40625)]
    assert expected == pytest.approx(whiten_by_hand(A_1x3), abs=1e-15)
    assert torch.allclose(adv, t64([expected]), rtol=0, atol=1e-7)


# --------------------------------------------------------------------------------------------
# GAE, 2 x 4 with a mask. Row 0 is right-padded (garbage value 7.0 on the pad), row 1 has a hole at
# t=1 (an observation token in a multi-turn rollout, garbage value 3.0 there).

R_2x4 = [[0.0, 0.0, 1.0, 0.0],
         [0.0, 0.0, 0.0, 1.0]]
V_2x4 = [[0.5, 0.5, 0.25, 7.0],
         [0.5, 3.0, 0.5, 0.5]]
M_2x4 = [[1, 1, 1, 0],
         [1, 0, 1, 1]]
# skip_masked=True (verl main): a masked slot leaves nextvalue and lastgaelam as they were.
# row 0: t=3 masked: carry stays nextvalue 0, lastgaelam 0
#        t=2: delta = 1 + 0.5*0 - 0.25 = 0.75;        A2 = 0.75
#        t=1: delta = 0 + 0.5*0.25 - 0.5 = -0.375;    A1 = -0.375 + 0.25*0.75    = -0.1875
#        t=0: delta = 0 + 0.5*0.5 - 0.5 = -0.25;      A0 = -0.25 + 0.25*(-0.1875) = -0.296875
# row 1: t=3: delta = 1 + 0 - 0.5 = 0.5;              A3 = 0.5
#        t=2: delta = 0 + 0.5*0.5 - 0.5 = -0.25;      A2 = -0.25 + 0.25*0.5     = -0.125
#        t=1 masked: carry stays nextvalue V2 = 0.5, lastgaelam -0.125 (the 3.0 is never read)
#        t=0: delta = 0 + 0.5*0.5 - 0.5 = -0.25;      A0 = -0.25 + 0.25*(-0.125) = -0.28125
A_2x4 = [[-0.296875, -0.1875, 0.75, 0.0],
         [-0.28125, 0.0, -0.125, 0.5]]
RET_2x4 = [[-0.296875 + 0.5, -0.1875 + 0.5, 0.75 + 0.25, 0.0],   # = [0.203125, 0.3125, 1.0, 0]
           [-0.28125 + 0.5, 0.0, -0.125 + 0.5, 0.5 + 0.5]]      # = [0.21875, 0, 0.375, 1.0]
# skip_masked=False (verl before PR #2337): nextvalue = V[t+1] whatever the mask, lastgaelam runs through.
# row 0: t=3: delta = 0 + 0 - 7 = -7;                 A3 = -7
#        t=2: delta = 1 + 0.5*7 - 0.25 = 4.25;        A2 = 4.25 + 0.25*(-7)    = 2.5
#        t=1: delta = 0 + 0.5*0.25 - 0.5 = -0.375;    A1 = -0.375 + 0.25*2.5   = 0.25
#        t=0: delta = 0 + 0.5*0.5 - 0.5 = -0.25;      A0 = -0.25 + 0.25*0.25   = -0.1875
# row 1: t=3: A3 = 0.5;  t=2: A2 = -0.125 (as above)
#        t=1: delta = 0 + 0.5*0.5 - 3.0 = -2.75;      A1 = -2.75 + 0.25*(-0.125) = -2.78125
#        t=0: delta = 0 + 0.5*3.0 - 0.5 = 1.0;        A0 = 1.0 + 0.25*(-2.78125) = 0.3046875
A_2x4_LEGACY = [[-0.1875, 0.25, 2.5, 0.0],
                [0.3046875, 0.0, -0.125, 0.5]]
RET_2x4_LEGACY = [[-0.1875 + 0.5, 0.25 + 0.5, 2.5 + 0.25, 0.0],
                  [0.3046875 + 0.5, 0.0, -0.125 + 0.5, 0.5 + 0.5]]


def _on_mask(rows, mask):
    return [x for row, mrow in zip(rows, mask) for x, m in zip(row, mrow) if m]


@pytest.mark.parametrize("skip_masked, raw, ret_expected", [(True, A_2x4, RET_2x4),
                                                            (False, A_2x4_LEGACY, RET_2x4_LEGACY)])
def test_gae_2x4_masked_by_hand(skip_masked, raw, ret_expected):
    mask = torch.tensor(M_2x4)
    adv, ret = gae_advantages_returns(t64(R_2x4), t64(V_2x4), mask, GAMMA, LAM, skip_masked=skip_masked)
    assert torch.equal(ret, t64(ret_expected))  # returns = raw A + V, 0 off the mask
    # whitened over the 6 mask tokens of both rows together
    white = iter(whiten_by_hand(_on_mask(raw, M_2x4)))
    expected = [[next(white) if m else 0.0 for m in mrow] for mrow in M_2x4]
    assert torch.allclose(adv, t64(expected), rtol=0, atol=1e-7)
    # mean 0, unbiased variance 1 over the mask; exactly 0 off it
    on = adv[mask.bool()]
    assert abs(float(on.mean())) < 1e-8  # not exactly 0: verl's mean divides by n + 1e-8
    assert float(on.var(unbiased=True)) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(adv[~mask.bool()], torch.zeros(2, dtype=F64))


def test_gae_versions_agree_on_prefix_masks_with_zero_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 7])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).float()
    values = torch.randn(4, 7, generator=g, dtype=F64) * mask
    rewards = torch.randn(4, 7, generator=g, dtype=F64) * mask
    new = gae_advantages_returns(rewards, values, mask, 0.99, 0.95, skip_masked=True)
    old = gae_advantages_returns(rewards, values, mask, 0.99, 0.95, skip_masked=False)
    for a, b in zip(new, old):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_gae_ignores_nan_on_masked_positions():
    values, rewards = t64(V_2x4), t64(R_2x4)
    values[0, 3] = float("nan")
    values[1, 1] = float("inf")
    rewards[0, 3] = float("nan")
    adv, ret = gae_advantages_returns(rewards, values, torch.tensor(M_2x4), GAMMA, LAM)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(ret, t64(RET_2x4))


def test_masked_stats_match_hand_values():
    x = t64([[1.0, 2.0, 100.0], [3.0, float("nan"), 6.0]])
    m = t64([[1, 1, 0], [1, 0, 1]])
    # mask picks 1, 2, 3, 6: mean 3; deviations -2, -1, 0, 3; squares 4 + 1 + 0 + 9 = 14
    assert float(masked_mean(x, m)) == pytest.approx(3.0, abs=1e-8)
    assert float(masked_var(x, m, unbiased=False)) == pytest.approx(14 / 4, abs=1e-8)
    assert float(masked_var(x, m)) == pytest.approx(14 / 3, rel=1e-8)  # Bessel: * 4 / 3 (n + 1e-8: rel ~3e-9)
    # per-row mean: row 0 (1 + 2) / 2, row 1 (3 + 6) / 2
    assert torch.allclose(masked_mean(x, m, dim=-1), t64([1.5, 4.5]), atol=1e-8)
    w = masked_whiten(x, m)
    assert torch.allclose(w[m.bool()], t64([-2.0, -1.0, 0.0, 3.0]) / math.sqrt(14 / 3 + 1e-8), atol=1e-7)  # eps in n + 1e-8
    # shift_mean=False adds the mean back after scaling
    assert torch.allclose(masked_whiten(x, m, shift_mean=False)[m.bool()], w[m.bool()] + 3.0, atol=1e-8)
    with pytest.raises(ValueError):
        masked_var(x, t64([[1, 0, 0], [0, 0, 0]]))  # one token: no unbiased variance (as verl)


# --------------------------------------------------------------------------------------------
# token-level rewards


class _SyncCounter(TorchDispatchMode):
    """Counts aten ops that make the host wait for the device (as tests/test_host_syncs.py)."""

    SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "item", "masked_scatter",
               "index_put_with_bool_mask", "repeat_interleave", "unique", "_unique2", "equal", "allclose"}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.SYNCING:
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_token_level_rewards_put_the_score_on_each_rows_last_response_token():
    scores = t64([1.0, -0.5, 2.0, 4.0])
    mask = torch.tensor([[1, 1, 1, 1],    # length 4: last token t=3
                         [1, 1, 0, 0],    # length 2: t=1
                         [1, 0, 1, 0],    # a hole: last response token t=2
                         [0, 0, 0, 0]])   # empty row: no score, no KL
    kl = t64([[0.5, 0.25, 1.0, 2.0],
              [1.0, 0.5, float("nan"), 9.0],   # NaN / garbage off the mask are ignored
              [0.25, 9.0, 0.5, 9.0],
              [9.0, 9.0, 9.0, 9.0]])
    c = 0.5
    expected = [[-c * 0.5, -c * 0.25, -c * 1.0, 1.0 - c * 2.0],   # [-0.25, -0.125, -0.5, 0]
                [-c * 1.0, -0.5 - c * 0.5, 0.0, 0.0],           # [-0.5, -0.75, 0, 0]
                [-c * 0.25, 0.0, 2.0 - c * 0.5, 0.0],           # [-0.125, 0, 1.75, 0]
                [0.0, 0.0, 0.0, 0.0]]
    with _SyncCounter() as counter:
        rewards = token_level_rewards(scores, mask, kl, kl_coef=c)
        last = last_token_index(mask)
    assert counter.n == 0, "token_level_rewards must not read the device on the host"
    assert torch.equal(rewards, t64(expected))
    assert last.tolist() == [3, 1, 2, -1]
    # no KL: the score alone; kl_coef 0 also means no KL
    only_score = t64([[0, 0, 0, 1.0], [0, -0.5, 0, 0], [0, 0, 2.0, 0], [0, 0, 0, 0]])
    assert torch.equal(token_level_rewards(scores, mask, None, 0.0), only_score)
    assert torch.equal(token_level_rewards(scores, mask, kl.nan_to_num(), 0.0), only_score)


def test_token_level_rewards_match_openrlhf_compute_reward():
    # openrlhf/models/utils.py compute_reward (OpenRLHF 3c3be62), on a right-padded mask with kl already 0 on padding
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 4])[:, None]).long()
    kl = torch.randn(3, 6, generator=g, dtype=F64) * mask
    r = torch.randn(3, generator=g, dtype=F64)
    eos = mask.size(1) - 1 - mask.long().fliplr().argmax(dim=1, keepdim=True)
    ref = torch.zeros_like(kl).scatter_(dim=1, index=eos, src=r.unsqueeze(1)) + (-0.05 * kl)
    assert torch.allclose(token_level_rewards(r, mask, kl, 0.05), ref, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------------------------
# clipped value loss, c = 0.2

VL_V = [[1.0, 0.5, 0.0], [0.0, 2.0, float("nan")]]
VL_OLD = [[0.5, 0.5, 0.5], [0.0, 1.0, 0.0]]
VL_RET = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
VL_MASK = [[1, 1, 1], [1, 1, 0]]
# row 0: t0: V 1.0 -> clip to [0.3, 0.7] = 0.7: (1-1)^2 = 0, (0.7-1)^2 = 0.09 -> 0.09 (clipped term larger)
#        t1: V 0.5 inside [0.3, 0.7]:         (0.5-1)^2 = 0.25 both        -> 0.25 (equal: not counted)
#        t2: V 0.0 -> 0.3:                    (0-0)^2 = 0, (0.3-0)^2 = 0.09 -> 0.09 (clipped term larger)
# row 1: t0: V 0.0 inside [-0.2, 0.2]:        (0-1)^2 = 1 both             -> 1
#        t1: V 2.0 -> 1.2:                    (2-0)^2 = 4, (1.2-0)^2 = 1.44 -> 4 (unclipped larger)
#        t2: masked (NaN prediction ignored)
# clip fraction = 2 / 5
VL_TOKENS = [[0.09, 0.25, 0.09], [1.0, 4.0]]


def test_clipped_value_loss_by_hand():
    v = t64(VL_V).requires_grad_(True)
    args = (t64(VL_OLD), t64(VL_RET), torch.tensor(VL_MASK), 0.2)
    row0, row1 = sum(VL_TOKENS[0]), sum(VL_TOKENS[1])  # 0.43, 5.0
    expected = {
        "token_mean": 0.5 * (row0 + row1) / 5,                      # 0.5 * 5.43 / 5 = 0.543
        "seq_mean_token_mean": 0.5 * (row0 / 3 + row1 / 2) / 2,     # 0.5 * (0.14333 + 2.5) / 2
        "seq_mean_token_sum_norm": 0.5 * (row0 + row1) / (2 * 3),   # N_seqs 2, max_new_tokens = T = 3
    }
    for agg, want in expected.items():
        loss, clip_frac = clipped_value_loss(v, *args, agg)
        assert float(loss.detach()) == pytest.approx(want, abs=1e-12), agg
        assert float(clip_frac) == pytest.approx(2 / 5, abs=1e-15)
    loss, _ = clipped_value_loss(v, *args, "token_mean")
    loss.backward()
    # d/dV of 0.5 * l / 5: clipped tokens (row 0 t0, t2) have V_clip constant in V -> 0;
    # row 0 t1: (V - R)^2 -> 0.5 * 2 * (0.5 - 1) / 5 = -0.1; row 1 t0: 0.5 * 2 * (0 - 1) / 5 = -0.2;
    # row 1 t1: 0.5 * 2 * (2 - 0) / 5 = 0.4; masked NaN slot: 0
    assert torch.allclose(v.grad, t64([[0.0, -0.1, 0.0], [-0.2, 0.4, 0.0]]), rtol=0, atol=1e-15)


def test_clipped_value_loss_split_into_micro_batches_sums_to_the_step_loss():
    counts = StepCounts(sequences=2, tokens=5, max_new_tokens=3)
    full, _ = clipped_value_loss(t64(VL_V), t64(VL_OLD), t64(VL_RET), torch.tensor(VL_MASK), 0.2,
                                 "seq_mean_token_mean", counts=counts)
    parts = sum(clipped_value_loss(t64(VL_V)[i:i + 1], t64(VL_OLD)[i:i + 1], t64(VL_RET)[i:i + 1],
                                   torch.tensor(VL_MASK)[i:i + 1], 0.2, "seq_mean_token_mean", counts=counts)[0]
                for i in range(2))
    assert float(parts) == pytest.approx(float(full), abs=1e-15)
    with pytest.raises(ValueError):
        clipped_value_loss(t64(VL_V), t64(VL_OLD), t64(VL_RET), torch.tensor(VL_MASK), 0.2, "seq-mean")


# --------------------------------------------------------------------------------------------
# KL controllers

# target 1.0, horizon 100, n_steps 10 each update, init 0.1:
# 1: kl 1.5: error 0.5 -> clip 0.2;  mult = 1 + 0.2 * 10 / 100 = 1.02;  value = 0.1 * 1.02 = 0.102
# 2: kl 0.9: error -0.1;             mult = 1 - 0.1 * 10 / 100 = 0.99;  value = 0.102 * 0.99 = 0.10098
# 3: kl 0.0: error -1 -> clip -0.2;  mult = 1 - 0.2 * 10 / 100 = 0.98;  value = 0.10098 * 0.98 = 0.0989604
KL_SEQ = [(1.5, 0.102), (0.9, 0.10098), (0.0, 0.0989604)]


def test_adaptive_kl_controller_three_updates_by_hand():
    ctl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=1.0, horizon=100)
    assert isinstance(ctl, AdaptiveKLController) and ctl.value == 0.1
    for kl, want in KL_SEQ:
        ctl.update(torch.tensor(kl, dtype=F64) if kl == 0.9 else kl, n_steps=10)  # a 0-d tensor is accepted too
        assert ctl.value == pytest.approx(want, rel=1e-14)
    with pytest.raises(ValueError):
        ctl.update(float("nan"), 10)


def test_kl_controller_state_round_trip_continues_identically():
    a = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    for kl, _ in KL_SEQ[:2]:
        a.update(kl, 10)
    state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint holds
    assert state == {"kind": "adaptive", "value": a.value, "target_kl": 1.0, "horizon": 100.0}
    b = kl_controller_from_state_dict(state)
    assert isinstance(b, AdaptiveKLController) and b.value == a.value
    for kl in (KL_SEQ[2][0], 1.1, 3.0, 0.95):
        a.update(kl, 10)
        b.update(kl, 10)
        assert b.value == a.value  # bit-identical, not approximately
    fixed = build_kl_controller("fixed", kl_coef=0.05)
    fixed.update(10.0, 256)
    assert fixed.value == 0.05
    restored = FixedKLController.from_state_dict(json.loads(json.dumps(fixed.state_dict())))
    assert restored.value == 0.05
    with pytest.raises(ValueError):
        AdaptiveKLController.from_state_dict(fixed.state_dict())
    with pytest.raises(ValueError):
        build_kl_controller("adaptive", kl_coef=0.1, target_kl=1.0, horizon=0)
    with pytest.raises(ValueError):
        build_kl_controller("pid", kl_coef=0.1)


# --------------------------------------------------------------------------------------------
# The adaptive factor 1 + clip(err, -0.2, 0.2) * n / horizon is <= 0 at a KL far below target
# once n >= 5 * horizon: refused at config time, and the controller never takes such a step, so
# every state it reaches is >= 0, finite and restorable.

def _ppo_adaptive(n_prompts, horizon, group_size=1, init=0.05, target=1.0):
    return ["rl.algorithm=ppo", "rl.kl_ctl=adaptive", f"rl.kl_coef={init}", f"rl.kl_target={target}",
            f"rl.kl_horizon={horizon}", f"rl.prompts_per_step={n_prompts}", f"rl.group_size={group_size}",
            "rl.micro_batch_size=1", "scaling.min_workers=1", "scaling.max_workers=1"]


def test_adaptive_kl_issue_numbers_refused_at_config_time(tmp_path):
    # the report: init 0.05, target 1, horizon 10, 64 samples per step, KL 0:
    # error = 0/1 - 1 = -1 -> clip -0.2;  mult = 1 - 0.2 * 64 / 10 = 1 - 1.28 = -0.28 < 0
    ctl = AdaptiveKLController(init_kl_coef=0.05, target_kl=1.0, horizon=10)
    with pytest.raises(ValueError, match=r"n_steps=64 .*5 x horizon=10"):
        ctl.update(0.0, n_steps=64)  # before the fix: value = 0.05 * -0.28 = -0.014
    assert ctl.value == 0.05  # the refused update changed nothing ...
    back = kl_controller_from_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert back.value == 0.05  # ... and the state still restores
    # the same numbers as a config file: refused before any work, in one line naming the key
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text("rl:\n  algorithm: ppo\n  kl_ctl: adaptive\n  kl_coef: 0.05\n  kl_target: 1.0\n  kl_horizon: 10\n"
                   "  prompts_per_step: 16\n  group_size: 4\n  micro_batch_size: 1\n"
                   "scaling:\n  min_workers: 1\n  max_workers: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg), [], job="grpo")
    msg = str(e.value)
    assert msg.startswith("rl.kl_horizon: ") and "\n" not in msg
    # 16 prompts x 4 samples = 64 >= 5 x 10 = 50; smallest horizon with 5 * h > 64 is 13 (5 * 13 = 65)
    assert "16 prompts x 4 samples = 64" in msg and "5 x rl.kl_horizon=10 = 50" in msg and "at least 13" in msg
    assert load_config(str(cfg), ["rl.kl_horizon=13"], job="grpo").rl.kl_horizon == 13
    # a fixed controller never multiplies, so the same sizes are fine with it
    assert load_config(str(cfg), ["rl.kl_ctl=fixed"], job="grpo").rl.kl_ctl == "fixed"


def test_adaptive_kl_boundary_n_equals_five_horizons():
    # n = 5 * horizon = 50: mult = 1 - 0.2 * 50 / 10 = 0 -> the coefficient would be 0 for good
    with pytest.raises(ConfigError, match=r"^rl\.kl_horizon: .*= 50 .*at least 11"):
        load_config(None, _ppo_adaptive(50, 10), job="grpo")
    ctl = AdaptiveKLController(0.05, 1.0, 10)
    with pytest.raises(ValueError, match="horizon"):
        ctl.update(0.0, 50)  # before the fix: value = 0.05 * 0 = 0.0, never moves again
    assert ctl.value == 0.05
    # one sample fewer, n = 49 < 50, is accepted: mult = 1 - 0.2 * 49 / 10 = 1 - 0.98 = 0.02
    assert load_config(None, _ppo_adaptive(49, 10), job="grpo").rl.kl_horizon == 10
    ctl.update(0.0, 49)
    assert ctl.value == pytest.approx(0.05 * 0.02, rel=1e-12)  # 0.001
    # one horizon more, h = 11 > 50 / 5, is accepted: mult = 1 - 0.2 * 50 / 11 = 1 - 10/11 = 1/11
    assert load_config(None, _ppo_adaptive(50, 11), job="grpo").rl.kl_horizon == 11
    ctl = AdaptiveKLController(0.05, 1.0, 11)
    ctl.update(0.0, 50)
    assert ctl.value == pytest.approx(0.05 / 11, rel=1e-12)  # 0.004545...
    # above target the same step size is +0.2: mult = 1 + 10/11 = 21/11
    ctl.update(5.0, 50)
    assert ctl.value == pytest.approx(0.05 / 11 * 21 / 11, rel=1e-12)


def test_adaptive_kl_every_reachable_state_restores():
    """Property: for (init, target, horizon, n) that the config accepts and any KL sequence, each
    state after each update is >= 0 and finite, survives JSON + from_state_dict exactly, and the
    restored controller continues bit-identically."""
    rng = np.random.default_rng(0)
    checked = 0
    for case in range(300):
        horizon = int(rng.choice([1, 2, 3, 10, 100, 1000, 10000]))
        n = int(rng.integers(1, 5 * horizon))  # [1, 5 * horizon - 1]: what validation accepts
        if n >= 5 * horizon - 1 or case % 7 == 0:
            n = 5 * horizon - 1  # the tightest accepted size: mult down to 1 - (5h - 1) / (5h) = 1 / (5h)
        init = float(rng.choice([0.0, 1e-6, 0.05, 1.0, 10.0]))
        target = float(rng.choice([0.01, 0.5, 1.0, 6.0]))
        if case < 12:  # through the real loader (a dozen cases: it is the slow part)
            load_config(None, _ppo_adaptive(n, horizon, init=init, target=target), job="grpo")
        a = AdaptiveKLController(init, target, horizon)
        for _ in range(int(rng.integers(1, 40))):
            kl = float(rng.choice([0.0, target * rng.uniform(0, 2), target * 100, target]))
            a.update(kl, n)
            assert a.value >= 0 and math.isfinite(a.value)
            b = kl_controller_from_state_dict(json.loads(json.dumps(a.state_dict())))
            assert b.state_dict() == a.state_dict()
            nxt = float(rng.uniform(0, 3 * target))
            b.update(nxt, n)
            c = AdaptiveKLController.from_state_dict(a.state_dict())
            c.update(nxt, n)
            assert b.value == c.value  # bit-identical
            checked += 1
    assert checked > 1000
    # the extremes a long run can reach: underflow to exactly 0 (restorable, stays 0) ...
    a = AdaptiveKLController(0.05, 1.0, 10)
    for _ in range(400):  # mult = 1 - 0.2 * 49 / 10 = 0.02 each step; 0.05 * 0.02^200 < 5e-324
        a.update(0.0, 49)
    assert a.value == 0.0
    assert kl_controller_from_state_dict(json.loads(json.dumps(a.state_dict()))).value == 0.0
    # ... and overflow: refused, leaving the last finite (restorable) state
    a = AdaptiveKLController(1.0, 1.0, 1)
    with pytest.raises(ValueError, match="overflow"):
        for _ in range(10000):  # mult = 1 + 0.2 * 4 / 1 = 1.8 each step: 1.8^1208 > 1.8e308
            a.update(100.0, 4)
    assert math.isfinite(a.value) and a.value > 1e307
    assert kl_controller_from_state_dict(json.loads(json.dumps(a.state_dict()))).value == a.value


# --------------------------------------------------------------------------------------------
# verl reference: verbatim copies (see the module doc for source and commit)


def _verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def _verl_masked_mean(values, mask, axis=None):
    s = _verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def _verl_masked_var(values, mask, unbiased=True):
    mean = _verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = _verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def _verl_masked_whiten(values, mask, shift_mean=True):
    mean, var = _verl_masked_mean(values, mask), _verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def _verl_compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]

        for t in reversed(range(gen_len)):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam

            # skip values and TD-error on observation tokens
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam

            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)

        returns = advantages + values
        advantages = _verl_masked_whiten(advantages, response_mask)
    return advantages, returns


def _verl_compute_gae_advantage_return_pre_2337(token_level_rewards, values, response_mask, gamma, lam):
    with torch.no_grad():
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        advantages = _verl_masked_whiten(advantages, response_mask)
    return advantages, returns


def _verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        batch_num_tokens = loss_mask.sum()
        loss = _verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        global_batch_size = seq_mask.sum()
        loss = _verl_masked_sum(seq_losses, seq_mask) / global_batch_size  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def _verl_compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean"):
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * _verl_agg_loss(loss_mat=clipped_vf_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    vf_clipfrac = _verl_masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


class _VerlAdaptiveKLController:
    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl, n_steps):
        target = self.target
        proportional_error = np.clip(current_kl / target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


def _random_batch(seed, holes):
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 9
    lengths = torch.tensor([9, 1, 4, 7, 2])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(F64)
    if holes:  # observation spans inside responses (multi-turn)
        mask[0, 2:4] = 0
        mask[3, 1] = 0
    values = torch.randn(b, t, generator=g, dtype=F64)  # garbage off the mask too
    rewards = torch.randn(b, t, generator=g, dtype=F64) * 0.1
    return rewards, values, mask


@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_verl_main(holes):
    rewards, values, mask = _random_batch(2, holes)
    adv, ret = gae_advantages_returns(rewards, values, mask, 0.99, 0.95)
    ref_adv, ref_ret = _verl_compute_gae_advantage_return(rewards, values, mask, 0.99, 0.95)
    on = mask.bool()
    assert torch.allclose(adv[on], ref_adv[on], rtol=0, atol=1e-12)
    assert torch.allclose(ret[on], ref_ret[on], rtol=0, atol=1e-12)
    assert not adv[~on].any() and not ret[~on].any()  # ours are 0 off the mask; verl leaves the carry there


@pytest.mark.parametrize("holes", [False, True])
def test_gae_legacy_flag_matches_verl_before_pr_2337(holes):
    rewards, values, mask = _random_batch(3, holes)
    adv, ret = gae_advantages_returns(rewards, values, mask, 0.99, 0.95, skip_masked=False)
    ref_adv, ref_ret = _verl_compute_gae_advantage_return_pre_2337(rewards, values, mask, 0.99, 0.95)
    on = mask.bool()
    assert torch.allclose(adv[on], ref_adv[on], rtol=0, atol=1e-12)
    assert torch.allclose(ret[on], ref_ret[on], rtol=0, atol=1e-12)
    # and with garbage values off the mask the two verl versions do differ
    new_adv, _ = gae_advantages_returns(rewards, values, mask, 0.99, 0.95)
    assert not torch.allclose(adv[on], new_adv[on], atol=1e-6)


def test_masked_whiten_matches_verl():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 7, generator=g, dtype=F64) * 3 + 1
    m = (torch.rand(3, 7, generator=g) > 0.4).to(F64)
    for shift in (True, False):
        assert torch.allclose(masked_whiten(x, m, shift), _verl_masked_whiten(x, m, shift), rtol=0, atol=1e-12)
    assert torch.allclose(masked_var(x, m), _verl_masked_var(x, m), rtol=0, atol=1e-12)


@pytest.mark.parametrize("agg, verl_mode", [("token_mean", "token-mean"), ("seq_mean_token_mean", "seq-mean-token-mean")])
def test_value_loss_matches_verl(agg, verl_mode):
    g = torch.Generator().manual_seed(5)
    _, old, mask = _random_batch(6, holes=True)
    v = old + 0.3 * torch.randn(old.shape, generator=g, dtype=F64)
    ret = old + torch.randn(old.shape, generator=g, dtype=F64)
    loss, frac = clipped_value_loss(v, old, ret, mask, 0.2, agg)
    ref_loss, ref_frac = _verl_compute_value_loss(v, ret, old, mask, 0.2, verl_mode)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-7)  # verl's seq mean adds 1e-8 to the length
    assert float(frac) == pytest.approx(float(ref_frac), abs=1e-8)
    assert 0 < float(frac) < 1


def test_adaptive_kl_controller_is_bit_identical_to_verl():
    ours, ref = AdaptiveKLController(0.05, 6.0, 10000), _VerlAdaptiveKLController(0.05, 6.0, 10000)
    g = torch.Generator().manual_seed(7)
    for kl in (torch.rand(50, generator=g, dtype=F64) * 12).tolist():
        ours.update(kl, 256)
        ref.update(kl, 256)
        assert ours.value == float(ref.value)
