"""Multi-turn PPO (issue 44, rl.turns > 1 with rl.algorithm ppo): an episode row is prompt,
answer 1, feedback 1, answer 2, ...; the critic values every token, but the response mask is the
policy's answers (verl's layout: observation tokens inside a response). Checked on the job's own
functions (elastic/rl/ppo.py rank_gae, PPOJob._advantages, PPOJob._ppo_micro_batches, ppo_loss):
advantages and returns by hand and equal to GAE over the policy tokens alone, concatenated; the
episode reward on the last policy token; whitening over policy tokens; no gradient of the policy
or value loss from anything at a feedback position. Pure CPU, well under a second."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from elastic.config import load_config
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.gae import gae_advantages_returns, masked_whiten, token_level_rewards
from elastic.rl.grpo import Rollout, StepOutcome
from elastic.rl.ppo import PPOJob, ppo_loss, rank_gae, response_mask
from elastic.train.comm import Comm
from elastic.train.step import to_device


def _ppo_cfg(**extra):
    o = {"rl.algorithm": "ppo", "rl.group_size": 1, "rl.prompts_per_step": 4, "rl.turns": 2, "rl.micro_batch_size": 2}
    o.update(extra)
    return load_config(None, [f"{k}={v}" for k, v in o.items()], job="grpo")


def _row(k, n, spans=None, kl=None):
    """A rollout of `n` tokens after a 3-token prompt; old - ref log-probs = `kl` (ref = -1)."""
    kl = np.zeros(n) if kl is None else np.asarray(kl, np.float64)
    return Rollout(k, f"p{k}", [5, 6, 7], list(range(10, 10 + n)), False, key=f"r:{k}", spans=spans,
                   turns=[] if spans is not None else None,
                   old_logp=(kl - 1.0).astype(np.float32), ref_logp=np.full(n, -1.0, np.float32))


def test_ppo_with_turns_loads_and_disaggregated_is_still_refused():
    assert _ppo_cfg().rl.turns == 2
    from elastic.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _ppo_cfg(**{"rl.rollout.placement": "disaggregated", "rl.rollout.workers": 1})
    assert str(e.value).startswith("rl.turns") and "\n" not in str(e.value)


# Row 0, an episode: answer [0, 2), feedback [2, 4), answer [4, 6); gamma = lam = 0.5, kl_coef 0.5.
# Policy tokens j = 0..3 (positions 0, 1, 4, 5): V = 0.5, 0.25, 0.5, 0.25; kl = 1, 0, 0, 1; reward 1
# -> token rewards r = -0.5, 0, 0, 1 - 0.5 = 0.5 (the feedback's V 7, -3 and kl 5 are never read).
#   j=3: delta = 0.5 + 0.5*0 - 0.25 = 0.25                    A = 0.25
#   j=2: delta = 0 + 0.5*0.25 - 0.5 = -0.375                  A = -0.375 + 0.25*0.25 = -0.3125
#   j=1: delta = 0 + 0.5*0.5 - 0.25 = 0  (V of position 4)    A = 0 + 0.25*(-0.3125) = -0.078125
#   j=0: delta = -0.5 + 0.5*0.25 - 0.5 = -0.875               A = -0.875 + 0.25*(-0.078125) = -0.89453125
# returns = A + V = -0.39453125, 0.171875, 0.1875, 0.5
# Row 1 ends on feedback: answer [0, 3), feedback [3, 5) (EpisodeBatch never appends feedback
# without room for an answer, but the mask decides, not the row's length): its reward -1 lands on
# position 2, not on the last token. Row 2, single turn, 7 tokens. Row 3: dropped.
def _by_hand_rows():
    rows = [_row(0, 6, [(0, 2), (4, 6)], kl=[1, 0, 5, 5, 0, 1]), _row(1, 5, [(0, 3)], kl=[0, 0, 0, 5, 5]),
            _row(2, 7), _row(3, 4, [(0, 2)])]
    values = {0: np.array([0.5, 0.25, 7.0, -3.0, 0.5, 0.25]), 1: np.array([0.0, 0.0, 0.0, 9.0, 9.0]),
              2: np.zeros(7), 3: np.ones(4)}
    rewards = np.array([1.0, -1.0, 2.0, 3.0])
    keep = np.array([True, True, True, False])
    return rows, values, rewards, keep


def test_rank_gae_by_hand_on_an_episode_with_a_feedback_span():
    rows, values, rewards, keep = _by_hand_rows()
    g = rank_gae(rows, values, rewards, keep, kl_coef=0.5, gamma=0.5, lam=0.5)
    assert g.mask.tolist() == [[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [1] * 7, [0] * 7]
    # the episode's reward on its last policy token, the KL on policy tokens only
    assert g.rewards[0].tolist() == [-0.5, 0, 0, 0, 0, 0.5, 0]
    assert g.rewards[1].tolist() == [0, 0, -1.0, 0, 0, 0, 0]
    assert g.rewards[2].tolist() == [0] * 6 + [2.0]
    assert g.rewards[3].tolist() == [0] * 7  # dropped: no score, no advantage
    assert g.kl[0].tolist() == [1, 0, 0, 0, 0, 1, 0]
    assert g.advantages[0].tolist() == [-0.89453125, -0.078125, 0, 0, -0.3125, 0.25, 0]
    assert g.returns[0].tolist() == [-0.39453125, 0.171875, 0, 0, 0.1875, 0.5, 0]
    # row 1 (gamma*lam = 0.25, V = 0 on its answer): A = -0.0625, -0.25, -1
    assert g.advantages[1].tolist() == [-0.0625, -0.25, -1.0, 0, 0, 0, 0]
    assert g.advantages[3].abs().sum() == 0 and g.returns[3].abs().sum() == 0


def test_rank_gae_equals_gae_over_the_policy_tokens_alone_concatenated():
    """The point of skipping masked positions: a feedback span is no time step. Random episodes
    (1-3 answers, feedback between, sometimes a trailing feedback), gamma < 1, KL in the reward."""
    rng = np.random.default_rng(0)
    rows, values = [], {}
    for k in range(6):
        spans, pos = [], 0
        for _ in range(int(rng.integers(1, 4))):
            n_ans, n_fb = int(rng.integers(1, 6)), int(rng.integers(1, 5))
            spans.append((pos, pos + n_ans))
            pos += n_ans + n_fb
        n = pos if rng.random() < 0.3 else spans[-1][1]  # sometimes the row ends on feedback (the mask decides)
        rows.append(_row(k, n, spans, kl=rng.normal(size=n)))
        values[k] = rng.normal(size=n)
    rewards, keep = rng.normal(size=6), np.ones(6, bool)
    g = rank_gae(rows, values, rewards, keep, kl_coef=0.1, gamma=0.9, lam=0.8)
    for b, r in enumerate(rows):
        idx = torch.tensor([t for a, e in r.spans for t in range(a, e)])
        kl = torch.from_numpy(r.old_logp.astype(np.float64) - r.ref_logp.astype(np.float64))[idx][None]
        ones = torch.ones(1, len(idx), dtype=torch.float64)
        tr = token_level_rewards(torch.tensor([rewards[b]], dtype=torch.float64), ones, kl, 0.1)
        a, ret = gae_advantages_returns(tr, torch.from_numpy(values[r.k])[idx][None], ones, 0.9, 0.8, whiten=False)
        np.testing.assert_allclose(g.advantages[b, idx].numpy(), a[0].numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g.returns[b, idx].numpy(), ret[0].numpy(), rtol=1e-12, atol=1e-12)
        assert torch.equal(g.rewards[b, idx], tr[0])
        off = g.mask[b] == 0
        assert g.advantages[b, off].abs().sum() == 0 and g.returns[b, off].abs().sum() == 0
        assert g.rewards[b, off].abs().sum() == 0
    # anything at feedback positions (values, old / reference log-probs) changes nothing
    feedback = {r.k: response_mask(r, len(r.tokens)).numpy() == 0 for r in rows}
    values2 = {k: np.where(feedback[k], 50.0, v) for k, v in values.items()}
    for r in rows:
        r.old_logp = np.where(feedback[r.k], 9.0, r.old_logp).astype(np.float32)
    g2 = rank_gae(rows, values2, rewards, keep, kl_coef=0.1, gamma=0.9, lam=0.8)
    for a, b in ((g.advantages, g2.advantages), (g.returns, g2.returns), (g.rewards, g2.rewards), (g.kl, g2.kl)):
        assert torch.equal(a, b)


def _job(cfg):
    """The PPO job's per-rank pieces that need no model: a single-process Comm (no process group)."""
    job = PPOJob.__new__(PPOJob)
    job.rl, job.ctx, job.ref_model, job.fleet = cfg.rl, SimpleNamespace(comm=Comm(torch.device("cpu"))), None, None
    job._ppo_metrics, job._pg_coef, job._step = {}, 1.0, 0
    return job


