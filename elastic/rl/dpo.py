"""The DPO job: preference pairs on the shared per-worker loop (elastic/train/loop.py), like
pretraining and GRPO; this file is only what makes DPO different.

One global step s (every rank runs the same code on its own pairs):

1. **Pairs** from the pair cursor (elastic/data/preference.py `PairStream`): stream positions
   [s·B, (s+1)·B) of seeded per-epoch permutations, rank r taking the r-th B/W of them, so a
   resumed or resized run trains on the same pairs in the same steps. The tokenized pairs came
   from the driver (`train_loop_config`, through the object store).
2. **Reference log-probs** (the job's wait phase, `reference_s`): Σ log π_ref over each answer's
   tokens, from a frozen copy of the starting policy sharded like the policy (`dpo.reference:
   model`), from the policy itself with its adapters disabled under LoRA (no second copy), or
   read from the table computed once before training (`dpo.reference: precomputed`,
   elastic/launch/dpo_reference.py).
3. **Update**: each micro-batch holds `train.micro_batch_size` pairs as 2 rows per pair (chosen,
   rejected; prompt + answer, right-padded, one document per row); the loss function sums the
   per-pair DPO losses (elastic/rl/algorithms/dpo_loss.py) and the loop divides by the global pair count B,
   so the gradient does not depend on the split over workers and micro-batches.

The job's state in the checkpoint is the pair cursor (s·B); nothing else is needed to resume,
because the order is a pure function of the step. Held-out pairs are scored every
`eval.every_steps`: loss, preference accuracy (margin > 0), margin, rewards.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from elastic.data.preference import PairSet, PairStream
from elastic.rl.algorithms.dpo_loss import answer_logprobs, dpo_loss
from elastic.train.job import Job, Update, WorkerContext
from elastic.train.step import LossFn, LossOutput, Micro, StepOutput, batch_attention, to_device

STAT_KEYS = ("pairs", "chosen_reward_sum", "rejected_reward_sum", "margin_sum", "correct", "chosen_logp_sum",
             "rejected_logp_sum")


def pair_batch(pairs: PairSet, idx: Sequence[int]) -> Dict[str, np.ndarray]:
    """Rows 2i (prompt + chosen) and 2i+1 (prompt + rejected) of each pair, right-padded to the
    longest; `amask[b, t]` is 1 where token t belongs to the answer; padding has doc id -1."""
    seqs = []
    for i in idx:
        p, c, r = pairs.pair(int(i))
        seqs += [(p, c), (p, r)]
    L = max(len(p) + len(a) for p, a in seqs)
    B = len(seqs)
    tokens = np.zeros((B, L), np.int64)
    doc = np.full((B, L), -1, np.int64)
    pos = np.zeros((B, L), np.int64)
    amask = np.zeros((B, L), np.float32)
    for b, (p, a) in enumerate(seqs):
        n = len(p) + len(a)
        tokens[b, :n] = np.concatenate([p, a])
        doc[b, :n] = 0
        pos[b, :n] = np.arange(n)
        amask[b, len(p):n] = 1.0
    return {"tokens": tokens, "doc_ids": doc, "positions": pos, "amask": amask}


def make_dpo_loss(d) -> LossFn:
    """The loss_fn of a DPO optimizer step (`d` = cfg.dpo). A micro-batch is `pair_batch` plus
    `ref_logp` [2m] (Σ log π_ref per row) and `weight` [m] (1, or 0 for padding pairs in eval)."""
    ipo = d.loss_type == "ipo"

    def loss(model, mb: Micro) -> LossOutput:
        meta = batch_attention(model, mb)
        logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], meta)
        lp = answer_logprobs(logits, mb["tokens"], mb["amask"], average=ipo)
        ref = mb["ref_logp"].to(lp.dtype)
        if ipo:  # IPO works on length-averaged log-probabilities
            ref = ref / mb["amask"][:, 1:].sum(-1).clamp_min(1.0).to(lp.dtype)
        terms = dpo_loss(lp[0::2], lp[1::2], ref[0::2], ref[1::2], d.beta, d.loss_type, d.label_smoothing)
        w = mb["weight"].to(lp.dtype) if "weight" in mb else torch.ones_like(terms.losses)
        total = (terms.losses * w).sum()
        stats = {"loss_sum": total.detach(), "pairs": w.sum(), "chosen_reward_sum": (terms.chosen_rewards * w).sum(),
                 "rejected_reward_sum": (terms.rejected_rewards * w).sum(), "margin_sum": (terms.margins * w).sum(),
                 "correct": ((terms.margins > 0).to(w.dtype) * w).sum(),
                 "chosen_logp_sum": (lp[0::2].detach() * w).sum(), "rejected_logp_sum": (lp[1::2].detach() * w).sum()}
        return LossOutput(total, stats)

    return loss


def summarize(s: Dict[str, float], prefix: str = "") -> Dict[str, float]:
    """Means per pair of summed statistics (TRL's rewards/* figures)."""
    n = max(s.get("pairs", 0.0), 1e-12)
    return {f"{prefix}rewards_chosen": s["chosen_reward_sum"] / n, f"{prefix}rewards_rejected": s["rejected_reward_sum"] / n,
            f"{prefix}reward_margin": s["margin_sum"] / n, f"{prefix}reward_accuracy": s["correct"] / n,
            f"{prefix}logps_chosen": s["chosen_logp_sum"] / n, f"{prefix}logps_rejected": s["rejected_logp_sum"] / n}


class DPOJob(Job):
    state_keys = ("pair_cursor",)
    wait_phase = "reference"

    def __init__(self) -> None:
        self._cursor = 0
        self._stats: Dict[str, float] = {}
        self._ref_s = 0.0
        self._held_ref: Optional[np.ndarray] = None

    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        import ray

        self.ctx = ctx
        cfg = ctx.cfg
        self.d = cfg.dpo
        data = ctx.config["pairs"]
        data = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        self.train: PairSet = data["train"]
        self.heldout: Optional[PairSet] = data.get("heldout")
        pre = ctx.config.get("ref_logps")
        pre = ray.get(pre) if isinstance(pre, ray.ObjectRef) else pre
        self.pre: Optional[Dict[str, np.ndarray]] = pre  # {"train": [n, 2], "heldout": [m, 2]} Σ log π_ref
        self.B, self.micro = cfg.train.global_batch_size, cfg.train.micro_batch_size
        self.stream = PairStream(len(self.train), cfg.run.seed)
        self.lora = cfg.model.lora.rank > 0
        self.ref_model = self._reference_model() if self.pre is None and not self.lora else None
        self._cursor = int(state.get("pair_cursor") or 0)

    def _reference_model(self) -> torch.nn.Module:
        """The frozen starting policy (model.init_from), sharded like the policy."""
        import dataclasses

        from elastic.train.loop import build_sharded_model, load_initial_weights, resolve_param_dtype

        cfg = self.ctx.cfg
        plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, rank=0)))
        model, _, _ = build_sharded_model(plain, self.ctx.device, resolve_param_dtype(cfg.train.param_dtype, self.ctx.device),
                                          self.ctx.mesh)
        load_initial_weights(model, plain)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    @torch.no_grad()
    def reference_logprobs(self, batch: Dict[str, np.ndarray]) -> np.ndarray:
        """Σ log π_ref over each row's answer, [2m] float32 (every rank calls it equally often)."""
        from elastic.model.lora import adapters_disabled

        t = to_device(batch, self.ctx.device)
        self.count_forward((batch["doc_ids"] >= 0).sum())
        if self.ref_model is not None:
            model, ctx = self.ref_model, contextlib.nullcontext()
        else:  # LoRA: the base is the policy with its adapters off
            model, ctx = self.ctx.model, adapters_disabled(self.ctx.model)
        with ctx:
            logits = model(t["tokens"], t["positions"], t["doc_ids"], batch_attention(model, t))
            return answer_logprobs(logits, t["tokens"], t["amask"]).float().cpu().numpy()

    def _micro_batches(self, pairs: PairSet, idx: Sequence[int], table: Optional[np.ndarray],
                       weights: Optional[Sequence[float]] = None) -> List[Dict[str, np.ndarray]]:
        out = []
        for s in range(0, len(idx), self.micro):
            part = list(idx[s:s + self.micro])
            b = pair_batch(pairs, part)
            if table is not None:
                b["ref_logp"] = table[part].reshape(-1).astype(np.float32)  # [chosen, rejected] per pair
            else:
                b["ref_logp"] = self.reference_logprobs(b)
            if weights is not None:
                b["weight"] = np.asarray(weights[s:s + self.micro], np.float32)
            out.append(b)
        return out

    def updates(self, step: int) -> Iterator[Update]:
        mine = self.stream.rank_slice(step, self.B, self.ctx.world_size, self.ctx.rank)
        idx = [i for _, i in mine]
        t0 = time.perf_counter()
        mbs = self._micro_batches(self.train, idx, None if self.pre is None else self.pre["train"])
        self._ref_s = time.perf_counter() - t0
        tokens = int(sum((b["doc_ids"] >= 0).sum() for b in mbs))
        self._cursor = (step + 1) * self.B
        yield Update(micro_batches=mbs, normaliser=float(self.B), tokens=tokens, sample_ids=[p for p, _ in mine])

    def loss_fn(self) -> LossFn:
        return make_dpo_loss(self.d)

    def observe(self, out: StepOutput) -> None:
        self._stats = dict(out.stats)

    def state(self) -> Dict[str, Any]:
        return {"pair_cursor": self._cursor}

    def step_metrics(self) -> Dict[str, Any]:
        m: Dict[str, Any] = {"pairs_consumed": self._cursor, "reference_from": "precomputed" if self.pre is not None else
                             ("adapters_off" if self.lora else "model")}
        if self._stats.get("pairs"):
            m.update(summarize(self._stats))
        bad = self.ctx.config.get("bad_rows_total")
        if bad:
            m["bad_rows"] = bad
        return m

    def evaluate(self, step: int) -> Dict[str, Any]:
        """Held-out pairs (the first `eval.samples`): DPO loss, preference accuracy (margin > 0),
        margin and rewards. Rank r scores pairs r, r+W, ...; ranks with fewer pairs pad with a
        weight-0 pair, so every rank runs the same number of forwards (FSDP gathers per forward)."""
        total = self.heldout_sums(step, STAT_KEYS)
        if total is None:
            return {}
        res = summarize(total, "heldout_")
        res = {"heldout_loss": total["loss_sum"] / max(total["pairs"], 1e-12), "heldout_accuracy": res.pop("heldout_reward_accuracy"),
               **res, "heldout_pairs": int(round(total["pairs"]))}
        return res

    def heldout_sums(self, step: int, stat_keys: Sequence[str]) -> Optional[Dict[str, float]]:
        """The loss statistics summed over the first `eval.samples` held-out pairs (all ranks),
        or None when no evaluation is due. Rank r scores pairs r, r+W, ...; ranks with fewer pad
        with a weight-0 pair, so every rank runs the same number of forwards (FSDP gathers per forward)."""
        ev, held = self.ctx.cfg.eval, self.heldout
        if held is None or not len(held) or ev.every_steps <= 0 or (step % ev.every_steps and step != self.ctx.cfg.train.steps):
            return None
        world, rank = self.ctx.world_size, self.ctx.rank
        n = min(len(held), ev.samples)
        per_rank = -(-n // world)
        idx = list(range(rank, n, world))
        weights = [1.0] * len(idx) + [0.0] * (per_rank - len(idx))
        idx += [0] * (per_rank - len(idx))
        table = self.pre["heldout"] if self.pre is not None else self._heldout_reference(held, n)
        loss_fn = self.loss_fn()
        sums = {k: 0.0 for k in ("loss_sum",) + tuple(stat_keys)}
        with torch.no_grad():
            for b in self._micro_batches(held, idx, table, weights):
                self.count_forward((b["doc_ids"] >= 0).sum())
                out = loss_fn(self.ctx.model, to_device(b, self.ctx.device))
                for k in sums:
                    sums[k] += float(out.stats[k])
        keys = sorted(sums)
        return dict(zip(keys, self.ctx.comm.sum([sums[k] for k in keys])))

    def _heldout_reference(self, held: PairSet, n: int) -> np.ndarray:
        """Σ log π_ref of the first n held-out pairs, [n, 2], computed once (the reference is frozen).
        Each rank scores its share; the shares are summed into the full table (zeros elsewhere)."""
        if self._held_ref is None:
            world, rank = self.ctx.world_size, self.ctx.rank
            per_rank = -(-n // world)
            idx = list(range(rank, n, world))
            pad = per_rank - len(idx)
            table = np.zeros((n, 2), np.float64)
            for s in range(0, per_rank, self.micro):
                part = (idx + [0] * pad)[s:s + self.micro]
                lp = self.reference_logprobs(pair_batch(held, part)).reshape(-1, 2)
                for j, i in enumerate(part):
                    if s + j < len(idx):
                        table[i] = lp[j]
            flat = self.ctx.comm.sum(table.reshape(-1).tolist())
            self._held_ref = np.asarray(flat, np.float64).reshape(n, 2)
        return self._held_ref


def dpo_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for DPO: the shared loop skeleton with the DPO job."""
    from elastic.train.loop import run_worker

    run_worker(config, DPOJob)
