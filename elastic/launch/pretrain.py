"""Build and run the Ray Train job for pretraining: the only place that knows Ray Train's
driver-side API (TorchTrainer, ScalingConfig, RunConfig).

Order matters: the config is already valid; data planning (source resolution, tokenizer)
runs next and fails with one line before any worker starts; only then is the trainer built.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

from elastic.config import Config, run_dir as run_dir_of, to_dict
from elastic.data.cursor import Cursor
from elastic.data.pipeline import DataPlan
from elastic.launch.data_plans import JobData, plan_job_data
from elastic.train import checkpoint as ckpt_lib


@dataclass
class RunPaths:
    run_dir: str      # checkpoints, shard cache (storage_path/name; local path or URI)
    local_dir: str    # tokenizer.json, config.json, summary.json, wandb (this machine)
    records_dir: str  # metrics.jsonl, events.jsonl, ledger.jsonl: the run dir, also when it is a URI


def run_paths(cfg: Config) -> RunPaths:
    rd = run_dir_of(cfg)
    local = rd if "://" not in rd else os.path.join(tempfile.gettempdir(), "elastic-runs", cfg.run.name)
    return RunPaths(rd, local, rd)


def plan_data(cfg: Config, paths: RunPaths, kind: str = "pretrain") -> JobData:
    return plan_job_data(cfg, paths.local_dir, kind)


def cache_root(paths: RunPaths) -> str:
    """The shard cache lives with the run (local path or URI), so reruns, restarts and resizes
    of the run reuse it."""
    return f"{paths.run_dir.rstrip('/')}/cache"


@dataclass
class CheckpointCursor:
    """Data position of the newest complete checkpoint in the run dir (start of stream if none):
    where the store builder starts tokenizing before the workers ask."""

    run_dir: str

    def __call__(self) -> Cursor:
        found = ckpt_lib.latest_complete(self.run_dir)
        return Cursor.from_dict(found[1]["cursor"]) if found else Cursor()


def ensure_ray(cfg: Config) -> None:
    """Connect to the cluster in RAY_ADDRESS (as under `ray job submit`) or a running one;
    otherwise start a local one with enough logical CPUs for the workers plus data tasks."""
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}}
    if os.environ.get("RAY_ADDRESS", "") not in ("", "local"):
        ray.init(log_to_driver=True)  # the given cluster, e.g. under `ray job submit`
        return
    if not os.environ.get("RAY_ADDRESS"):
        try:
            ray.init(address="auto", log_to_driver=True)  # a cluster started with `ray start`
            return
        except (ConnectionError, RuntimeError, ValueError):
            pass
    s = cfg.scaling
    need = int(s.max_workers * s.cpus_per_worker + 2 * cfg.data.tokenize_cpus + 0.999)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False, runtime_env=env)


def use_gpu(cfg: Config) -> bool:
    import ray

    if cfg.scaling.use_gpu in ("true", "false"):
        return cfg.scaling.use_gpu == "true"
    return ray.cluster_resources().get("GPU", 0) > 0


def start_store(cfg: Config, plan: DataPlan, paths: RunPaths, eval_plan: Optional[DataPlan] = None):
    """The run's store builder (elastic/data/builder.py), already tokenizing from the latest
    checkpoint's position while the worker group starts. ELASTIC_FAULT_* variables of the
    driver reach its build tasks (fault injection in tests)."""
    from elastic.data.builder import start_builder

    plans = {"train": plan, **({"eval": eval_plan} if eval_plan is not None else {})}
    faults = {k: v for k, v in os.environ.items() if k.startswith("ELASTIC_FAULT_")}
    store = start_builder(plans, cache_root(paths), cfg.data.build_ahead, task_env=faults)
    cur = CheckpointCursor(paths.run_dir)()
    store.ahead.remote("train", cur.epoch, cur.shard_pos)
    return store


def build_trainer(cfg: Config, plan: DataPlan, paths: RunPaths, gpu: bool, eval_plan: Optional[DataPlan] = None,
                  store=None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from elastic.train.loop import train_loop_per_worker

    s = cfg.scaling
    # Read by the Ray Train controller (Ray propagates it from the driver).
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(s.worker_group_start_timeout_s)
    # Ray Train's print patch re-emits every worker print through its logger, which the driver
    # then shows twice; worker stdout already reaches the driver and the Ray log files.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    num_workers = s.min_workers if s.min_workers == s.max_workers else (s.min_workers, s.max_workers)
    resources = {"CPU": s.cpus_per_worker, **s.resources_per_worker}
    if gpu:
        resources["GPU"] = 1
    scaling_kwargs = dict(num_workers=num_workers, use_gpu=gpu, resources_per_worker=resources)
    if s.min_workers != s.max_workers:
        scaling_kwargs["elastic_resize_monitor_interval_s"] = s.elastic_resize_monitor_interval_s
    from elastic.launch.recovery_callback import RecoveryEventsCallback

    storage = paths.run_dir.rsplit("/", 1)[0]
    store = store if store is not None else start_store(cfg, plan, paths, eval_plan)
    return TorchTrainer(
        train_loop_per_worker,
        # Workers read their samples from the cache through the store builder's handle; no
        # Ray Data stream reaches them (each would re-tokenize everything).
        train_loop_config={"cfg": to_dict(cfg), "plan": plan, "eval_plan": eval_plan, "run_dir": paths.run_dir,
                           "local_dir": paths.local_dir, "records_dir": paths.records_dir, "use_gpu": gpu, "store": store,
                           "cache_root": cache_root(paths)},
        scaling_config=ScalingConfig(**scaling_kwargs),
        run_config=RunConfig(name=cfg.run.name, storage_path=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
                             failure_config=FailureConfig(max_failures=s.max_failures),
                             callbacks=[RecoveryEventsCallback(os.path.join(paths.records_dir, "events.jsonl"))]),
    )


@dataclass
class PretrainResult:
    run_dir: str
    local_dir: str
    wall_s: float
    checkpoint: Optional[str]
    summary: dict
    ray_logs: str = ""
    stopped: Optional[str] = None  # the stability guard's one-line reason, when the run stopped itself
    records_dir: str = ""  # metrics/events/ledger (the run dir, local or URI)


def ray_logs_dir() -> str:
    """The connected Ray session's log directory on this node (private API; best effort)."""
    try:
        import ray

        return os.path.join(ray._private.worker.global_worker.node.get_session_dir_path(), "logs")
    except Exception:
        return "the Ray session's logs/ directory on the head node"


