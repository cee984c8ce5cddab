"""What a training job supplies to the shared per-worker loop (elastic/train/loop.py).

Pretraining, SFT, DPO and GRPO differ only in where a step's batches come from and which
loss they train; checkpointing, metrics, the ledger, elasticity, the stability guard and
the timing breakdown are the loop's. A job:

* restores its own position from the checkpoint (`restore`) and returns it for the next one
  (`state`), under the names in `state_keys` (kept at the top level of train_state.json);
* yields this rank's `Update`s for a global step (pretraining: one; GRPO: several optimizer
  updates over one rollout), built only from the step number and its own state, never from
  the world size, so a resized run trains on the same data;
* names its loss function and adds its own figures to the step's metrics record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from elastic.train.comm import Comm
from elastic.train.step import LossFn, StepOutput


@dataclass
class WorkerContext:
    """The per-worker facts a job may need (built once per worker-group attempt)."""

    cfg: Any                 # elastic.config.Config
    rank: int
    world_size: int
    device: torch.device
    model: torch.nn.Module   # FSDP-wrapped policy
    local_dir: str           # where the run's records go (the run dir; local path or URI)
    config: Dict[str, Any]   # the raw train_loop_config (plans, paths)
    comm: Optional[Comm] = None  # this worker's collectives, on the model's device (elastic/train/comm.py)
    # The worker's rank in the whole group. `rank`/`world_size` (and `comm`) are data-parallel:
    # under tensor parallelism (elastic/train/mesh.py) the tp peers of one data-parallel rank
    # share its rank, read the same rows and must run the same forward passes.
    global_rank: int = -1
    tp_rank: int = 0                 # this worker's place among its tp peers (0: the one that writes rows)
    tp_comm: Optional[Comm] = None   # collectives over the tp peers (None without tensor parallelism)
    mesh: Any = None                 # the worker's one mesh (elastic/train/mesh.py WorkerMesh): build models on it
    pipeline: Any = None             # parallel.pp > 1: the schedule over this rank's stages (elastic/train/pipeline.py)

    def __post_init__(self) -> None:
        if self.comm is None:
            self.comm = Comm(self.device)
        if self.global_rank < 0:
            self.global_rank = self.rank

    def share_with_tp_peers(self, obj: Any) -> Any:
        """`obj` of the first tp peer on every tp peer (itself without tensor parallelism): what
        one peer fetched once (rewards from the service), the others use as is."""
        if self.tp_comm is None:
            return obj
        return self.tp_comm.broadcast_object(obj, src=0)

    @property
    def leader(self) -> bool:
        """The one worker that writes a job's own records and prints its lines."""
        return self.global_rank == 0


@dataclass
class Update:
    """One optimizer update's worth of this rank's data."""

    micro_batches: List[Dict[str, np.ndarray]]
    units: float = 0.0                 # this rank's loss units; summed over ranks = the normaliser
    tokens: int = 0                    # this rank's real (non-padding) tokens, for throughput
    sample_ids: List[int] = field(default_factory=list)  # for the ledger
    normaliser: Optional[float] = None  # set when the job computed the global normaliser itself
    # Tokens the forward+backward runs over, when not `tokens` (GRPO: prompt + completion, while
    # `tokens` counts the completions trained on). MFU's FLOPs count these.
    compute_tokens: Optional[int] = None


class Job:
    """Base class; see the module docstring."""

    state_keys: Tuple[str, ...] = ()
    wait_phase: str = "data_wait"  # the name under which the loop times `updates()` producing data
    updates_per_step: int = 1      # optimizer updates per global step (sizes the LR schedule; set in start)
    # The config's micro-batch keys this job reads: upper bounds that the loop fits to each
    # worker's share before `start` (elastic/config/micro_batch.py).
    micro_batch_keys: Tuple[str, ...] = ("train.micro_batch_size",)

    def build_aux(self, cfg: Any, device: torch.device, param_dtype: torch.dtype, mesh: Any = None) -> Dict[str, Any]:
        """The job's own trained modules, {name: (module, optimizer)}, built before the
        checkpoint is restored and saved with the model (PPO's critic), on the worker's `mesh`
        (elastic/train/mesh.py). Default: none."""
        return {}

    def init_aux(self, cfg: Any) -> None:
        """A fresh run (no checkpoint): give the aux modules their initial weights."""

    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        raise NotImplementedError

    def updates(self, step: int) -> Iterator[Update]:
        raise NotImplementedError

    def loss_fn(self) -> LossFn:
        raise NotImplementedError

    def state(self) -> Dict[str, Any]:
        return {}

    def observe(self, out: StepOutput) -> None:
        """Called after every optimizer update with its (globally summed) loss statistics."""

    def step_metrics(self) -> Dict[str, Any]:
        """Extra fields for the metrics record of the step just trained."""
        return {}

    _forward = 0  # forward-only tokens since the loop last asked (see forward_tokens)

    def count_forward(self, tokens: int) -> None:
        """Record `tokens` run through a forward-only pass (reference or old-policy log-probs,
        generation, held-out evaluation), padding excluded."""
        self._forward = self._forward + int(tokens)

    def forward_tokens(self) -> int:
        """Forward-only tokens this rank counted since the last call (the step just run). MFU
        counts each at a third of a training token's FLOPs (elastic/train/loop.py)."""
        n, self._forward = self._forward, 0
        return n

    def consumed_sample_ids(self) -> List[int]:
        """Ids the step just run consumed that its updates did not carry (GRPO: every completion
        it sampled, filtered groups included): the ledger records them with the step."""
        return []

    def evaluate(self, step: int) -> Dict[str, Any]:
        """Held-out figures at `step` (every rank calls it; may run collectives); {} = none."""
        return {}

    def close(self) -> None:
        """End of the attempt on this rank (e.g. print a summary of skipped rows)."""
