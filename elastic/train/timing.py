"""Where a step's time goes: per-phase durations and the worker's memory high-water marks.

Why not host clocks everywhere: on a GPU, forward/backward/optimizer only *enqueue* kernels, so
a host clock around them measures launch time, not work. Device phases are therefore timed
with CUDA events on GPU and resolved once at the end of the step (which synchronises anyway);
on CPU the work is synchronous and a host clock is exact. Host-side phases (waiting for data,
writing a checkpoint) are always host clocks.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from typing import Dict, Iterator, List, Tuple

import torch


class StepTimer:
    """Accumulates named phase durations over one step (phases may repeat, e.g. per micro-batch)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._host: Dict[str, float] = {}
        self._events: List[Tuple[str, object, object]] = []

    def reset(self) -> None:
        self._host.clear()
        self._events.clear()

    @contextlib.contextmanager
    def phase(self, name: str, host: bool = False) -> Iterator[None]:
        """Time the block as `name`; `host=True` for host-side waits (data, I/O)."""
        if self.cuda and not host:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._host[name] = self._host.get(name, 0.0) + time.perf_counter() - t0

    def seconds(self) -> Dict[str, float]:
        """`<phase>_s` for every phase seen; call after the step's device work has finished."""
        out = {f"{k}_s": v for k, v in self._host.items()}
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                key = f"{name}_s"
                out[key] = out.get(key, 0.0) + start.elapsed_time(end) / 1e3
        return out


def memory_gib(device: torch.device) -> Dict[str, float]:
    """Peak memory of this worker: device allocated/reserved (and its size) on GPU; the
    process's peak resident set size on CPU (ru_maxrss is KiB on Linux, bytes on macOS)."""
    if device.type == "cuda":
        return {"max_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
                "device_mem_gib": torch.cuda.get_device_properties(device).total_memory / 2**30}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_gib": rss / (2**30 if sys.platform == "darwin" else 2**20)}