def summarize(paths: RunPaths, wall_s: float, checkpoint: Optional[str]) -> dict:
    from elastic.records import METRICS, read_records

    mpath = os.path.join(paths.records_dir, METRICS)
    recs = [r for r in read_records(mpath) if "step" in r]
    s = {"wall_s": round(wall_s, 1), "checkpoint": checkpoint, "metrics": mpath, "steps_logged": len(recs)}
    if recs:
        s.update(first_loss=recs[0]["loss"], last_loss=recs[-1]["loss"], last_step=recs[-1]["step"],
                 tokens=sum(r["tokens"] for r in recs),
                 tokens_per_s=sum(r["tokens"] for r in recs) / max(1e-9, sum(r["step_s"] for r in recs)),
                 mean_mfu=sum(r["mfu"] for r in recs) / len(recs), bad_rows=recs[-1].get("bad_rows", 0))
    from elastic.launch.recovery import analyze

    acc = analyze(paths.records_dir)
    s.update(restarts=acc["restarts"], goodput=acc["goodput"])
    with open(os.path.join(paths.local_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=2)
    return s


def run_pretraining(cfg: Config, kind: str = "pretrain") -> PretrainResult:
    """Plan data (fails fast), start/attach Ray, fit, summarise. Raises DataError early.
    kind: "pretrain" or "sft" (language-modelling jobs; they share the trainer)."""
    paths = run_paths(cfg)
    os.makedirs(paths.local_dir, exist_ok=True)
    t0 = time.time()
    job_data = plan_data(cfg, paths, kind)
    plan = job_data.train
    print(f"[elastic] data: {plan.files} files, {plan.corpus_bytes / 2**20:.1f} MiB in {plan.num_shards} shards; "
          f"tokenizer vocab {plan.tokenizer.vocab_size} ({plan.tokenizer.bytes_per_token:.2f} bytes/token)")
    with open(os.path.join(paths.local_dir, "config.json"), "w") as f:
        json.dump(to_dict(cfg), f, indent=2)
    ensure_ray(cfg)
    trainer = build_trainer(cfg, plan, paths, use_gpu(cfg), job_data.eval)
    result = trainer.fit()
    ckpt = result.checkpoint.path if result.checkpoint is not None else None
    if result.error is not None:
        raise result.error
    wall = time.time() - t0
    from elastic.records import EVENTS, read_records

    stops = [e for e in read_records(os.path.join(paths.records_dir, EVENTS)) if e.get("event") == "stop" and e["time"] >= t0]
    return PretrainResult(paths.run_dir, paths.local_dir, wall, ckpt, summarize(paths, wall, ckpt), ray_logs_dir(),
                          stopped=stops[-1]["reason"] if stops else None, records_dir=paths.records_dir)
