"""CUDA graph capture of the decode step, optionally around an inductor-compiled step.

Why our own `torch.cuda.CUDAGraph` and not `torch.compile(mode="reduce-overhead")`: the step's
inputs are the decoder's state tensors and the static KV cache, which live for one generate()
call; owning the graph makes that explicit (captured per call and shape, freed with the
decoder) instead of relying on cudagraph trees' rules for input addresses, and the parameters
of an FSDP model (gathered afresh for every call, possibly at new addresses) are simply read
where they are at capture time. Inductor without cudagraphs inside graphs the runner captures
is also how SGLang's CUDA-graph runner uses torch.compile.

The step captured is `step.decode_step`, eager or compiled (`step.compiled_decode_step`). The CUDA
graphs are one per (batch bucket, key-length bucket) used by a call, captured with concrete sizes.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch


def capture(fn: Callable[..., torch.Tensor], args: Sequence, restore: List[torch.Tensor], warmup: int = 2,
            pool=None) -> Callable[[], torch.Tensor]:
    """Capture `fn(*args)` as a CUDA graph; returns a replay function giving the (static) output.

    Warm-up runs (on a side stream, as capture requires; they also trigger compilation) mutate
    the tensors in `restore`, which are put back before capture. Capture records without
    running, so the first replay is the first real step."""
    saved = [t.clone() for t in restore]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn(*args)
    finally:
        torch.cuda.current_stream().wait_stream(stream)
        for t, s in zip(restore, saved):
            t.copy_(s)
    graph = torch.cuda.CUDAGraph()
    # thread_local: CUDA calls of other threads (e.g. an async checkpoint writer in the same
    # worker) neither fail the capture nor get captured.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn(*args)

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    replay.graph = graph  # keeps the graph (and its memory pool) alive with the decoder
    return replay
