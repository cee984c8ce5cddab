"""Reward-model training: the DPO job's pairs and order, a scalar score head, a Bradley-Terry loss.

The model is the starting policy's backbone with `output` replaced by a score head
(`model.num_labels: 1`, elastic/model/llama.py): r(x, y) is the head's value at the last token
of prompt + answer (the answer ends with EOS; transformers' *ForSequenceClassification pools
the same token). What differs from DPO is only the loss and the absence of a reference model:
pairs come from the same pair cursor (resumable, the same at any world size), micro-batches
hold 2 rows per pair (chosen, rejected) and the loop divides the summed loss by the global pair
count.

Loss per pair (TRL RewardTrainer; Llama 2's margin; Eisenstein et al.'s centring):

    l = -log sigmoid(r_c - r_r - m) + c * (r_c + r_r)^2

with m the pair's margin (`reward_model.margin_field`, else 0) and c =
`reward_model.center_rewards_coefficient`. Metrics: loss, accuracy (r_c > r_r, ties wrong),
mean chosen / rejected score, mean margin r_c - r_r; on held-out pairs every eval.every_steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from elastic.data.preference import PairSet
from elastic.rl.dpo import DPOJob, pair_batch
from elastic.train.step import LossFn, LossOutput, Micro, batch_attention

STAT_KEYS = ("pairs", "correct", "chosen_score_sum", "rejected_score_sum", "margin_sum")


@dataclass
class BTTerms:
    losses: torch.Tensor  # [P], differentiable
    margins: torch.Tensor  # [P] r_c - r_r, detached


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor] = None,
                       center_coef: float = 0.0) -> BTTerms:
    """Per-pair loss from scores chosen [P], rejected [P] (and margin [P]); see the module doc."""
    d = chosen - rejected
    losses = -F.logsigmoid(d - margin if margin is not None else d)
    if center_coef:
        losses = losses + center_coef * (chosen + rejected) ** 2
    return BTTerms(losses, d.detach())


def last_token_index(doc_ids: torch.Tensor) -> torch.Tensor:
    """[B] index of each right-padded row's last real token (doc id >= 0), without a host sync."""
    real = (doc_ids >= 0).long()
    pos = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    return (pos * real).argmax(dim=1)


def pair_scores(model, mb: Micro) -> torch.Tensor:
    """[2m] fp32 scores of `pair_batch` rows (chosen, rejected alternating): the head at each
    row's last token, only those positions through the head."""
    B, T = mb["tokens"].shape
    flat = torch.arange(B, device=mb["tokens"].device) * T + last_token_index(mb["doc_ids"])
    meta = batch_attention(model, mb)
    return model(mb["tokens"], mb["positions"], mb["doc_ids"], meta, select=flat)[:, 0].float()


def make_rm_loss(r) -> LossFn:
    """The loss_fn of a reward-model step (`r` = cfg.reward_model). A micro-batch is `pair_batch`
    plus `margin` [m] (optional) and `weight` [m] (1, or 0 for padding pairs in eval)."""

    def loss(model, mb: Micro) -> LossOutput:
        s = pair_scores(model, mb)
        sc, sr = s[0::2], s[1::2]
        terms = bradley_terry_loss(sc, sr, mb["margin"].float() if "margin" in mb else None, r.center_rewards_coefficient)
        w = mb["weight"].float() if "weight" in mb else torch.ones_like(terms.losses)
        total = (terms.losses * w).sum()
        stats = {"loss_sum": total.detach(), "pairs": w.sum(), "correct": ((terms.margins > 0).float() * w).sum(),
                 "chosen_score_sum": (sc.detach() * w).sum(), "rejected_score_sum": (sr.detach() * w).sum(),
                 "margin_sum": (terms.margins * w).sum()}
        return LossOutput(total, stats)

    return loss


def summarize(s: Dict[str, float], prefix: str = "") -> Dict[str, float]:
    n = max(s.get("pairs", 0.0), 1e-12)
    return {f"{prefix}accuracy": s["correct"] / n, f"{prefix}score_chosen": s["chosen_score_sum"] / n,
            f"{prefix}score_rejected": s["rejected_score_sum"] / n, f"{prefix}score_margin": s["margin_sum"] / n}


class RewardModelJob(DPOJob):
    """DPOJob's pairs, cursor, held-out split and evaluation schedule; no reference model."""

    wait_phase = "data_wait"

    def _reference_model(self):
        return None

    def start(self, ctx, state: Dict[str, Any]) -> None:
        self.pre = None
        super().start(ctx, state)
        self.ref_model = None
        self.rm = ctx.cfg.reward_model

    def _micro_batches(self, pairs: PairSet, idx: Sequence[int], table: Optional[np.ndarray],
                       weights: Optional[Sequence[float]] = None) -> List[Dict[str, np.ndarray]]:
        out = []
        for s in range(0, len(idx), self.micro):
            part = list(idx[s:s + self.micro])
            b = pair_batch(pairs, part)
            if pairs.margins is not None:
                b["margin"] = pairs.margins[part].astype(np.float32)
            if weights is not None:
                b["weight"] = np.asarray(weights[s:s + self.micro], np.float32)
            out.append(b)
        return out

    def loss_fn(self) -> LossFn:
        return make_rm_loss(self.rm)

    def step_metrics(self) -> Dict[str, Any]:
        m: Dict[str, Any] = {"pairs_consumed": self._cursor}
        if self._stats.get("pairs"):
            m.update(summarize(self._stats))
        bad = self.ctx.config.get("bad_rows_total")
        if bad:
            m["bad_rows"] = bad
        return m

    def _heldout_reference(self, held: PairSet, n: int) -> None:
        return None

    def evaluate(self, step: int) -> Dict[str, Any]:
        """Held-out pairs (the first `eval.samples`, DPOJob.heldout_sums): loss, pairwise accuracy, scores."""
        total = self.heldout_sums(step, STAT_KEYS)
        if total is None:
            return {}
        return {"heldout_loss": total["loss_sum"] / max(total["pairs"], 1e-12), **summarize(total, "heldout_"),
                "heldout_pairs": int(round(total["pairs"]))}


def rm_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for reward-model training: the shared loop with the reward-model job."""
    from elastic.train.loop import run_worker

    run_worker(config, RewardModelJob)


@torch.no_grad()
def score_sequences(model, seqs: Sequence[Sequence[int]], batch: int = 32) -> np.ndarray:
    """[n] fp32 scores of token sequences (prompt + answer each) under a scalar-head model:
    right-padded batches of similar length (sorted, so little padding), the head read at each
    row's last token, one host transfer per batch."""
    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = np.zeros(len(seqs), np.float32)
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        L = max(1, max(len(seqs[i]) for i in idx))
        tokens = np.zeros((len(idx), L), np.int64)
        doc = np.full((len(idx), L), -1, np.int64)
        pos = np.zeros((len(idx), L), np.int64)
        for b, i in enumerate(idx):
            n = len(seqs[i])
            tokens[b, :n] = seqs[i]
            doc[b, :n] = 0
            pos[b, :n] = np.arange(n)
        from elastic.train.step import to_device

        mb = to_device({"tokens": tokens, "doc_ids": doc, "positions": pos}, device)
        out[idx] = pair_scores(model, mb).cpu().numpy()
    return out
