"""Pretraining and SFT on the driver: the packed-sample stream (`LMLaunch`) for the job driver
(elastic/launch/driver.py), and `run_pretraining`, the function jobs/pretrain.py and jobs/sft.py
call. Data planning fails with one line before Ray starts; the store builder (one actor per run)
starts tokenizing from the latest checkpoint's position while the worker group starts.
"""

from __future__ import annotations

from typing import Optional, TextIO

from elastic.config import Config
from elastic.data.cursor import Cursor
from elastic.data.pipeline import DataPlan
from elastic.launch.data_plans import JobData, plan_job_data, role_marker_warning
from elastic.launch.driver import JOB_WORK_ENV, JobLaunch, JobResult, RunPaths, build_torch_trainer, fault_env, run_job
from elastic.train import checkpoint_files as ckpt_lib
# Imported here, before any Ray activity: under `ray job submit` the job's working dir can be
# unpacked again while this driver runs (seen: a lazy import right after the store builder
# started failed with ModuleNotFoundError).
from elastic.data.builder import start_builder
from elastic.train.entry import train_loop_per_worker


def plan_data(cfg: Config, paths: RunPaths, kind: str = "pretrain") -> JobData:
    return plan_job_data(cfg, paths.local_dir, kind)


def cache_root(paths: RunPaths) -> str:
    """The shard cache lives with the run (local path or URI), so reruns, restarts and resizes
    of the run reuse it."""
    return f"{paths.run_dir.rstrip('/')}/cache"


def start_store(cfg: Config, plan: DataPlan, paths: RunPaths, eval_plan: Optional[DataPlan] = None):
    """The run's store builder (elastic/data/builder.py), already tokenizing from the latest
    checkpoint's position while the worker group starts. ELASTIC_FAULT_* variables of the
    driver reach its build tasks (fault injection in tests)."""
    from elastic.data.mixture import MixturePlan

    mixed = isinstance(plan, MixturePlan)
    plans = {**(plan.store_plans() if mixed else {"train": plan}), **({"eval": eval_plan} if eval_plan is not None else {})}
    store = start_builder(plans, cache_root(paths), cfg.data.build_ahead, task_env={**JOB_WORK_ENV, **fault_env()},
                          actors=cfg.data.tokenize_actors)
    found = ckpt_lib.latest_complete(paths.run_dir)
    saved = found[1]["cursor"] if found else {}
    if mixed:  # each source's stream from its own position
        for k, c in enumerate(saved.get("mixture") or [{}] * len(plan.plans)):
            cur = Cursor.from_dict(c) if c else Cursor()
            store.ahead.remote(f"train/{k}", cur.epoch, cur.shard_pos)
    else:
        cur = Cursor.from_dict(saved) if saved else Cursor()
        store.ahead.remote("train", cur.epoch, cur.shard_pos)
    return store


def close_store(store) -> None:
    """End the builder's pipelines (their packers give back their CPUs) and the actor itself;
    never fails the run."""
    if store is None:
        return
    import ray

    try:
        ray.get(store.close.remote(), timeout=15)
        ray.kill(store, no_restart=True)
    except Exception:  # an actor already gone, a cluster shutting down
        pass


def plan_eval_tasks(cfg: Config) -> list:
    """`eval.tasks` read and checked on the driver (one-line ConfigError naming eval.tasks: a
    missing file, a typo, a task type the live model cannot run), shipped to workers by value."""
    if not cfg.eval.tasks:
        return []
    from elastic.config import ConfigError
    from elastic.eval.spec import IN_TRAINING_TYPES, EvalConfigError, PlannedTask
    from elastic.launch.eval import load_task

    out = []
    for name in cfg.eval.tasks:
        try:
            td = load_task(name, cfg.eval.task_limit)
        except EvalConfigError as e:
            raise ConfigError(f"eval.tasks: {e}") from None
        if td.spec.type not in IN_TRAINING_TYPES:
            raise ConfigError(f"eval.tasks: {name} is a {td.spec.type} task; in training only "
                              f"{' and '.join(IN_TRAINING_TYPES)} tasks run (evaluate checkpoints with jobs/eval.py)")
        out.append(PlannedTask(td.spec, td.docs, td.contexts))
    return out


