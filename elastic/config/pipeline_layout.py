"""Which pipeline layouts can run (issue 59): pure arithmetic on `parallel.pp*` and the model's
layer count, so a bad layout stops at config time with one line naming the keys, before any
worker starts. The schedules themselves are elastic/train/pipeline.py's (torch.distributed.pipelining).
"""

from __future__ import annotations

from typing import Dict, Optional

# schedule name -> several (virtual) stages per rank?
PP_SCHEDULES: Dict[str, bool] = {
    "gpipe": False,
    "1f1b": False,
    "interleaved_1f1b": True,
    "looped_bfs": True,
    "interleaved_zero_bubble": True,
}


def pipeline_unsupported(n_layers: int, pp: int, virtual: int, microbatches: int, schedule: str) -> Optional[str]:
    """The one-line reason a pipeline layout cannot run, naming the keys; None when it can.

    >>> pipeline_unsupported(4, 2, 1, 4, "1f1b") is None
    True
    >>> pipeline_unsupported(6, 2, 2, 4, "interleaved_1f1b")
    "parallel.pp=2 x parallel.pp_virtual_stages=2 = 4 stages do not divide the model's 6 layers"
    """
    if schedule not in PP_SCHEDULES:
        return f"parallel.pp_schedule: {schedule!r} is not one of {', '.join(PP_SCHEDULES)}"
    if pp < 1 or virtual < 1 or microbatches < 1:
        return (f"parallel.pp={pp}, parallel.pp_virtual_stages={virtual} and parallel.pp_microbatches={microbatches} "
                f"must be >= 1")
    multi = PP_SCHEDULES[schedule]
    if virtual > 1 and not multi:
        return (f"parallel.pp_virtual_stages={virtual} needs a schedule with several stages per rank "
                f"({', '.join(k for k, v in PP_SCHEDULES.items() if v)}), not parallel.pp_schedule={schedule}")
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
