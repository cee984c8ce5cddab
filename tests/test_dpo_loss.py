"""DPO math (elastic/rl/algorithms/dpo_loss.py) and the job's loss function against hand-computed values:
the sigmoid, cDPO and IPO losses and their gradients, sequence log-probabilities summed over the
answer only, and the policy equal to the reference (loss log 2, margins 0, and the gradient
-β/2 · ∇[log π(y_w) − log π(y_l)])."""

import math

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, from_dict
from elastic.data.preference import PairSet
from elastic.rl.dpo import make_dpo_loss, pair_batch
from elastic.rl.algorithms.dpo_loss import answer_logprobs, dpo_loss
from elastic.train.loop import build_model
from elastic.train.step import to_device
from tests.test_fsdp_equivalence import CFG

PC, PR, RC, RR, BETA = -3.0, -5.0, -4.0, -4.5, 0.5
H = (PC - RC) - (PR - RR)  # 1.5


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _grads(loss_type, eps=0.0):
    x = torch.tensor([PC, PR], dtype=torch.float64, requires_grad=True)
    t = dpo_loss(x[:1], x[1:], torch.tensor([RC], dtype=torch.float64), torch.tensor([RR], dtype=torch.float64), BETA,
                 loss_type, eps)
    t.losses.sum().backward()
    return t, x.grad.tolist()


def test_sigmoid_loss_rewards_and_gradient_by_hand():
    t, (g_c, g_r) = _grads("sigmoid")
    assert float(t.losses.detach()) == pytest.approx(math.log(1 + math.exp(-BETA * H)), rel=1e-12)  # 0.3873...
    assert float(t.chosen_rewards) == pytest.approx(BETA * (PC - RC)) and float(t.rejected_rewards) == pytest.approx(BETA * (PR - RR))
    assert float(t.margins) == pytest.approx(BETA * H)
    assert g_c == pytest.approx(-BETA * sig(-BETA * H), rel=1e-12)  # d/d log pi(y_w)
    assert g_r == pytest.approx(BETA * sig(-BETA * H), rel=1e-12)


def test_label_smoothing_cdpo_by_hand():
    eps = 0.1
    t, (g_c, _) = _grads("sigmoid", eps)
    want = -(1 - eps) * math.log(sig(BETA * H)) - eps * math.log(sig(-BETA * H))
    assert float(t.losses.detach()) == pytest.approx(want, rel=1e-12)
    assert g_c == pytest.approx(BETA * (-(1 - eps) * sig(-BETA * H) + eps * sig(BETA * H)), rel=1e-12)


def test_ipo_by_hand():
    t, (g_c, g_r) = _grads("ipo")
    assert float(t.losses.detach()) == pytest.approx((H - 1 / (2 * BETA)) ** 2)  # (1.5 - 1)^2 = 0.25
    assert g_c == pytest.approx(2 * (H - 1 / (2 * BETA))) and g_r == pytest.approx(-2 * (H - 1 / (2 * BETA)))


def test_policy_equal_to_reference_gives_log2_and_zero_margins():
    lp = torch.tensor([-7.0, -2.5, -11.0])
    lr = torch.tensor([-3.0, -9.0, -1.0])
    t = dpo_loss(lp, lr, lp.clone(), lr.clone(), beta=0.3)
    torch.testing.assert_close(t.losses, torch.full((3,), math.log(2.0)))
    assert torch.equal(t.margins, torch.zeros(3)) and not bool((t.margins > 0).any())


def test_answer_logprobs_sum_only_the_answer():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 5, 7, generator=g, dtype=torch.float64)
    tokens = torch.tensor([[1, 4, 2, 6, 3]])
    mask = torch.tensor([[0, 0, 0, 1, 1]])  # tokens 3 and 4 are the answer
    ls = torch.log_softmax(logits[0], -1)
    want = float(ls[2, 6] + ls[3, 3])  # token t is scored by the logits at t - 1
    assert float(answer_logprobs(logits, tokens, mask)) == pytest.approx(want, rel=1e-12)
    assert float(answer_logprobs(logits, tokens, mask, average=True)) == pytest.approx(want / 2, rel=1e-12)
    other = logits.clone()
    other[0, :2] += 5.0  # the prompt's own predictions do not count
    assert float(answer_logprobs(other, tokens, mask)) == pytest.approx(want, rel=1e-12)


def _pairs(seed=0, n=3):
    rng = np.random.default_rng(seed)
    return PairSet.build([(rng.integers(2, 300, int(rng.integers(3, 8))), rng.integers(2, 300, int(rng.integers(2, 9))),
                           rng.integers(2, 300, int(rng.integers(2, 9)))) for _ in range(n)])


def test_job_loss_with_policy_as_reference_is_log2_and_its_gradient_by_hand():
    """The job's loss_fn on a real model whose reference log-probs are its own: loss log 2 per
    pair, margins 0, accuracy 0, and d loss = -β/2 · d Σ_pairs [log π(y_w) - log π(y_l)]."""
    cfg = from_dict({**CFG, "dpo": {"beta": 0.2}})
    model, _, _ = build_model(cfg, torch.device("cpu"))
    pairs = _pairs()
    b = pair_batch(pairs, [0, 1, 2])
    t = to_device(b, torch.device("cpu"))
    logits = model(t["tokens"], t["positions"], t["doc_ids"])
    own = answer_logprobs(logits, t["tokens"], t["amask"])
    diff = (own[0::2] - own[1::2]).sum()
    diff.backward()
    want = {n: -0.2 / 2 * p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    b["ref_logp"] = own.detach().numpy()
    out = make_dpo_loss(cfg.dpo)(model, to_device(b, torch.device("cpu")))
    assert float(out.loss_sum) == pytest.approx(3 * math.log(2.0), rel=1e-5)
    assert float(out.stats["margin_sum"]) == pytest.approx(0.0, abs=1e-6) and float(out.stats["correct"]) == 0.0
    out.loss_sum.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-6, rtol=1e-4, msg=lambda m: f"{n}: {m}")


def test_pair_batch_rows_and_answer_mask():
    pairs = PairSet.build([([5, 6, 7], [8, 9], [10]), ([11], [12, 13, 14], [15, 16])])
    b = pair_batch(pairs, [1, 0])
    assert b["tokens"].shape == (4, 5)
    assert b["tokens"][0].tolist() == [11, 12, 13, 14, 0] and b["amask"][0].tolist() == [0, 1, 1, 1, 0]
    assert b["tokens"][3].tolist() == [5, 6, 7, 10, 0] and b["doc_ids"][3].tolist() == [0, 0, 0, 0, -1]
    assert b["amask"][3].tolist() == [0, 0, 0, 1, 0]


@pytest.mark.parametrize("over,key", [
    ({"beta": 0}, "dpo.beta"), ({"loss_type": "hinge"}, "dpo.loss_type"), ({"label_smoothing": 0.5}, "dpo.label_smoothing"),
    ({"loss_type": "ipo", "label_smoothing": 0.1}, "dpo.label_smoothing"), ({"reference": "cached"}, "dpo.reference"),
    ({"overlong": "cut"}, "dpo.overlong"), ({"code_opt_rejected": ["slow"]}, "dpo.code_opt_rejected[0]")])
def test_bad_dpo_config_is_one_line(over, key):
    with pytest.raises(ConfigError) as e:
        from_dict({"dpo": over})
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)