def build_trainer(cfg: Config, plan: DataPlan, paths: RunPaths, gpu: bool, eval_plan: Optional[DataPlan] = None,
                  store=None, eval_tasks: Optional[list] = None):
    """Language-modelling jobs: workers read their samples from the shard cache through the
    store builder's handle; no Ray Data stream reaches them (each would re-tokenize everything)."""
    store = store if store is not None else start_store(cfg, plan, paths, eval_plan)
    return build_torch_trainer(cfg, paths, gpu, train_loop_per_worker,
                               {"plan": plan, "eval_plan": eval_plan, "store": store, "cache_root": cache_root(paths),
                                "eval_tasks": eval_tasks or []})


class LMLaunch(JobLaunch):
    """Pretraining and SFT: the packed-sample stream."""

    def __init__(self, kind: str, dataset=None):
        self.kind = kind
        self.dataset = dataset  # a user's ray.data.Dataset (Python API), snapshotted into the run

    def _snapshot_source(self, cfg: Config, paths: RunPaths, say) -> None:
        """The user's Dataset becomes the run's Parquet source `<run>/source` (executed once, in
        order: elastic/data/ray_dataset.py); data.source/format/glob then point at it."""
        from elastic.data.ray_dataset import snapshot_dataset, snapshot_info

        dest = f"{paths.run_dir.rstrip('/')}/source"
        fresh = snapshot_info(dest) is None
        rec = snapshot_dataset(self.dataset, dest, cfg.data.text_field)
        say(f"[elastic] data: ray.data.Dataset {'written' if fresh else 'found'} as {rec['files']} Parquet file(s), "
            f"{rec['rows']} rows, in {dest} (its order is frozen there: resumes and resizes read the same rows)")
        cfg.data.source, cfg.data.format, cfg.data.glob = dest, "parquet", "*.parquet"

    @property
    def job(self) -> str:  # the config validation's job name is the kind ("pretrain" | "sft")
        return self.kind

    def plan(self, cfg: Config, paths: RunPaths, say) -> None:
        if cfg.model.init_from:
            from elastic.model.hf import check_init_from

            check_init_from(cfg)  # names and shapes from headers/metadata: one line, before any worker
        if self.dataset is not None:
            self._snapshot_source(cfg, paths, say)
        self.data = plan_data(cfg, paths, self.kind)
        warning = role_marker_warning(self.data.train.tokenizer.json, self.data.train.chat)
        if warning:
            say(warning)
        self.eval_tasks = plan_eval_tasks(cfg)

    def describe(self) -> list:
        p, ev = self.data.train, self.data.eval
        held = f"; held out: {ev.num_shards} shard(s)" if ev is not None else ""
        return [f"[elastic] data: {p.files} files, {p.corpus_bytes / 2**20:.1f} MiB in {p.num_shards} shards{held}; "
                f"tokenizer vocab {p.tokenizer.vocab_size} ({p.tokenizer.bytes_per_token:.2f} bytes/token)"]

    def start(self, cfg: Config, paths: RunPaths) -> None:
        self.store = start_store(cfg, self.data.train, paths, self.data.eval)

    def trainer(self, cfg: Config, paths: RunPaths, gpu: bool):
        return build_trainer(cfg, self.data.train, paths, gpu, self.data.eval, self.store, self.eval_tasks)

    def stop(self) -> None:
        close_store(getattr(self, "store", None))


def run_pretraining(cfg: Config, kind: str = "pretrain", out: Optional[TextIO] = None, progress: bool = True,
                    dataset=None) -> JobResult:
    """A language-modelling job: kind "pretrain" (text) or "sft" (conversations).

    `dataset`: a `ray.data.Dataset` (built by the caller, on the cluster it is connected to)
    with a string column `data.text_field`, used instead of `data.source`. It is executed once
    into `<run>/source` and the run trains on that snapshot, so kill/resume and resizes stay
    exact (elastic/data/ray_dataset.py)."""
    if dataset is not None:
        import ray

        if not ray.is_initialized():
            from elastic.launch.runtime.cluster import ClusterError

            raise ClusterError("a ray.data.Dataset source needs the Ray cluster it was built on: call ray.init() first")
    return run_job(cfg, LMLaunch(kind, dataset), out, progress)
