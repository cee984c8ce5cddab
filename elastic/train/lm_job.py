"""Language-modelling job (pretraining and SFT): packed samples from the shard cache, token
cross-entropy on the targets packing marked.

Pretraining and SFT differ only in the data plan (which documents, which tokens carry loss);
both take global step s's samples from stream positions [s·B, (s+1)·B) through the global data
cursor, so a resized or restarted run trains on the same samples at any world size. Each rank
reads only its own B/W rows of every global batch from the cache (elastic/data/reader.py); the
run's store builder (`config["store"]`) tokenizes the shards, once, on the cluster's CPUs.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator

import numpy as np
import torch

from elastic.data.cursor import Cursor
from elastic.data.documents import BadRows
from elastic.data.mixture import MixCursor, MixedStream, MixturePlan
from elastic.data.pipeline import DataPlan
from elastic.data.reader import RankBatches, SampleStream, first_samples
from elastic.train.job import Job, Update, WorkerContext
from elastic.data.packing import IGNORE
from elastic.train.step import (PER_DOCUMENT_BACKENDS, LossFn, causal_lm_loss, label_count, padding_free, split_micro,
                                to_device)


class LMJob(Job):
    state_keys = ("cursor", "bad_rows")

    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        cfg = ctx.cfg
        self.ctx = ctx
        self.plan: DataPlan = ctx.config["plan"]
        self.B = cfg.train.global_batch_size
        self.micro = cfg.train.micro_batch_size
        self.per_rank = self.B // ctx.world_size
        self.store, self.cache_root = ctx.config["store"], ctx.config["cache_root"]
        if isinstance(self.plan, MixturePlan):  # data.mixture: one stream per source, mixed per step
            streams = [SampleStream(p, name, self.store, self.cache_root) for name, p in self.plan.store_plans().items()]
            stream = MixedStream(streams, self.plan.weights, cfg.run.seed)
            cursor = MixCursor.from_dict(state.get("cursor") or {}, len(streams))
        else:
            cursor = Cursor.from_dict(state["cursor"]) if "cursor" in state else Cursor()
            stream = SampleStream(self.plan, "train", self.store, self.cache_root)
        self.batches = RankBatches(stream, cursor, self.B, ctx.rank, ctx.world_size, cfg.data.prefetch_steps)
        self.bad_total = BadRows.from_dict(state.get("bad_rows", {}), keep=self.plan.report_bad_rows)
        self._eval_cache = None
        # Per-document attention: each micro-batch trains its real tokens only, in one row
        # (the SFT job's rows were ~11% padding: that much less compute per step).
        # Not under pipeline stages: the schedule splits a micro-batch's rows into its pieces.
        self.padding_free = getattr(ctx.model, "attention_backend", None) in PER_DOCUMENT_BACKENDS and ctx.pipeline is None

    def updates(self, step: int) -> Iterator[Update]:
        b = self.batches.next()
        self.bad_total.merge(b.bad_rows)  # the whole global batch's, identical on every rank
        local = {k: b.rows[k] for k in ("tokens", "positions", "doc_ids", "labels")}
        micro = split_micro(local, self.micro)
        if self.padding_free:
            micro = [padding_free(mb) for mb in micro]
        yield Update(micro_batches=micro, units=label_count(local),
                     tokens=int(b.rows["n_real"].sum()), sample_ids=b.rows["sample_id"].tolist())

    def loss_fn(self) -> LossFn:
        return causal_lm_loss

    def state(self) -> Dict[str, Any]:
        return {"cursor": self.batches.cursor.to_dict(), "bad_rows": self.bad_total.to_dict()}

    def step_metrics(self) -> Dict[str, Any]:
        return {"samples_consumed": self.batches.cursor.consumed, "bad_rows": self.bad_total.total}

    def evaluate(self, step: int) -> Dict[str, Any]:
        """Held-out loss over a fixed set of packed samples (the first `eval.samples` of the
        held-out stream), split over ranks; the sum over all of them does not depend on the
        split. Every rank runs the same number of forward passes (FSDP gathers per forward)."""
        ev, plan = self.ctx.cfg.eval, self.ctx.config.get("eval_plan")
        if ev.every_steps <= 0 or (step % ev.every_steps and step != self.ctx.cfg.train.steps):
            return {}
        out = self._eval_tasks()
        if plan is None:
            return out
        rows = self._eval_rows(plan, ev.samples)
        world, rank, device = self.ctx.world_size, self.ctx.rank, self.ctx.device
        per_rank = -(-len(rows["tokens"]) // world)
        mine = {k: v[rank::world] for k, v in rows.items()}
        pad = per_rank - len(mine["tokens"])
        if pad:  # dummy rows with no targets keep every rank's forward count equal
            mine = {k: np.concatenate([v, v[:1].repeat(pad, 0)]) for k, v in mine.items()}
            mine["labels"][-pad:] = IGNORE
        loss_sum = 0.0
        with torch.no_grad():
            for mb in split_micro(mine, self.micro):
                m = to_device(mb, device)
                if self.ctx.pipeline is not None:  # forward through the stages; every stage gets the sum
                    loss_sum += float(self.ctx.pipeline.nll_sum(m["tokens"], m["labels"], m["positions"], m["doc_ids"]))
                else:
                    loss_sum += float(causal_lm_loss(self.ctx.model, m).loss_sum)
        self.count_forward(label_count(mine))  # tokens with a target (the dummy rows have none)
        total, count = self.ctx.comm.sum([loss_sum, label_count(mine)])
        val = total / max(count, 1)
        return {"val_loss": val, "val_ppl": math.exp(min(val, 50.0)), "val_tokens": int(count), **out}

    def _eval_tasks(self) -> Dict[str, Any]:
        """eval.tasks on the live model (elastic/eval/in_training.py); {} when none."""
        tasks = self.ctx.config.get("eval_tasks") or []
        if not tasks:
            return {}
        if getattr(self, "_task_hook", None) is None:
            from elastic.eval.evaluate import TokenizerView
            from elastic.eval.in_training import TaskHook

            self._task_hook = TaskHook(tasks, TokenizerView.from_info(self.plan.tokenizer), self.plan.seq_len)
        return self._task_hook.run(self.ctx.model, self.ctx.rank, self.ctx.world_size, self.ctx.comm, self.ctx.device)

    def _eval_rows(self, plan: DataPlan, n: int) -> Dict[str, np.ndarray]:
        if self._eval_cache is None:
            stream = SampleStream(plan, "eval", self.store, self.cache_root)
            rows = first_samples(stream, n)
            stream.close()
            if not len(rows["tokens"]):
                raise RuntimeError("the held-out data has no samples (eval.source / eval.fraction)")
            self._eval_cache = {k: rows[k] for k in ("tokens", "positions", "doc_ids", "labels")}
        return self._eval_cache

    def close(self) -> None:
        self.batches.close()
        if self.ctx.leader and self.bad_total.total:
            print(f"[elastic] {self.bad_total.total} rows skipped or cut {self.bad_total.counts}; first: {self.bad_total.examples}")
