"""The pipeline bubble of a run, measured per stage, beside its theory (issue 59, item 6).

Why: a pipelined step's time holds the stages' compute and the time a rank waits on its
neighbours (the bubble, plus p2p). The report should say which, from the run itself, not from a
separate benchmark.

Per pp rank and step (elastic/train/loop.py writes them to metrics.jsonl on rank 0):

  busy_s       wall seconds inside the rank's PipelineStage forward/backward chunks
               (`forward_one_chunk`, `backward_one_chunk`, `backward_weight_one_chunk`, the
               last stage's loss), FSDP's gathers and reduce-scatters inside them included; on
               CUDA from events on the compute stream, read at the step's end (no extra host
               sync); the schedule's waits for a neighbour's activation or gradient are outside
  pipeline_s   the `pipeline` phase: every schedule step of the optimizer step, p2p and waits
               included, and the tied embedding's gradient sum
  bubble       1 - busy_s / pipeline_s, per stage; `pp_bubble` is the mean over the pp ranks
  idle_s       mean over the pp ranks of (pipeline_s - busy_s): the step seconds the bubble cost
  theory       (p - 1) / (m + p - 1) for gpipe and 1f1b; (p - 1) / (v m + p - 1) for the
               interleaved schedules with v stages per rank (Megatron-LM's bubble); m is
               `parallel.pp_microbatches` (the pieces of one schedule step)
  mem_gib      each pp rank's peak memory (CUDA: max allocated; CPU: the process's peak RSS)

bench/pp_bubble.py measures the same share with the stages timed alone instead.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from elastic.train.comm import Comm
from elastic.train.timing import StepTimer

BUSY_PHASE = "pp_busy"
_CHUNKS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


def bubble_theory(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The schedule's idle share of a step: (p - 1) / (v m + p - 1), v = 1 for one stage per
    rank (GPipe, 1F1B)."""
    v = virtual if schedule.startswith("interleaved") or schedule == "looped_bfs" else 1
    return (pp - 1) / (v * microbatches + pp - 1)


def time_chunks(stage: Any, timer: Callable[[], Optional[StepTimer]]) -> None:
    """Wrap one PipelineStage's chunk methods (the schedule calls them on the instance) so that
    their time accumulates as the `pp_busy` phase of `timer()` when it returns a StepTimer."""
    for name in _CHUNKS:
        fn = getattr(stage, name, None)
        if fn is None:
            continue

        def timed(*args, _fn=fn, **kwargs):
            t = timer()
            if t is None:
                return _fn(*args, **kwargs)
            with t.phase(BUSY_PHASE):
                return _fn(*args, **kwargs)

        setattr(stage, name, timed)


def stage_figures(pp_comm: Comm, phases: Dict[str, float], mem_gib: float, *, schedule: str, microbatches: int,
                  virtual: int) -> Dict[str, Any]:
    """The step's per-stage figures, gathered over the pp group (collective: every pp rank calls
    it after reading its timer). Keys (`pp_` in metrics.jsonl): the module docstring's."""
    rows = pp_comm.gather([phases.get(f"{BUSY_PHASE}_s", 0.0), phases.get("pipeline_s", 0.0), mem_gib])
    busy: List[float] = [float(x) for x in rows[:, 0]]
    pipe: List[float] = [float(x) for x in rows[:, 1]]
    bubble = [max(0.0, 1.0 - b / p) if p > 0 else 0.0 for b, p in zip(busy, pipe)]
    pp = len(busy)
    return {"pp_bubble": sum(bubble) / pp, "pp_bubble_theory": bubble_theory(schedule, pp, microbatches, virtual),
            "pp_idle_s": sum(max(0.0, p - b) for b, p in zip(busy, pipe)) / pp,
            "pp_stage_bubble": bubble, "pp_stage_busy_s": busy, "pp_stage_pipeline_s": pipe,
            "pp_stage_mem_gib": [float(x) for x in rows[:, 2]],
            "pp_schedule": schedule, "pp_microbatches": microbatches, "pp_virtual_stages": virtual}


__all__ = ["BUSY_PHASE", "bubble_theory", "stage_figures", "time_chunks"]
