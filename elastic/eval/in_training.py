"""`eval.tasks` inside training: the same evaluation code on the live (FSDP-sharded) model.

Every `eval.every_steps` steps each rank scores its share of every task's items (item i goes
to rank i mod world) with `ItemEvaluator.score_items`, then one `comm.sum` of the metrics'
partial sums gives the metrics over all items, independent of the world size. FSDP gathers
parameters on every forward, so ranks agree on the number of forwards first (`comm.max`) and
those with fewer run empty ones. Log-likelihood tasks only (perplexity, multiple choice):
generation and code tasks run on the checkpoints with jobs/eval.py.

Results go to metrics.jsonl as `eval/<task>/<metric>` on the evaluation steps.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import torch
import torch.nn as nn

from elastic.eval import loglik
from elastic.eval.evaluate import ItemEvaluator, TokenizerView
from elastic.eval.metrics import from_sums, partial_sums, sums_len
from elastic.eval.spec import IN_TRAINING_TYPES, PlannedTask  # noqa: F401  (planned on the driver, without torch)


def metric_key(task: str, metric: str) -> str:
    return f"eval/{task}/{metric}"


class TaskHook:
    def __init__(self, tasks: Sequence[PlannedTask], tok: TokenizerView, max_len: int, token_budget: int = 8192):
        self.tasks, self.tok, self.max_len, self.token_budget = list(tasks), tok, max_len, token_budget

    @torch.no_grad()
    def run(self, model: nn.Module, rank: int, world: int, comm, device: torch.device) -> Dict[str, Any]:
        was_training = model.training
        model.eval()
        ev = ItemEvaluator(model, self.tok, self.max_len, self.token_budget)
        out: Dict[str, Any] = {}
        try:
            for t in self.tasks:
                mine = [(i, d, c) for i, (d, c) in enumerate(zip(t.docs, t.contexts)) if i % world == rank]
                reqs = ev.requests(t.spec, mine)
                n_fwd = loglik.forward_count(reqs, self.max_len, self.token_budget)
                most = int(comm.max([float(n_fwd)])[0])
                recs = ev.score_items(t.spec, mine) if mine else []
                for _ in range(most - n_fwd):  # keep FSDP's per-forward all-gathers in step
                    model(torch.zeros(1, 1, dtype=torch.long, device=device))
                sums = comm.sum(partial_sums(t.spec, recs) if recs else [0.0] * sums_len(t.spec))
                for k, v in from_sums(t.spec, sums).items():
                    out[metric_key(t.spec.task, k)] = v
        finally:
            model.train(was_training)
        return out
