"""Typed configuration for every job.

Plain dataclasses (as in Ray's own examples) so a config is readable, picklable to Ray
workers and checkable before any work starts. Loading, ``--set`` overrides and cross-field
validation live in :mod:`elastic.config.load`; this file only declares fields and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class RunSection:
    """Where a run lives. ``<storage_path>/<name>`` is the run directory."""

    name: str = "tiny-demo"
    # Local directory or any pyarrow filesystem URI (s3://, gs://, ...). Relative local
    # paths are resolved against the current directory when the config is loaded.
    storage_path: str = "runs"
    seed: int = 0


@dataclass
class DataSection:
    """Raw text → tokens → packed fixed-length samples (see elastic/data)."""

    # "stdlib" (the running interpreter's standard library sources, no download) or a path /
    # glob / pyarrow filesystem URI of text files, JSONL files or Parquet files.
    source: str = "stdlib"
    # auto | text | jsonl | parquet. auto infers from file extensions.
    format: str = "auto"
    # Glob applied when `source` is a directory.
    glob: str = "**/*"
    # Field (JSONL) or column (Parquet) holding the document text.
    text_field: str = "text"
    # Path to a HF tokenizers `tokenizer.json`; empty trains a byte-level BPE on a sample of the
    # corpus and saves it in the run directory (reused on restart so token ids never change).
    tokenizer: str = ""
    vocab_size: int = 2048
    tokenizer_sample_mb: float = 8.0
    seq_len: int = 256
    # Documents are packed within "shards" of roughly this many bytes of raw text. A shard is the
    # unit of deterministic packing and of seeking on resume (resume cost <= one shard).
    shard_mb: float = 1.0
    # Shuffle the order of shards each epoch, and of samples within each shard (deterministic
    # in run.seed, the epoch and the shard).
    shuffle: bool = True
    # CPUs reserved by each tokenize+pack Ray Data task.
    tokenize_cpus: float = 1.0
    # How many malformed rows are reported verbatim (all are counted).
    report_bad_rows: int = 5
    # Append the global sample ids trained on, per step and worker, to <run dir>/ledger.jsonl.
    ledger: bool = False


@dataclass
class ModelSection:
    """Llama-style decoder. `preset` picks the sizes; any field set here overrides it."""

    preset: str = "tiny"
    dim: Optional[int] = None
    n_layers: Optional[int] = None
    n_heads: Optional[int] = None
    n_kv_heads: Optional[int] = None
    ffn_hidden: Optional[int] = None
    tie_embeddings: Optional[bool] = None
    rope_theta: Optional[float] = None
    norm_eps: Optional[float] = None
    # auto | flash_varlen | torch_varlen | flex | sdpa_mask | sdpa_loop
    attention: str = "auto"


@dataclass
class TrainSection:
    """Optimisation. Global batch is in sequences and never depends on the world size."""

    steps: int = 100
    global_batch_size: int = 16
    micro_batch_size: int = 8
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # Parameter/compute dtype under FSDP2's MixedPrecisionPolicy (reduce is always fp32).
    # auto = bf16 on CUDA, fp32 on CPU (CPU bf16 matmuls are emulated and slow).
    param_dtype: str = "auto"
    compile: bool = False
    # none | full: activation checkpointing per transformer block.
    activation_checkpointing: str = "none"
    log_every: int = 10
    # Stop this invocation after this step (0 = run to train.steps), checkpointing there; the
    # same run launched again resumes from it. For time-sliced clusters, tests and drills.
    until_step: int = 0


@dataclass
class ScalingSection:
    """Ray Train worker group. min < max makes the run elastic."""

    min_workers: int = 2
    max_workers: int = 2
    # auto = use GPUs when the cluster has them.
    use_gpu: str = "auto"
    cpus_per_worker: float = 1.0
    # Extra custom resources each train worker requests (e.g. {"trainer": 1} to pin workers
    # to the KubeRay trainer group).
    resources_per_worker: Dict[str, float] = field(default_factory=dict)
    elastic_resize_monitor_interval_s: float = 60.0
    # How long Ray Train waits for a new worker group to start before retrying (with fewer
    # workers in elastic mode). After a node loss the dead node still counts until the GCS
    # notices, so the first attempt may wait this long. Keep it above pod start-up time on
    # Kubernetes; short on fixed machines.
    worker_group_start_timeout_s: float = 60.0
    max_failures: int = 3


@dataclass
class CheckpointSection:
    every_steps: int = 50
    keep_last: int = 2


@dataclass
class WandbSection:
    # auto = online when WANDB_API_KEY is set, offline otherwise; disabled turns it off.
    mode: str = "auto"
    project: str = "elastic"
    entity: str = ""


@dataclass
class RewardSection:
    """The sandboxed compile/test/benchmark actor pool (elastic/reward)."""

    num_actors: int = 2
    # Custom resource each reward actor requests besides 1 CPU, so actors land on CPU nodes.
    # Empty: none requested.
    actor_resource: str = ""
    max_in_flight_per_actor: int = 2
    item_deadline_s: float = 120.0
    max_retries: int = 2
    # Identical programs (same problem, language and extracted source) among the last
    # `dedup_window` distinct ones are evaluated once; 0 evaluates every submission.
    dedup_window: int = 1024
    # The pool is declared gone (callers get an error, the run stops) when work has waited this
    # long with no evaluation completing (every actor dying, none placeable). > item_deadline_s.
    unavailable_after_s: float = 300.0
    # wall | instructions (perf stat where the kernel counts, else valgrind callgrind).
    timing: str = "wall"
    # Wall mode: timed runs (median taken) after `warmup_runs` untimed ones.
    timing_runs: int = 5
    warmup_runs: int = 1
    # Reward of any program that fails (compile/test/limits); must be below reward_floor.
    failure_reward: float = 0.0
    # Correct programs get reward_floor + (1 - reward_floor) * (1 + tanh(log2(speedup) / speedup_scale)) / 2.
    reward_floor: float = 0.1
    speedup_scale: float = 2.0
    # Bench inputs and reference timings (per problem hash and machine); empty: ~/.cache/elastic/reward.
    cache_dir: str = ""
    compile_time_limit_s: float = 30.0
    # Wall limit of one instruction-counted run (valgrind is ~50x slower than native).
    instructions_time_limit_s: float = 120.0
    # Environment variables passed into the sandbox (nothing else is inherited).
    env_allow: List[str] = field(default_factory=list)


@dataclass
class Config:
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    wandb: WandbSection = field(default_factory=WandbSection)
    reward: RewardSection = field(default_factory=RewardSection)


SECTIONS: List[str] = list(Config.__dataclass_fields__)
