"""Pipeline parallelism over the `pp` axis: stages, schedules, the loss and the step (issue 59).

`torch.distributed.pipelining` does the send/recv and the schedule; this module decides which
stages a rank holds, builds the schedule by name, makes the loss of a pipelined step equal the
unsplit model's token-mean loss, and sums the gradients of a tied embedding held by two stages.

Stage placement (torchtitan's): `pp` ranks x `virtual` stages each = pp * virtual stages; rank r
holds stages r, r + pp, r + 2 pp, ... (the loop that interleaved 1F1B and looped BFS expect). The
first stage (embedding) is always on pp rank 0 and the last (norm + output) on pp rank pp - 1.

The loss: each micro-batch's loss is its *sum* of token NLLs divided by the step's number of
learned tokens (set before every step, `TokenMeanLoss.tokens`), and the schedule does not rescale
gradients (`scale_grads=False`): so the step's gradient is the whole batch's token-mean
gradient whatever the micro-batches' token counts (a per-micro-batch mean would weight a
micro-batch of few learned tokens like a full one).

In a run (elastic/train/loop.py) the stages are FSDP-sharded over the data-parallel axis of the
worker's mesh (elastic/train/mesh.py), whose pp group and tied pair this takes, and
`pipeline_train_step` is the loop's step. Pretraining and SFT; see docs/parallelism.md.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleLoopedBFS)

from elastic.config.pipeline_layout import PP_SCHEDULES, pipeline_unsupported
from elastic.data.packing import IGNORE
from elastic.model.llama import Transformer
from elastic.model.stages import StageModel, TransformerStage, stage_ranges
from elastic.train.comm import Comm
from elastic.train.pipeline_bubble import BUSY_PHASE, time_chunks
from elastic.train.step import StepOutput, to_device
from elastic.train.timing import StepTimer

# name -> (schedule class, several stages per rank?); the names and the check are the config's
# (elastic/config/pipeline_layout.py), so a bad layout stops before any worker starts.
SCHEDULES: Dict[str, tuple] = {
    "gpipe": (ScheduleGPipe, False),
    "1f1b": (Schedule1F1B, False),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, True),
    "looped_bfs": (ScheduleLoopedBFS, True),
    "interleaved_zero_bubble": (ScheduleInterleavedZeroBubble, True),
}
assert {k: v[1] for k, v in SCHEDULES.items()} == PP_SCHEDULES
check_layout = pipeline_unsupported


def rank_stages(pp_rank: int, pp: int, virtual: int) -> List[int]:
    """The stage indices pp rank `pp_rank` holds."""
    return [pp_rank + k * pp for k in range(virtual)]


class TokenMeanLoss:
    """loss_fn(logits [b, T, V], labels [b, T]) for the last stage: Σ NLL of the micro-batch's
    learned tokens / `tokens` (the step's normaliser, set before each step: the whole step's
    learned-token count, over every data-parallel rank in a training run). `nll` collects the
    detached Σ NLL of each micro-batch (the step's loss_sum statistic)."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | float = 1
        self.nll: List[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        nll = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        self.nll.append(nll.detach())
        return nll / self.tokens


class Pipeline:
    """The schedule that runs one pp rank's stages (`StageModel`, elastic/model/stages.py).

    `stages`: this rank's stages, materialised (and FSDP-sharded over the data-parallel axis in
    a real run: torch's PipelineStage reduce-scatters an FSDP stage's gradients after its last
    micro-batch). `group`: the pp process group (ranks in stage order). `tied_group`: the pair
    of pp ranks holding the first and the last stage (the mesh's, elastic/train/mesh.py
    `tied_group`: None on a middle stage; "auto" makes it here from `group`, collectively). step(tokens, labels, positions, doc_ids) runs one
    pipelined forward + backward of a [B, T] batch in `microbatches` pieces and returns the
    step's loss on the last stage (None elsewhere)."""

    def __init__(self, stages: StageModel, group: dist.ProcessGroup, device: torch.device, *, microbatches: int = 4,
                 schedule: str = "1f1b", tied_group: Any = "auto"):
        pp, pp_rank = dist.get_world_size(group), dist.get_rank(group)
        virtual = len(stages.indices)
        why = check_layout(stages.args.n_layers, pp, virtual, microbatches, schedule)
        if why:
            raise ValueError(why)
        if stages.indices != rank_stages(pp_rank, pp, virtual):
            raise ValueError(f"pp rank {pp_rank} holds stages {stages.indices}, not {rank_stages(pp_rank, pp, virtual)}")
        self.model, self.group, self.pp, self.pp_rank, self.device = stages, group, pp, pp_rank, device
        self.n_stages, self.indices, self.microbatches = stages.n_stages, stages.indices, microbatches
        self.modules: List[TransformerStage] = stages.stages
        self.stages = [PipelineStage(m, i, self.n_stages, device, group=group) for m, i in zip(self.modules, self.indices)]
        self.loss = TokenMeanLoss()
        # The stages' compute time while `busy` is set (a training step): the bubble's measure
        # (elastic/train/pipeline_bubble.py).
        self.busy: Optional[StepTimer] = None
        self.schedule_name, self.virtual = schedule, virtual
        for st in self.stages:
            time_chunks(st, lambda: self.busy)
        cls, multi = SCHEDULES[schedule]
        self.schedule = (cls(self.stages, n_microbatches=microbatches, loss_fn=self._loss, scale_grads=False) if multi
                         else cls(self.stages[0], n_microbatches=microbatches, loss_fn=self._loss, scale_grads=False))
        self.tied = stages.args.tie_embeddings
        self.has_first, self.has_last = stages.has_first, stages.has_last
        self._tied_comm = None
        if self.tied and pp > 1:
            g = _tied_group(group) if tied_group == "auto" else tied_group
            if self.has_first or self.has_last:
                self._tied_comm = Comm(device, group=g)
        self.pp_comm = Comm(device, group=group)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.busy is None:
            return self.loss(logits, labels)
        with self.busy.phase(BUSY_PHASE):
            return self.loss(logits, labels)

    @classmethod
    def of_model(cls, model: Transformer, group: dist.ProcessGroup, device: torch.device, *, virtual: int = 1,
                 microbatches: int = 4, schedule: str = "1f1b") -> "Pipeline":
        """This rank's stages of a whole (unsharded) `model`, in a pipeline (tests, tools)."""
        pp, pp_rank = dist.get_world_size(group), dist.get_rank(group)
        why = check_layout(model.args.n_layers, pp, virtual, microbatches, schedule)
        if why:
            raise ValueError(why)
        return cls(StageModel(model, pp * virtual, rank_stages(pp_rank, pp, virtual)), group, device,
                   microbatches=microbatches, schedule=schedule)

    def parameters(self):
        return self.model.parameters()

    def named_parameters(self):
        """(full-model name, parameter) of this rank's stages; a tied copy of the embedding on
        the last stage is named `output.weight`."""
        return self.model.named_parameters()

    def _run(self, train: bool, tokens, labels, positions, doc_ids, normaliser, sync: bool = True) -> Optional[torch.Tensor]:
        self.loss.tokens = (labels != IGNORE).sum().clamp(min=1) if normaliser is None else normaliser  # no host sync
        self.loss.nll = []
        losses: List[torch.Tensor] = []
        kw = {"positions": positions, "doc_ids": doc_ids}
        run = self.schedule.step if train else self.schedule.eval
        if self.has_first:
            run(tokens, target=labels, losses=losses, **kw)
        else:
            run(target=labels, losses=losses, **kw)
        if train and sync:
            self.sync_tied_grads()
        return torch.stack(losses).sum().detach() if self.has_last and losses else None

    def step(self, tokens: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, doc_ids: torch.Tensor,
             normaliser: Optional[torch.Tensor | float] = None, sync_tied: bool = True) -> Optional[torch.Tensor]:
        """Forward + backward; gradients of Σ NLL / `normaliser` (default: this batch's learned
        tokens) accumulate into this rank's parameters. `sync_tied=False` leaves the tied pair's
        gradient sum to the caller (`sync_tied_grads` once after accumulating several steps:
        summing after each would count the earlier steps' gradients again)."""
        return self._run(True, tokens, labels, positions, doc_ids, normaliser, sync_tied)

    @torch.no_grad()
    def nll_sum(self, tokens: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor,
                doc_ids: torch.Tensor) -> torch.Tensor:
        """Forward only: Σ NLL of the learned tokens of a [B, T] batch, on every pp rank (the
        last stage's value, summed over the pp group: the others add zero)."""
        pad = -len(tokens) % self.microbatches
        if pad:  # whole pieces for the schedule: dummy rows with no learned token
            def more(t, fill=None):
                extra = t[:1].expand(pad, *t.shape[1:]).clone()
                return torch.cat([t, extra.fill_(fill) if fill is not None else extra])
            tokens, positions, doc_ids, labels = more(tokens), more(positions), more(doc_ids), more(labels, IGNORE)
        self._run(False, tokens, labels, positions, doc_ids, 1.0)
        nll = torch.stack(self.last_nll()).sum() if self.has_last and self.loss.nll else torch.zeros((), device=self.device)
        total = nll.double().reshape(1)
        self.pp_comm.all_reduce_(total)
        return total[0]

    def last_nll(self) -> List[torch.Tensor]:
        """The Σ NLL of each micro-batch of the last step (the schedule's first step also runs a
        shape-inference forward through the loss: its entry is not one of them)."""
        return self.loss.nll[-self.microbatches:]

    def sync_tied_grads(self) -> None:
        """A tied model's embedding (first stage) and output projection (last stage) are one
        weight: each gets the sum of both gradients (the local shards of the same data-parallel
        coordinate: both are sharded alike)."""
        if not self.tied:
            return
        first = next(m for m in self.modules if m.is_first) if self.has_first else None
        last = next(m for m in self.modules if m.is_last) if self.has_last else None
        if first is not None and first is last:
            return  # one stage holds both: one parameter, its gradient already the sum
        if self.pp == 1:
            total = _local(first.tok_embeddings.weight.grad) + _local(last.output.weight.grad)
            _local(first.tok_embeddings.weight.grad).copy_(total)
            _local(last.output.weight.grad).copy_(total)
            return
        if first is not None:
            self._tied_comm.all_reduce_(_local(first.tok_embeddings.weight.grad))
        if last is not None:
            self._tied_comm.all_reduce_(_local(last.output.weight.grad))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view), a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _tied_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The two ranks of the pp group that hold the first and the last stage (pp ranks 0 and
    pp - 1). Every rank of the job takes part in creating it (new_group is collective)."""
    ranks = dist.get_process_group_ranks(group)
    return dist.new_group([ranks[0], ranks[-1]])


def pipeline_train_step(pipe: Pipeline, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Dict[str, np.ndarray]],
                        normaliser: float, grad_clip: float, dp_comm: Comm, timer: Optional[StepTimer] = None,
                        poison: bool = False) -> StepOutput:
    """`train_step` (elastic/train/step.py) for a pipelined model: each micro-batch of rows is
    one schedule step (`pipe.microbatches` pieces), gradients accumulating; then the global
    gradient norm (over the data-parallel shards and the pp stages, a tied copy counted once),
    clip, and the same skip rule. The loss is the causal LM loss (Σ NLL of the learned tokens /
    `normaliser`, the step's units over every data-parallel rank); its statistics are summed
    over the pp group (the last stage's) and the data-parallel peers, so every rank logs the
    same value."""
    device = pipe.device
    timer = timer or StepTimer(device)
    norm = float("nan") if poison else float(normaliser)
    nll = torch.zeros((), dtype=torch.float64, device=device)
    pipe.busy = timer  # the stages' own compute, as the pp_busy phase (elastic/train/pipeline_bubble.py)
    try:
        for rows in micro_batches:
            mb = to_device(rows, device)
            with timer.phase("pipeline"):  # forward + backward of every stage, p2p and bubble included
                pipe.step(mb["tokens"], mb["labels"], mb["positions"], mb["doc_ids"], normaliser=norm, sync_tied=False)
            if pipe.loss.nll:
                nll = nll + torch.stack(pipe.last_nll()).sum().double()
    finally:
        pipe.busy = None
    with timer.phase("pipeline"):
        pipe.sync_tied_grads()  # once, over the accumulated gradients
    with timer.phase("optimizer"):
        params = [p for p in pipe.model.parameters() if p.grad is not None]
        counted = [p for n, p in pipe.model.named_parameters()
                   if p.grad is not None and not (n == "output.weight" and pipe.tied and not pipe.has_first)]
        local = torch.nn.utils.get_total_norm([p.grad for p in counted], 2.0) if counted else torch.zeros((), device=device)
        if hasattr(local, "full_tensor"):
            local = local.full_tensor()
        sq = torch.stack([local.double() ** 2, nll])
        pipe.pp_comm.all_reduce_(sq)  # Σ over the stages: squared norms, and the last stage's NLL
        total_norm = sq[0].sqrt()
        stat = sq[1:2].clone()
        dp_comm.all_reduce_(stat)  # the loss over the data-parallel peers (the norm is global already)
        if grad_clip > 0 and params:
            torch.nn.utils.clip_grads_with_norm_(params, grad_clip, total_norm.to(params[0].grad.dtype))
        loss_sum, gn = torch.cat([stat, total_norm.reshape(1)]).tolist()  # one host sync
        skipped = not math.isfinite(gn) or not math.isfinite(loss_sum)
        if not skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return StepOutput({"loss_sum": loss_sum}, gn, skipped)


def full_names(model: Transformer) -> List[str]:
    """The parameter names a pipelined model's stages carry together (a tied model's last stage
    adds `output.weight`)."""
    return [n for n, _ in model.named_parameters()] + (["output.weight"] if model.args.tie_embeddings else [])


__all__ = ["SCHEDULES", "Pipeline", "TokenMeanLoss", "check_layout", "full_names", "pipeline_train_step", "rank_stages",
           "stage_ranges"]
