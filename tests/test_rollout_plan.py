"""The disaggregated placement's pure parts: which version generates which step, how a step is cut
into units, the truncated importance weights, and the weight buckets (also through a real Ray
object store, read by another process as a rollout actor reads them)."""

import math

import numpy as np
import pytest
import torch

from elastic.config import ConfigError, load_config
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.loss import grpo_loss
from elastic.rl.algorithms.off_policy import truncated_is_weights
from elastic.rl.rollout.plan import admissible, behaviour_version, generating_version, staleness, sync_due, units
from elastic.rl.rollout.weights import load_into, pack, trainable_tensors, unpack


def test_behaviour_version_by_hand():
    # k = 0: on-policy, the colocated schedule.
    assert [behaviour_version(s, 0) for s in range(5)] == [0, 1, 2, 3, 4]
    # k = 1: step s trains on version s - 1 (one-step-off-policy), step 0 on version 0.
    assert [behaviour_version(s, 1) for s in range(5)] == [0, 0, 1, 2, 3]
    # k = 2, sync every 2 steps: the smallest published version (a multiple of 2) >= s - 2.
    assert [behaviour_version(s, 2, 2) for s in range(8)] == [0, 0, 0, 2, 2, 4, 4, 6]
    # k = 3, sync every 3: versions 0, 3, 6, ...
    assert [behaviour_version(s, 3, 3) for s in range(8)] == [0, 0, 0, 0, 3, 3, 3, 6]
    for k, n in ((0, 1), (1, 1), (1, 2), (2, 2), (2, 3), (3, 4)):
        for s in range(30):
            v = behaviour_version(s, k, n)
            assert admissible(s, v, k) and v % n == 0 and sync_due(v, n), (k, n, s, v)
            assert 0 <= staleness(s, v) <= k
    assert not admissible(5, 3, 1) and not admissible(3, 4, 2)  # too old; from the future


def test_a_group_started_without_the_buffer_never_asks_for_a_version_before_its_start():
    # Resumed at step 5 from a checkpoint without generated steps (e.g. a colocated one) at k = 2:
    # steps 5 and 6 would want versions 3 and 4, which no longer exist: they use version 5.
    assert [generating_version(s, 2, 1, floor=5) for s in range(5, 9)] == [5, 5, 5, 6]
    # sync every 2 from step 5: version 5 (published at the start), then 6, 8, ...
    assert [generating_version(s, 2, 2, floor=5) for s in range(5, 11)] == [5, 5, 6, 6, 8, 8]
    for s in range(5, 30):
        assert admissible(s, generating_version(s, 3, 2, floor=5), 3)


def test_units_keep_a_rank_batch_whole_unless_the_fleet_is_larger():
    parts = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert units(parts, 1) == parts and units(parts, 2) == parts
    assert units(parts, 3) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert units([[0, 1, 2, 3, 4, 5, 6, 7]], 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sorted(k for u in units([list(range(10))], 4) for k in u) == list(range(10))  # each completion once


def test_truncated_is_weights_by_hand():
    old = torch.tensor([[math.log(0.5), math.log(0.9), 0.0], [math.log(0.2), 0.0, 0.0]])
    behav = torch.tensor([[math.log(0.25), math.log(0.1), 0.0], [math.log(0.4), 0.0, 0.0]])
    w, capped = truncated_is_weights(old, behav, torch.tensor([True, False]), cap=2.0)
    # row 0 off-policy: 0.5/0.25 = 2 (at the cap, not above), 0.9/0.1 = 9 -> 2 (capped), 1
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 1.0], [1.0, 1.0, 1.0]]))
    assert capped.tolist() == [[False, True, False], [False, False, False]]
    w, _ = truncated_is_weights(old, behav, torch.tensor([True, True]), cap=5.0)
    torch.testing.assert_close(w[1, 0], torch.tensor(0.5))  # 0.2/0.4: weights below 1 are kept


def test_grpo_loss_with_unit_weights_is_the_plain_loss_and_weights_scale_the_pg_term():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(2, 5, generator=g).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(2, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5])
    kw = dict(loss_agg="token_mean", counts=StepCounts(sequences=2, tokens=8, max_new_tokens=5), clip_low=0.2, clip_high=0.28)
    plain, _ = grpo_loss(logp, old, adv, mask, **kw)
    ones, _ = grpo_loss(logp, old, adv, mask, is_weights=torch.ones(2, 5), **kw)
    assert plain.item() == ones.item()
    half, _ = grpo_loss(logp, old, adv, mask, is_weights=torch.full((2, 5), 0.5), **kw)
    torch.testing.assert_close(half, plain * 0.5)


def _model():
    from elastic.model import ModelArgs, Transformer

    m = Transformer(ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_hidden=64, max_seq_len=32))
    m.init_weights(seed=3)
    return m


def test_pack_unpack_round_trip_in_buckets_keeps_dtypes_and_values():
    m = _model()
    tensors = trainable_tensors(m)
    tensors["extra.bf16"] = torch.randn(7, 3).to(torch.bfloat16)
    entries, buckets = pack(tensors, bucket_bytes=4096)
    assert len(buckets) > 1 and all(b.dtype == np.uint8 for b in buckets)
    assert sum(b.nbytes for b in buckets) == sum(t.numel() * t.element_size() for t in tensors.values())
    back = unpack(entries, buckets)
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    back.pop("extra.bf16")
    other = _model()
    for p in other.parameters():
        torch.nn.init.zeros_(p)
    assert load_into(other, back) == sum(t.numel() * 4 for t in back.values())
    for (n, a), (_, b) in zip(m.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(KeyError, match="not a parameter"):
        load_into(other, {"nope": torch.zeros(1)})


def test_weights_through_the_object_store_reach_another_process_unchanged(ray_local):
    ray = ray_local
    m = _model()
    entries, buckets = pack(trainable_tensors(m), bucket_bytes=1 << 20)
    refs = [ray.put(b) for b in buckets]

    @ray.remote(num_cpus=0)
    def read(entries, refs):  # as a rollout actor does: refs nested, fetched on demand
        import warnings

        import ray as r

        from elastic.rl.rollout.weights import unpack as up

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return {k: v.clone() for k, v in up(entries, r.get(list(refs))).items()}

    got = ray.get(read.remote(entries, refs))
    for n, p in m.named_parameters():
        assert torch.equal(got[n], p.detach()), n


def test_rollout_config_errors_are_one_line():
    base = ["rl.rollout.placement=disaggregated"]
    with pytest.raises(ConfigError, match=r"rl.rollout.sync_every: must be in \[1, rl.max_staleness \+ 1 = 1\]"):
        load_config(None, base + ["rl.max_staleness=0", "rl.rollout.sync_every=2"], job="grpo")
    with pytest.raises(ConfigError, match=r"rl.rollout.placement: must be colocated\|disaggregated"):
        load_config(None, ["rl.rollout.placement=remote"], job="grpo")
    with pytest.raises(ConfigError, match="rl.is_correction"):
        load_config(None, base + ["rl.is_correction=vtrace"], job="grpo")
    cfg = load_config(None, base + ["rl.max_staleness=2", "rl.rollout.sync_every=3", "rl.rollout.workers=3"], job="grpo")
    assert cfg.rl.rollout.workers == 3
