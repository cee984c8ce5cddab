"""Per-step metrics: one JSON line per optimizer step in `<run dir>/metrics.jsonl`, and wandb.

MFU = (FLOPs per token × real tokens per second) / (peak FLOP/s per device × devices).
FLOPs per token is `elastic.model.llama.flops_per_token` (6·N plus the causal attention
term). Peak FLOP/s comes from the device table below (dense bf16, datasheet), or on CPU
from a nominal figure: threads × 2.5 GHz × 32 FP32 FLOP/cycle (AVX2, two FMA units).
ELASTIC_PEAK_FLOPS overrides both.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

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
    """Appends step records to metrics.jsonl (rank 0) and mirrors them to wandb."""

    def __init__(self, path: str, wandb_run: Optional[Any] = None):
        self.path = path
        if "://" not in path:  # a URI (remote run storage) has no directory to create
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.wandb = wandb_run

    def write(self, record: Dict[str, Any]) -> None:
        append_record(self.path, record)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record.get("step"))

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


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
