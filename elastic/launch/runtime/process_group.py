"""The torch process-group backend of every job's TorchTrainer, importable without torch.

Ray Train's controller is an actor of its own: a fresh Python process at every job start. It
runs the backend's `on_start` (which sets up the workers' process group) and so unpickles the
trainer's backend config, and Ray's `TorchConfig` lives in `ray.train.torch.config`, whose first
lines import torch. That import is 2.3 of the controller's ~4 seconds of start-up on the 2-core
machine, before it schedules a single worker, and the controller never runs a torch op: every
torch call of the backend runs on the workers, which import torch anyway.

`ProcessGroupConfig` is Ray's `TorchConfig` (the same fields, the same defaults, and the same
backend choice, made by TorchTrainer on the driver: NCCL on GPU workers, gloo otherwise), with
its backend's `on_start` / `on_shutdown` written here and every worker-side function reached
through a wrapper that imports Ray's own on the worker: the process group is set up by Ray's
`_setup_torch_process_group` (its NCCL error-handling variables included), the torch
distributed variables by Ray's `_set_torch_distributed_env_vars`, and shutdown by Ray's
`_shutdown_torch`. Left out: TPU (`tpu_dist`, multi-slice), which no job here runs, and the
`dist.is_available()` check, which a worker's `init_process_group` makes again.

Private Ray Train API (a DeveloperAPI in Ray 2.5x/2.60), as elastic/launch/runtime/lean_train.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

import ray
from ray._private import ray_constants
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


def _setup_process_group(**kwargs: Any) -> None:
    """On a worker: Ray's own process-group setup."""
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _set_distributed_env_vars() -> None:
    """On a worker: LOCAL_RANK, WORLD_SIZE and the rest, by Ray's own function."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _shutdown(destroy_process_group: bool) -> None:
    """On a worker: Ray's own shutdown (destroys the group, frees cached CUDA memory)."""
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class _TrainFuncContext:
    """Ray's TorchConfigContextManager (sets the CUDA device of a GPU worker), imported on the
    worker that enters it."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


class ProcessGroupBackend(Backend):
    """Ray's `_TorchBackend` for gloo and NCCL, run by the controller without torch."""

    share_cuda_visible_devices: bool = True  # as Ray's: the GPU workers of a node see each other's devices

    def on_start(self, worker_group: Any, backend_config: "ProcessGroupConfig") -> None:
        from ray._common.network_utils import build_address
        from ray.train._internal.utils import get_address_and_port

        backend = backend_config.backend or ("nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo")
        addr, port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(_set_master, addr=addr, port=port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            url = f"tcp://{build_address(addr, port)}"
        else:
            raise ValueError(f"The provided init_method ({backend_config.init_method}) is not supported. "
                             f"Must be either 'env' or 'tcp'.")
        worker_group.execute(_set_distributed_env_vars)
        ray.get([worker_group.execute_single_async(i, _setup_process_group, backend=backend, world_rank=i,
                                                   world_size=len(worker_group), init_method=url,
                                                   timeout_s=backend_config.timeout_s)
                 for i in range(len(worker_group))])

    def on_shutdown(self, worker_group: Any, backend_config: "ProcessGroupConfig") -> None:
        from ray.exceptions import GetTimeoutError

        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


@dataclass
class ProcessGroupConfig(BackendConfig):
    """Ray's TorchConfig (backend None: TorchTrainer picks NCCL on GPU workers, gloo otherwise;
    init_method "env" or "tcp"; timeout_s of the group's collectives), without torch in the
    controller."""

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return ProcessGroupBackend

    @property
    def train_func_context(self):
        return _TrainFuncContext

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> Dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}
