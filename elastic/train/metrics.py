"""Per-step metrics: one JSON line per optimizer step in `<run dir>/metrics.jsonl`, and wandb.

MFU = (FLOPs per token × real tokens per second) / (peak FLOP/s per device × devices).
FLOPs per token is `elastic.model.llama.flops_per_token` (6·N plus the causal attention
term). Peak FLOP/s comes from the device table below (dense bf16, datasheet), or on CPU
from a nominal figure: threads × 2.5 GHz × 32 FP32 FLOP/cycle (AVX2, two FMA units).
ELASTIC_PEAK_FLOPS overrides both.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import torch

from elastic.records import append_record

# Dense bf16 tensor-core peaks (datasheet, FLOP/s, without sparsity).
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; PCIe is 756e12
    "H800": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "B200": 2250e12,
}
CPU_FLOP_PER_CYCLE = 32
CPU_HZ = 2.5e9


def peak_flops(device: torch.device) -> tuple[float, str]:
    """(peak FLOP/s of one device, where the number comes from)."""
    env = os.environ.get("ELASTIC_PEAK_FLOPS")
    if env:
        return float(env), "ELASTIC_PEAK_FLOPS"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if "H100" in name and "PCIe" in name:
            return 756e12, f"{name} (datasheet dense bf16)"
        for key, val in GPU_PEAK_BF16.items():
            if key in name:
                return val, f"{name} (datasheet dense bf16)"
        return 312e12, f"{name} (unknown GPU: A100 figure assumed)"
    threads = torch.get_num_threads()
    return threads * CPU_HZ * CPU_FLOP_PER_CYCLE, f"CPU nominal: {threads} threads x 2.5 GHz x 32 FP32 FLOP/cycle"


class MetricsWriter:
    """Appends step records to metrics.jsonl (rank 0) and mirrors them to wandb.

    `wandb_run` may be a Future of the run (`init_wandb_async`): records written before it is
    ready go to wandb once it is, in order, so wandb's start never holds up a step."""

    def __init__(self, path: str, wandb_run: Optional[Any] = None):
        self.path = path
        if "://" not in path:  # a URI (remote run storage) has no directory to create
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._wandb = wandb_run
        self._backlog: List[Dict[str, Any]] = []

    @property
    def wandb(self) -> Optional[Any]:
        """The wandb run, once it is ready (None before, and when wandb is off or failed)."""
        w = self._wandb
        if isinstance(w, Future):
            if not w.done():
                return None
            self._wandb = w = w.result()  # init_wandb never raises: None when wandb failed
        return w

    def _log(self, run: Any, record: Dict[str, Any]) -> None:
        run.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record.get("step"))

    def write(self, record: Dict[str, Any]) -> None:
        append_record(self.path, record)
        if self._wandb is None:
            return
        run = self.wandb
        if run is None:
            if self._wandb is not None:  # still starting: kept for it
                self._backlog.append(record)
            return
        for r in self._backlog:
            self._log(run, r)
        self._backlog.clear()
        self._log(run, record)

    def close(self) -> None:
        if isinstance(self._wandb, Future):
            self._wandb.result()  # a run still starting is waited for, so the backlog is logged
        run = self.wandb
        if run is not None:
            for r in self._backlog:
                self._log(run, r)
            self._backlog.clear()
            run.finish()


def init_wandb(mode: str, project: str, entity: str, run_name: str, run_dir: str, config: Dict[str, Any]):
    """wandb on rank 0 only: online with an API key, offline without one; WANDB_MODE wins."""
    env_mode = os.environ.get("WANDB_MODE")
    if mode == "disabled" or env_mode == "disabled":
        return None
    if mode == "auto":
        mode = env_mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    try:
        import wandb

        return wandb.init(project=project, entity=entity or None, name=run_name, id=run_name, resume="allow",
                          dir=run_dir, mode=mode, config=config, reinit="finish_previous")
    except Exception as e:  # logging must never take training down
        print(f"[elastic] wandb disabled: {type(e).__name__}: {e}")
        return None


def init_wandb_async(mode: str, project: str, entity: str, run_name: str, run_dir: str,
                     config: Dict[str, Any]) -> Optional[Future]:
    """`init_wandb` in a background thread, for MetricsWriter: importing wandb and starting its
    service took 2 s (1.2 CPU-seconds) on the 2-core machine, and every rank waited for rank 0's
    at the first step; started as the worker starts, it runs while the model is built. None when
    wandb is off."""
    if mode == "disabled" or os.environ.get("WANDB_MODE") == "disabled":
        return None
    os.makedirs(run_dir, exist_ok=True)
    pool = ThreadPoolExecutor(1, thread_name_prefix="elastic-wandb")
    try:
        return pool.submit(init_wandb, mode, project, entity, run_name, run_dir, config)
    finally:
        pool.shutdown(wait=False)
