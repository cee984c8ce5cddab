"""Language-modelling job (pretraining and SFT): packed samples from the Ray Data stream,
token cross-entropy on the targets packing marked.

Pretraining and SFT differ only in the data plan (which documents, which tokens carry loss);
both take global step s's samples from stream positions [s·B, (s+1)·B) through the global data
cursor, so a resized or restarted run trains on the same samples at any world size.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator

import ray.train

from elastic.data.cursor import Cursor
from elastic.data.documents import BadRows
from elastic.data.pipeline import DataPlan, GlobalBatches, build_dataset, epochs_needed
from elastic.train.job import Job, Update, WorkerContext
from elastic.train.step import LossFn, causal_lm_loss, label_count, split_micro


class LMJob(Job):
    state_keys = ("cursor", "bad_rows")

    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        cfg = ctx.cfg
        self.ctx = ctx
        self.plan: DataPlan = ctx.config["plan"]
        self.B = cfg.train.global_batch_size
        self.micro = cfg.train.micro_batch_size
        self.per_rank = self.B // ctx.world_size
        cursor = Cursor.from_dict(state["cursor"]) if "cursor" in state else Cursor()
        total = cfg.train.steps * self.B
        plan = self.plan

        def make_dataset(c: Cursor):
            return build_dataset(plan, c, epochs_needed(plan, c, max(0, total - c.consumed)))

        self.batches = GlobalBatches(ray.train.get_dataset_shard("train"), make_dataset, cursor, self.B, plan.num_shards)
        self.bad_total = BadRows.from_dict(state.get("bad_rows", {}), keep=plan.report_bad_rows)

    def updates(self, step: int) -> Iterator[Update]:
        gb = self.batches.next()
        self.bad_total.merge(self.batches.take_bad_rows())
        r, n = self.ctx.rank, self.per_rank
        local = {k: gb[k][r * n:(r + 1) * n] for k in ("tokens", "positions", "doc_ids", "labels")}
        yield Update(micro_batches=split_micro(local, self.micro), units=label_count(local),
                     tokens=int(gb["n_real"][r * n:(r + 1) * n].sum()),
                     sample_ids=gb["sample_id"][r * n:(r + 1) * n].tolist())

    def loss_fn(self) -> LossFn:
        return causal_lm_loss

    def state(self) -> Dict[str, Any]:
        return {"cursor": self.batches.cursor.to_dict(), "bad_rows": self.bad_total.to_dict()}

    def step_metrics(self) -> Dict[str, Any]:
        return {"samples_consumed": self.batches.cursor.consumed, "bad_rows": self.bad_total.total}

    def close(self) -> None:
        if self.ctx.rank == 0 and self.bad_total.total:
            print(f"[elastic] skipped {self.bad_total.total} malformed rows {self.bad_total.counts}; first: {self.bad_total.examples}")
