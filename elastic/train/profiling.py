"""Profiler-backed step measurements: exposed communication on sampled steps, and full traces
on demand (`train.profile_steps: "a:b"`).

Exposed communication is *measured*, not guessed, from PyTorch profiler events of one step:

* CPU (gloo): collectives block the training thread, so every interval the training thread
  spends inside FSDP's all-gather / reduce-scatter regions or a c10d collective (and its wait)
  is exposed; the union of those intervals is `comm_s`.
* CUDA (NCCL): collectives run as kernels on their own streams and overlap compute. Exposed
  time is the part of the union of NCCL kernel intervals not covered by any compute kernel.

Profiling costs ~10% of the step it samples, so it runs on a sampled subset of steps
(`train.comm_sample_every`); other steps carry no `comm_s`. The profiler's own start-up and
analysis time is reported as `profile_s` on the steps it sampled, so the breakdown still
adds up to the step time.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Iterable, Iterator, List, Optional, Tuple

import torch

# Training-thread regions that are communication (FSDP2's record_function names, c10d ops).
_CPU_COMM = re.compile(r"^(FSDP::(all_gather|post_backward_reduce|post_backward_rs_wait|reduce_scatter)|c10d::|_c10d_functional::(wait_tensor|all_reduce|all_gather|reduce_scatter))")


def parse_steps(spec: str) -> Optional[Tuple[int, int]]:
    """"a:b" → (a, b), the inclusive range of 1-based steps to trace; "" → None."""
    if not spec:
        return None
    a, _, b = spec.partition(":")
    lo, hi = int(a), int(b or a)
    return (lo, hi)


def _union_length(intervals: Iterable[Tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _subtract(a: List[Tuple[float, float]], b: List[Tuple[float, float]]) -> float:
    """Length of union(a) not covered by union(b)."""
    def merged(xs):
        out: List[List[float]] = []
        for s, e in sorted(xs):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    A, B = merged(a), merged(b)
    total, j = 0.0, 0
    for s, e in A:
        cur = s
        while j < len(B) and B[j][1] <= cur:
            j += 1
        k = j
        while k < len(B) and B[k][0] < e:
            if B[k][0] > cur:
                total += B[k][0] - cur
            cur = max(cur, B[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def exposed_comm_seconds(events, cuda: bool) -> float:
    """Exposed communication in one profiled step (see module docstring). `events`: the
    profiler's FunctionEvents (`prof.events()`)."""
    if cuda:
        comm, compute = [], []
        for e in events:
            if getattr(e, "device_type", None) is None or "cuda" not in str(e.device_type).lower():
                continue
            iv = (e.time_range.start, e.time_range.end)
            (comm if "nccl" in e.name.lower() else compute).append(iv)
        return _subtract(comm, compute) / 1e6
    threads = {}
    for e in events:
        threads[e.thread] = threads.get(e.thread, 0) + 1
    if not threads:
        return 0.0
    # The training thread records the most events (gloo's own threads record a few each).
    main = max(threads, key=threads.get)
    ivs = [(e.time_range.start, e.time_range.end) for e in events if e.thread == main and _CPU_COMM.match(e.name)]
    return _union_length(ivs) / 1e6


class StepProfiler:
    """Decides per step whether to profile it, and what to take from it.

    Rank 0 only: a trace of `trace_steps` written as Chrome/Perfetto JSON into `out_dir`, and
    exposed-communication samples every `comm_every` steps (0 = never)."""

    def __init__(self, device: torch.device, out_dir: str, trace_steps: str = "", comm_every: int = 0, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.out_dir = out_dir
        self.trace = parse_steps(trace_steps) if enabled else None
        self.comm_every = comm_every if enabled else 0
        self.comm_s: Optional[float] = None
        self.overhead_s = 0.0
        self._prof = None
        self.trace_paths: List[str] = []

    def _sampled(self, step: int, first: bool) -> bool:
        # The first step of an attempt pays for warm-up (allocations, lazy init): not representative.
        return self.comm_every > 0 and not first and (step % self.comm_every == 0 or step == 2)

    @contextlib.contextmanager
    def step(self, step: int, first: bool = False) -> Iterator[None]:
        """Wrap one optimizer step (`step` is 1-based)."""
        from torch.profiler import ProfilerActivity, profile

        self.comm_s = None
        self.overhead_s = 0.0
        tracing = self.trace is not None and self.trace[0] <= step <= self.trace[1]
        if not (tracing or self._sampled(step, first)):
            yield
            return
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        t0 = time.perf_counter()
        if tracing and self._prof is None:
            self._prof = profile(activities=acts, record_shapes=True, with_stack=False)
            self._prof.__enter__()
        if tracing:  # a multi-step trace is not a per-step figure: no comm_s from it
            self.overhead_s = time.perf_counter() - t0
            yield
            t1 = time.perf_counter()
            if step == self.trace[1]:
                self._finish_trace()
            self.overhead_s += time.perf_counter() - t1
            return
        p = profile(activities=acts)
        p.__enter__()
        self.overhead_s = time.perf_counter() - t0
        try:
            yield
        finally:
            t1 = time.perf_counter()
            if self.cuda:
                torch.cuda.synchronize()
            p.__exit__(None, None, None)
            self.comm_s = exposed_comm_seconds(p.events(), self.cuda)
            self.overhead_s += time.perf_counter() - t1

    def _finish_trace(self) -> None:
        p, self._prof = self._prof, None
        if self.cuda:
            torch.cuda.synchronize()
        p.__exit__(None, None, None)
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"trace_rank0_steps_{self.trace[0]}-{self.trace[1]}.json")
        p.export_chrome_trace(path)
        self.trace_paths.append(path)

    def close(self) -> None:
        """A run that stops inside the traced range still writes what it traced."""
        if self._prof is not None:
            self._finish_trace()
