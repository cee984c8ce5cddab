"""Pipeline parallelism over the `pp` axis: stages, schedules and the loss (issue 59, part 1).

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

The world of a Pipeline is its pp group for now (PP x DP and PP x TP meshes, where each replica's
tied pair is its own group, come with the mesh of issue 59 part 2). Not wired into the jobs yet (train.loop, checkpoint layout, elastic resize, the mesh's pp axis):
see docs/parallelism.md.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleLoopedBFS)

from elastic.data.packing import IGNORE
from elastic.model.llama import Transformer
from elastic.model.stages import TransformerStage, split_stages, stage_ranges
from elastic.train.comm import Comm

# name -> (schedule class, several stages per rank?)
SCHEDULES: Dict[str, tuple] = {
    "gpipe": (ScheduleGPipe, False),
    "1f1b": (Schedule1F1B, False),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, True),
    "looped_bfs": (ScheduleLoopedBFS, True),
    "interleaved_zero_bubble": (ScheduleInterleavedZeroBubble, True),
}


def check_layout(n_layers: int, pp: int, virtual: int, microbatches: int, schedule: str) -> Optional[str]:
    """The one-line reason a pipeline layout cannot run, naming the keys; None when it can."""
    if schedule not in SCHEDULES:
        return f"parallel.pp_schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}"
    multi = SCHEDULES[schedule][1]
    if virtual > 1 and not multi:
        return (f"parallel.pp_virtual_stages={virtual} needs a schedule with several stages per rank "
                f"({', '.join(k for k, v in SCHEDULES.items() if v[1])}), not parallel.pp_schedule={schedule}")
    stages = pp * virtual
    if n_layers % stages:
        return (f"parallel.pp={pp} x parallel.pp_virtual_stages={virtual} = {stages} stages do not divide the "
                f"model's {n_layers} layers")
    if schedule != "gpipe" and microbatches < pp:
        return (f"parallel.pp_microbatches={microbatches} is fewer than parallel.pp={pp}: "
                f"{schedule} needs at least one micro-batch per stage to fill the pipeline")
    if multi and microbatches % pp:
        return f"parallel.pp_microbatches={microbatches} must be a multiple of parallel.pp={pp} for {schedule}"
    return None


def rank_stages(pp_rank: int, pp: int, virtual: int) -> List[int]:
    """The stage indices pp rank `pp_rank` holds."""
    return [pp_rank + k * pp for k in range(virtual)]


class TokenMeanLoss:
    """loss_fn(logits [b, T, V], labels [b, T]) for the last stage: Σ NLL of the micro-batch's
    learned tokens / `tokens` (the whole step's learned-token count, set before each step)."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | int = 1

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        nll = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        return nll / self.tokens


class Pipeline:
    """This rank's stages of `model` and the schedule that runs them.

    `model` is the whole Transformer (built on the meta device in a real run: only this rank's
    stages are materialised by the caller). `group`: the pp process group (ranks in stage
    order). step(tokens, labels, positions, doc_ids) runs one pipelined forward + backward of a
    [B, T] batch in `microbatches` pieces and returns the step's token-mean loss on the last
    stage (None elsewhere)."""

    def __init__(self, model: Transformer, group: dist.ProcessGroup, device: torch.device, *, virtual: int = 1,
                 microbatches: int = 4, schedule: str = "1f1b"):
        pp, pp_rank = dist.get_world_size(group), dist.get_rank(group)
        why = check_layout(model.args.n_layers, pp, virtual, microbatches, schedule)
        if why:
            raise ValueError(why)
        self.group, self.pp, self.pp_rank = group, pp, pp_rank
        self.n_stages = pp * virtual
        self.indices = rank_stages(pp_rank, pp, virtual)
        self.modules: List[TransformerStage] = split_stages(model, self.n_stages, self.indices)
        self.stages = [PipelineStage(m, i, self.n_stages, device, group=group) for m, i in zip(self.modules, self.indices)]
        self.loss = TokenMeanLoss()
        cls, multi = SCHEDULES[schedule]
        self.schedule = (cls(self.stages, n_microbatches=microbatches, loss_fn=self.loss, scale_grads=False) if multi
                         else cls(self.stages[0], n_microbatches=microbatches, loss_fn=self.loss, scale_grads=False))
        self.tied = model.args.tie_embeddings
        self._tied_comm = Comm(device, group=_tied_group(group)) if self.tied and pp > 1 else None
        self.has_first = 0 in self.indices
        self.has_last = self.n_stages - 1 in self.indices

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()

    def named_parameters(self):
        """(full-model name, parameter) of this rank's stages; a tied copy of the embedding on
        the last stage is named `output.weight`."""
        for m in self.modules:
            yield from m.named_parameters()

    def step(self, tokens: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor,
             doc_ids: torch.Tensor) -> Optional[torch.Tensor]:
        self.loss.tokens = (labels != IGNORE).sum().clamp(min=1)  # a tensor: no host sync on a GPU
        losses: List[torch.Tensor] = []
        kw = {"positions": positions, "doc_ids": doc_ids}
        if self.has_first:
            self.schedule.step(tokens, target=labels, losses=losses, **kw)
        else:
            self.schedule.step(target=labels, losses=losses, **kw)
        self.sync_tied_grads()
        return torch.stack(losses).sum().detach() if self.has_last and losses else None

    def sync_tied_grads(self) -> None:
        """A tied model's embedding (first stage) and output projection (last stage) are one
        weight: each gets the sum of both gradients."""
        if not self.tied:
            return
        first = next(m for m in self.modules if m.is_first) if self.has_first else None
        last = next(m for m in self.modules if m.is_last) if self.has_last else None
        if first is not None and first is last:
            return  # one stage holds both: one parameter, its gradient already the sum
        if self.pp == 1:
            total = first.tok_embeddings.weight.grad + last.output.weight.grad
            first.tok_embeddings.weight.grad, last.output.weight.grad = total, total.clone()
            return
        if first is not None:
            self._tied_comm.all_reduce_(first.tok_embeddings.weight.grad)
        if last is not None:
            self._tied_comm.all_reduce_(last.output.weight.grad)


def _tied_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The two ranks of the pp group that hold the first and the last stage (pp ranks 0 and
    pp - 1). Every rank of the job takes part in creating it (new_group is collective)."""
    ranks = dist.get_process_group_ranks(group)
    return dist.new_group([ranks[0], ranks[-1]])


def full_names(model: Transformer) -> List[str]:
    """The parameter names a pipelined model's stages carry together (a tied model's last stage
    adds `output.weight`)."""
    return [n for n, _ in model.named_parameters()] + (["output.weight"] if model.args.tie_embeddings else [])


__all__ = ["SCHEDULES", "Pipeline", "TokenMeanLoss", "check_layout", "full_names", "rank_stages", "stage_ranges"]