def test_advantages_whitened_over_policy_tokens_only():
    rows, values, rewards, keep = _by_hand_rows()
    job = _job(_ppo_cfg(**{"rl.gamma": 0.5, "rl.lam": 0.5}))
    n = len(rows)
    outcome = StepOutcome(rewards, rewards, ["ok"] * n, np.array([r.policy_len for r in rows]), np.zeros(n, bool),
                          [None] * n, keep, np.zeros(n))
    adv, ret = job._advantages(rows, values, outcome, keep)
    g = rank_gae(rows, values, rewards, keep, 0.0, 0.5, 0.5)  # no reference model: no KL in the reward
    want = torch.where(g.mask.bool(), masked_whiten(g.advantages, g.mask), torch.zeros((), dtype=torch.float64))
    for b, r in enumerate(rows):
        np.testing.assert_allclose(adv[r.k], want[b, :len(r.tokens)].numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ret[r.k], g.returns[b, :len(r.tokens)].numpy().astype(np.float32))
    assert adv[0][2:4].tolist() == [0, 0] and adv[1][3:].tolist() == [0, 0]  # feedback: no advantage
    assert job._ppo_metrics["returns_mean"] == pytest.approx(float(g.returns.sum() / g.mask.sum()))
    assert job._ppo_metrics["values_mean"] == pytest.approx(float((g.values * g.mask).sum() / g.mask.sum()))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_ppo_loss_gets_no_gradient_from_feedback_positions(agg):
    """Logits, critic values, targets, old / reference log-probs, advantages, returns and old
    values at every position outside the policy's answers (prompt, feedback, padding) are
    changed: the policy and value losses, their statistics and both gradients stay the same."""
    rows, values, rewards, keep = _by_hand_rows()
    rows, keep = rows[:3], keep[:3]
    cfg = _ppo_cfg(**{"rl.loss_agg": agg, "rl.cliprange_value": 0.2})
    job = _job(cfg)
    rng = np.random.default_rng(1)
    adv = {r.k: rng.normal(size=len(r.tokens)).astype(np.float32) for r in rows}
    ret = {r.k: rng.normal(size=len(r.tokens)).astype(np.float32) for r in rows}
    job.rl = dataclasses.replace(cfg.rl, micro_batch_size=4)  # the three rows in one micro-batch
    [mb] = job._ppo_micro_batches(rows, keep, values, adv, ret)
    mb = to_device(mb, torch.device("cpu"))
    B, L = mb["tokens"].shape
    assert mb["cmask"][0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 0]  # prompt, answer, feedback, answer, padding
    counts = StepCounts(sequences=3, tokens=int(mb["cmask"].sum()), max_new_tokens=cfg.rl.max_new_tokens * cfg.rl.turns)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, L - 1, 40, generator=g)
    v = torch.randn(B, L - 1, generator=g)

    def run(mb, logits, v):
        logits, v = logits.clone().requires_grad_(True), v.clone().requires_grad_(True)
        out = ppo_loss(logits, v, mb, cfg.rl, counts, pg_coef=1.0)
        out.loss_sum.backward()
        return out, logits.grad, v.grad

    out, g_logits, g_v = run(mb, logits, v)
    off = mb["cmask"] == 0  # [B, L]: not the policy's token
    off_t = off[:, 1:]      # [B, L-1]: positions whose target is not the policy's
    mb2 = dict(mb)
    mb2["tokens"] = torch.where(off, (mb["tokens"] + 7) % 40, mb["tokens"])
    for k in ("old_logp", "ref_logp", "adv_tok", "returns", "old_values"):
        mb2[k] = torch.where(off, torch.randn(B, L, generator=g) * 10, mb[k])
    out2, g_logits2, g_v2 = run(mb2, torch.where(off_t.unsqueeze(-1), torch.randn(B, L - 1, 40, generator=g) * 10, logits),
                                torch.where(off_t, torch.randn(B, L - 1, generator=g) * 10, v))
    assert torch.equal(g_logits, g_logits2) and torch.equal(g_v, g_v2)
    assert torch.equal(out.loss_sum, out2.loss_sum)
    for k in ("pg_loss", "vf_loss", "entropy_sum", "kl_sum", "vf_clipped_tokens", "tokens"):
        assert torch.equal(out.stats[k], out2.stats[k]), k
    assert g_logits[off_t].abs().sum() == 0 and g_v[off_t].abs().sum() == 0
    assert g_logits[~off_t].abs().sum() > 0 and g_v[~off_t].abs().sum() > 0
