"""No host syncs inside a training step's forward and backward (CPU guard for the GPU).

On CUDA, an op whose result the host must read (`.item()`, `.tolist()`, `nonzero`, a boolean
mask's size) waits for every kernel queued before it: the step loses its overlap with the host.
A CPU run pays nothing for it, so it goes unnoticed here. The ops that force such a read are
the same on every device (`aten._local_scalar_dense`, `aten.nonzero`, ...): counting them under
a dispatch mode on CPU finds the syncs a GPU would pay for.

The one allowed sync of an optimizer update is in `train_step` after backward (the summed
statistics and gradient norm the skip decision needs): it is not in what is measured here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elastic.config import from_dict
from elastic.model.attention import build_attention_metadata, host_doc_spans
from elastic.rl.dpo import make_dpo_loss, pair_batch
from elastic.rl.grpo import make_grpo_loss
from elastic.train.loop import build_model
from elastic.train.step import causal_lm_loss, to_device
from tests.test_fsdp_equivalence import CFG, fixed_global_batch
from tests.test_grpo_update import rollouts

SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2",
           "unique_consecutive", "repeat_interleave", "item", "allclose", "masked_scatter", "index_put_with_bool_mask"}


class SyncCounter(TorchDispatchMode):
    """Counts dispatched aten ops that make the host wait for the device."""

    def __init__(self):
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING:
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


def _syncs(fn) -> Counter:
    mode = SyncCounter()
    with mode:
        fn()
    return mode.seen


def test_counter_sees_a_host_sync():
    """The guard can fail: `.item()` and `nonzero` are seen."""
    x = torch.arange(5.0)
    seen = _syncs(lambda: (x.sum().item(), torch.nonzero(x > 2)))
    assert seen["_local_scalar_dense"] == 1 and seen["nonzero"] == 1


def _model(attention: str = "sdpa_mask"):
    cfg = from_dict({**CFG, "model": {**CFG["model"], "attention": attention}})
    model, _, _ = build_model(cfg, torch.device("cpu"))
    return model


@pytest.mark.parametrize("attention", ["sdpa_mask", "sdpa_docs"])
def test_language_model_forward_backward_has_no_host_sync(attention):
    model = _model(attention)
    gb = fixed_global_batch(0)
    mb = to_device({k: gb[k][:4] for k in ("tokens", "positions", "doc_ids", "labels")}, torch.device("cpu"))
    seen = _syncs(lambda: causal_lm_loss(model, mb).loss_sum.backward())
    assert not seen, f"host syncs in the LM step's forward/backward: {dict(seen)}"


@pytest.mark.parametrize("backend", ["torch_varlen", "flash_varlen"])
def test_varlen_metadata_from_host_spans_has_no_host_sync(backend):
    """The varlen kernels need the longest document as a Python int: taken on the host by
    `to_device`, never from a device tensor (which was one sync per forward)."""
    gb = fixed_global_batch(0)
    mb = to_device({k: gb[k][:4] for k in ("tokens", "positions", "doc_ids", "labels")}, torch.device("cpu"))
    seen = _syncs(lambda: build_attention_metadata(mb["doc_ids"], backend, (mb["_cu_seqlens"], mb["_max_seqlen"])))
    assert not seen, dict(seen)
    # ... and the host spans are the device computation's
    without = build_attention_metadata(mb["doc_ids"], backend)
    meta = build_attention_metadata(mb["doc_ids"], backend, (mb["_cu_seqlens"], mb["_max_seqlen"]))
    assert torch.equal(meta.cu_seqlens, without.cu_seqlens) and meta.max_seqlen == without.max_seqlen
    assert _syncs(lambda: build_attention_metadata(mb["doc_ids"], backend))  # the device path does sync


def test_host_doc_spans_match_the_device_spans():
    doc = np.array([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 5, 5], [1, 2, 3, 3, 4, 4]])
    cu, longest = host_doc_spans(doc)
    assert cu.tolist() == [0, 2, 5, 6, 12, 13, 14, 16, 18] and longest == 6
    assert cu.dtype == np.int32


def test_grpo_and_dpo_forward_backward_have_no_host_sync():
    model = _model()
    cfg = from_dict({**CFG, "rl": {"loss_agg": "token_mean", "kl_coef": 0.0}})
    batch, counts = rollouts(0)
    mb = to_device({k: v[:4] for k, v in batch.items()}, torch.device("cpu"))
    grpo = make_grpo_loss(cfg.rl, lambda: counts)
    seen = _syncs(lambda: grpo(model, mb).loss_sum.backward())
    assert not seen, f"host syncs in the GRPO loss: {dict(seen)}"

    rng = np.random.default_rng(0)
    pairs = _pairs(rng)
    b = pair_batch(pairs, [0, 1])
    b["ref_logp"] = rng.normal(-20, 1, size=4).astype(np.float32)
    dmb = to_device(b, torch.device("cpu"))
    dpo = make_dpo_loss(from_dict({**CFG}).dpo)
    model.zero_grad()
    seen = _syncs(lambda: dpo(model, dmb).loss_sum.backward())
    assert not seen, f"host syncs in the DPO loss: {dict(seen)}"


def _pairs(rng):
    """Two preference pairs (prompt, chosen, rejected) in the form `pair_batch` reads."""
    from elastic.data.preference import PairSet

    seqs = [rng.integers(2, 300, size=n).astype(np.int32) for n in (5, 7, 4, 6, 3, 8)]
    spans, off = [], 0
    for pair in (seqs[:3], seqs[3:]):
        row = []
        for s in pair:
            row.append([off, off + len(s)])
            off += len(s)
        spans.append(row)
    return PairSet(np.concatenate(seqs), np.array(spans, np.int64))
