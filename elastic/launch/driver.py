"""The job driver every job runs through (pretraining, SFT, DPO, reward models, GRPO, PPO): the
only place that knows Ray Train's driver-side API (TorchTrainer, ScalingConfig, RunConfig).

A job is a `JobLaunch` (what differs between jobs on the driver: planning its inputs, starting its
services, building its TorchTrainer); `run_job` does the rest in one order for all of them. The
config is already valid; the run's lease is taken next (a second launch of a live run refuses
before touching Ray); the job's planning (source resolution, tokenizer, problems) fails with one
line before Ray starts; then the cluster is started or joined, checked for the resources the run
needs, and only then is the trainer built and fitted while the progress line follows the run.
At the end: the run report, `summary.json` and a `JobResult`. Cluster choice, lease, GPU fit and
progress live in elastic/launch/runtime; the per-job launches in this package's other modules.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO

from elastic.config import Config, run_dir as run_dir_of, to_dict
from elastic.launch.lora_base import check_lora_base, lora_base_record
from elastic.launch.runtime.cluster import (CONNECTED, FROM_ENV, PRIVATE, connect, private_instance, resolve_cluster,
                                            wait_for_resources)
from elastic.launch.runtime.fit import fit_to_gpus
from elastic.launch.runtime.lease import RunLease
from elastic.launch.runtime.progress import Progress
from elastic.launch.runtime.startup import first_step_figures, take_command_start
from elastic.launch.runtime.stop import as_stop, call_interruptibly, disconnect, stopped_by
from elastic.report import build_report
from elastic.report.recovery import analyze
from elastic.train import checkpoint_files as ckpt_lib


@dataclass
class RunPaths:
    run_dir: str      # checkpoints, shard cache (storage_path/name; local path or URI)
    local_dir: str    # tokenizer.json, config.json, summary.json, report, wandb (this machine)
    records_dir: str  # metrics.jsonl, events.jsonl, ledger.jsonl: the run dir, also when it is a URI


def run_paths(cfg: Config) -> RunPaths:
    rd = run_dir_of(cfg)
    local = rd if "://" not in rd else os.path.join(tempfile.gettempdir(), "elastic-runs", cfg.run.name)
    return RunPaths(rd, local, rd)


def worker_env() -> dict:
    """Environment for workers of a cluster this driver starts or finds on this machine: this
    checkout first on PYTHONPATH so they import the same `elastic`, and OMP_NUM_THREADS=1.

    Why OMP_NUM_THREADS=1: Ray Train runs the training function in a thread of the worker
    actor, and Ray sets OMP_NUM_THREADS to the actor's CPUs. If anything runs a parallel torch
    op on the actor's main thread, libgomp builds a pool there; the training thread builds a
    second one, and with more OpenMP threads than cores every parallel region pays a futex
    wake-up. Measured on 2 cores: a plain loop in a second thread after one matmul on the main
    thread runs 0.74x the tokens/s. With 1 the main thread never builds a pool; the training
    loop sets its own thread count (torch.set_num_threads(scaling.cpus_per_worker),
    elastic/train/loop.py). (Ray Train's own main thread was not seen to trigger it:
    bench/step_overhead.py gave the same ratio with and without this.)"""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != repo]
    return {"PYTHONPATH": os.pathsep.join([repo] + rest), "OMP_NUM_THREADS": "1"}


# Ray starts worker processes at nice 15 and keeps its own daemons (raylet, GCS, dashboard,
# agents) and the driver at 0, so every wake-up of a daemon preempts a training thread at
# once, and with one OpenMP thread per core the other threads then wait at the next barrier.
# The job's own work (train workers, the shard builds that feed them; the reward pool does the
# same for its actors) runs at 0, as Ray's job supervisor sets for the driver of `ray job
# submit`; Ray Train's bookkeeping actors stay at 15. The variable only keeps Ray from raising
# the niceness: nothing is lowered, so no privilege is needed. Measured with
# bench/step_overhead.py on 2 cores (docs/benchmarks.md, "step inside the product").
JOB_WORK_ENV = {"RAY_worker_niceness": "0"}
TRAIN_WORKER_ENV = {**JOB_WORK_ENV, "OMP_NUM_THREADS": "1"}  # OMP_NUM_THREADS: see worker_env
FAULT_PREFIX = "ELASTIC_FAULT_"


def fault_env() -> Dict[str, str]:
    """The driver's ELASTIC_FAULT_* variables (fault injection for tests and drills: a NaN loss, a
    late batch, a stalled checkpoint write, a killed rollout actor), for every process the job
    starts (train workers, the store builder's tasks, rollout actors). A cluster's processes
    inherit the environment of the node that started them, not the driver's, so a fault set
    for one job reaches its processes on any cluster, and only that job's."""
    return {k: v for k, v in os.environ.items() if k.startswith(FAULT_PREFIX)}


def abort_running() -> None:
    """Abort the Ray Train controller of this driver's `fit`, if one runs (a stop, before
    `ray.shutdown`: stop.disconnect). The trainer module is never imported just for this."""
    mod = sys.modules.get("elastic.launch.runtime.lean_train")
    if mod is not None:
        mod.abort_running()


def private_cpus(cfg: Config) -> int:
    """Logical CPUs of a private instance: every worker plus the store builder's packers (one
    pipeline per training source and one for the held-out plan) plus a disaggregated RL run's
    rollout actors (the machine may have fewer cores; oversubscription only costs time)."""
    s, d = cfg.scaling, cfg.data
    pipelines = max(1, len(d.mixture)) + 1
    ro = cfg.rl.rollout  # a disaggregated RL run's rollout fleet (its own actors, apart from the trainers)
    fleet = ro.workers * ro.cpus_per_worker if ro.placement == "disaggregated" else 0.0
    need = int(s.max_workers * s.cpus_per_worker + pipelines * d.tokenize_actors * d.tokenize_cpus + fleet + 0.999)
    return max(os.cpu_count() or 1, need)


def required_bundles(cfg: Config, gpu: bool) -> tuple[list, str]:
    """What the cluster must hold at once for the run to make progress: `min_workers` train
    workers plus one packer actor of the store builder's Ray Data pipeline
    (`data.tokenize_cpus`, at least 1 CPU), and the same in words."""
    s = cfg.scaling
    worker = {"CPU": s.cpus_per_worker, **s.resources_per_worker, **({"GPU": 1.0} if gpu else {})}
    data = {"CPU": max(1.0, cfg.data.tokenize_cpus)}
    words = (f"{s.min_workers} train worker{'s' if s.min_workers > 1 else ''} x "
             + "{" + ", ".join(f"{k}: {v:g}" for k, v in worker.items() if v) + "}"
             + f" plus a data packer {{CPU: {data['CPU']:g}}}")
    return [dict(worker) for _ in range(s.min_workers)] + [data], words


def use_gpu(cfg: Config) -> bool:
    import ray

    if cfg.scaling.use_gpu in ("true", "false"):
        return cfg.scaling.use_gpu == "true"
    return ray.cluster_resources().get("GPU", 0) > 0


def check_generation_weights(cfg: Config, gpu: bool, job: str) -> None:
    """generation.weights=int4 runs only on CUDA (elastic/generation/quantized.py): refuse an RL
    run that would generate on CPU before any worker starts (one line)."""
    from elastic.config import ConfigError

    ro = cfg.rl.rollout
    on_cpu = not gpu if ro.placement == "colocated" else ro.gpus_per_worker == 0
    if job == "grpo" and cfg.generation.weights == "int4" and on_cpu:
        raise ConfigError("generation.weights: int4 needs CUDA (torchao 0.18 has no CPU int4 weight-only kernel) "
                          "and this run generates on CPU; use int8 or full")


def build_torch_trainer(cfg: Config, paths: RunPaths, gpu: bool, loop_fn, loop_config: dict, **trainer_kwargs):
    """The TorchTrainer every job runs: elastic ScalingConfig, checkpoints under the run dir,
    failure retries, the recovery-events callback. `loop_config` adds job inputs to the
    train_loop_config (which always carries the config, run paths and the device choice)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from elastic.launch.runtime.lean_train import trainer_class
    from elastic.launch.runtime.process_group import ProcessGroupConfig
    from elastic.launch.runtime.recovery_callback import RecoveryEventsCallback

    s = cfg.scaling
    # Read by the Ray Train controller (Ray propagates it from the driver).
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(s.worker_group_start_timeout_s)
    # Ray Train's print patch re-emits every worker print through its logger, so each would be
    # in the Ray logs twice; worker stdout already goes to the worker's own log file.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    num_workers = s.min_workers if s.min_workers == s.max_workers else (s.min_workers, s.max_workers)
    resources = {"CPU": s.cpus_per_worker, **s.resources_per_worker}
    if gpu:
        resources["GPU"] = 1
    scaling_kwargs = dict(num_workers=num_workers, use_gpu=gpu, resources_per_worker=resources)
    if s.min_workers != s.max_workers:
        scaling_kwargs["elastic_resize_monitor_interval_s"] = s.elastic_resize_monitor_interval_s

    storage = paths.run_dir.rsplit("/", 1)[0]
    if cfg.model.lora.rank > 0:  # what the adapters apply to, recorded in every checkpoint
        loop_config = {**loop_config, "lora_base": lora_base_record(cfg)}
    trainer = trainer_class(private_instance())(
        loop_fn,
        train_loop_config={"cfg": to_dict(cfg), "run_dir": paths.run_dir, "local_dir": paths.local_dir,
                           "records_dir": paths.records_dir, "use_gpu": gpu,
                           **loop_config},
        scaling_config=ScalingConfig(**scaling_kwargs),
        # The process-group backend: Ray Train's choice (NCCL on GPU workers, gloo otherwise)
        # unless ELASTIC_TORCH_BACKEND names one, e.g. gloo to run a GPU-shaped job on a cluster
        # that advertises GPUs it does not have (tests/test_fit_gpus.py).
        torch_config=ProcessGroupConfig(backend=os.environ.get("ELASTIC_TORCH_BACKEND") or None),
        run_config=RunConfig(name=cfg.run.name, storage_path=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
                             failure_config=FailureConfig(max_failures=s.max_failures),
                             callbacks=[RecoveryEventsCallback(os.path.join(paths.records_dir, "events.jsonl"))],
                             worker_runtime_env={"env_vars": {**TRAIN_WORKER_ENV, **fault_env()}}),
        **trainer_kwargs,
    )
    # Elastic sizes in whole pipelines of tensor-parallel groups (pp x tp workers per data-parallel
    # rank; runtime/scaling_policies.UnitElasticScalingPolicy).
    trainer.worker_unit = cfg.parallel.tp * cfg.parallel.pp
    trainer.events_path = os.path.join(paths.records_dir, "events.jsonl")
    return trainer


# What building a trainer imports: Ray Train and torch (ray.train.torch; 3.6 CPU-seconds here).
# `run_job` imports them in a background thread while it starts or joins the cluster (mostly a
# wait for Ray's processes), so the driver's own start-up does not wait for them.
TRAINER_MODULES = ("ray.train.torch", "elastic.launch.runtime.lean_train", "elastic.launch.runtime.recovery_callback")


# Modules that both `ray.init` (lazily) and TRAINER_MODULES import (Ray 2.60): imported before
# the background import starts, so the two threads never import one module at once. (Python
# detects a cycle of two threads' import locks and fails one of the imports.)
RAY_INIT_MODULES = ("ray._common.usage.usage_lib", "ray.dashboard", "argparse", "gzip", "pkgutil", "socketserver",
                    "timeit")


def preload(modules=TRAINER_MODULES, background: bool = True) -> Optional[threading.Thread]:
    """Import `modules` in a daemon thread (returned), or here when not `background`; an import
    that fails here fails again, with its message, where the module is used. Call it before
    `ray.init` (RAY_INIT_MODULES). Not in the background under `ray job submit`: connecting
    there can unpack the job's working directory again, under an import of one of ours (see
    elastic/launch/pretrain.py's imports)."""
    for name in RAY_INIT_MODULES:  # 0.02 CPU-seconds
        try:
            importlib.import_module(name)
        except Exception:
            pass

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:
                return

    if not background:
        load()
        return None
    t = threading.Thread(target=load, name="elastic-preload", daemon=True)
    t.start()
    return t


@dataclass
class JobResult:
    run_dir: str
    local_dir: str
    job_s: float  # job time: from taking the run's lease to the end of training (summary.json job_s)
    checkpoint: Optional[str]
    summary: dict
    ray_logs: str = ""
    stopped: Optional[str] = None  # the stability guard's one-line reason, when the run stopped itself
    records_dir: str = ""  # metrics/events/ledger (the run dir, local or URI)

    def done(self) -> str:
        """The head of every job's closing console line: its job time, training time and start-up
        (the command's start to its first step's beginning and end), named."""
        s = self.summary
        parts = [f"{s['training_s']:.0f}s training"] if s.get("training_s") else []
        if s.get("first_step_s") is not None:
            parts.append(f"start-up {s['startup_s']:.1f}s, first step done at {s['first_step_s']:.1f}s")
        return f"[elastic] done in {self.job_s:.0f}s job time" + (f" ({'; '.join(parts)})" if parts else "")


def ray_logs_dir() -> str:
    """The connected Ray session's log directory on this node (private API; best effort)."""
    try:
        import ray

        return os.path.join(ray._private.worker.global_worker.node.get_session_dir_path(), "logs")
    except Exception:
        return "the Ray session's logs/ directory on the head node"


def summarize(paths: RunPaths, job_s: float, checkpoint: Optional[str], report: Optional[dict] = None,
              command_start: Optional[float] = None) -> dict:
    """summary.json. Its figures have one definition each, the report's and the console's:
    `job_s` (job time: the driver's lease to the end of training), `training_s` (training time:
    first worker start to last step, goodput's denominator, elastic/report/recovery.py),
    `tokens_per_s` and `mfu` over the steady steps (elastic/report/bottleneck.py throughput),
    `first_step_s` (the command's start to the end of this job's first step) and `startup_s`
    (the command's start to that step's beginning; elastic/launch/runtime/startup.py)."""
    from elastic.records import METRICS, read_records

    mpath = os.path.join(paths.records_dir, METRICS)
    recs = [r for r in read_records(mpath) if "step" in r]
    s = {"job_s": round(job_s, 1), "checkpoint": checkpoint, "metrics": mpath, "steps_logged": len(recs)}
    if recs:
        from elastic.records import EVENTS
        from elastic.report.bottleneck import steady_records, throughput

        # Each attempt's first step (compile, start-up) is left out, as in the report.
        steady = steady_records(recs, read_records(os.path.join(paths.records_dir, EVENTS)))
        tp = throughput(steady)
        s.update(first_loss=recs[0]["loss"], last_loss=recs[-1]["loss"], last_step=recs[-1]["step"],
                 tokens=sum(r["tokens"] for r in recs), tokens_per_s=tp["tokens_per_s"], mfu=tp["mfu"],
                 steady_steps=tp["steps"], bad_rows=recs[-1].get("bad_rows", 0))
        rl = [r for r in recs if "reward_mean" in r]
        if rl:  # GRPO: reward and pass rate, first vs last steps
            w = max(1, min(10, len(rl) // 3))  # the report's first-10/last-10 windows
            mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
            s["reward"] = {"window": w, "first": mean(rl[:w], "reward_mean"), "last": mean(rl[-w:], "reward_mean"),
                           "first_pass": mean(rl[:w], "pass_rate"), "last_pass": mean(rl[-w:], "pass_rate")}
        if command_start is not None:
            s.update(first_step_figures(recs, command_start))
        held = heldout_summary(recs)
        if held:
            s["heldout"] = held
        ev = eval_summary(recs)
        if ev:
            s["evaluation"] = ev
    found = ckpt_lib.latest_complete(paths.run_dir)
    if found and found[1].get("bad_rows", {}).get("counts"):  # counts and first examples, with file and line
        s["bad_rows_detail"] = found[1]["bad_rows"]
    acc = analyze(paths.records_dir)
    s.update(restarts=acc["restarts"], goodput=acc["goodput"], training_s=round(acc["training_s"], 1))
    if report:
        s.update(report)
    with open(os.path.join(paths.local_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=2)
    return s


HEADLINE_EVAL = ("val_loss", "bits_per_byte", "acc_norm")


def eval_summary(recs: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """In-training evaluation, first and last: {"val_loss" | "<task>/<metric>": {"first", "first_step",
    "last", "last_step"}} for the validation loss and each eval.tasks task's headline metric."""
    out: Dict[str, Dict[str, Any]] = {}
    for r in recs:
        for key, v in r.items():
            name = key[5:] if key.startswith("eval/") else key
            if name.rsplit("/", 1)[-1] not in HEADLINE_EVAL or not isinstance(v, (int, float)):
                continue
            e = out.setdefault(name, {"first": v, "first_step": r["step"]})
            e.update(last=v, last_step=r["step"])
    return out


def heldout_summary(recs: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """GRPO's held-out pass@k: the starting policy's (``initial_heldout_pass_at_k``, measured
    before step 1) and the last evaluation's, per k: {"pass_at_1": {"initial", "last", "step"}}."""
    out: Dict[str, Dict[str, Any]] = {}
    for r in recs:
        for key, v in r.items():
            if key.startswith("initial_heldout_pass_at_"):
                out.setdefault(key[len("initial_heldout_"):], {})["initial"] = v
            elif key.startswith("heldout_pass_at_"):
                out.setdefault(key[len("heldout_"):], {}).update(last=v, step=r["step"])
    return out


class JobLaunch:
    """What differs between jobs on the driver. `plan` runs before Ray (every input error is
    one line before any cluster work); `start` after connecting (e.g. the reward service);
    `trainer` builds the TorchTrainer; `stop` always runs at the end."""

    job = "pretrain"  # the config validation's job name (elastic/config/load.py validate)

    def plan(self, cfg: Config, paths: RunPaths, say) -> None:
        raise NotImplementedError

    def describe(self) -> list:
        return []

    def start(self, cfg: Config, paths: RunPaths) -> None:
        pass

    def trainer(self, cfg: Config, paths: RunPaths, gpu: bool):
        raise NotImplementedError

    def stop(self) -> None:
        pass


def run_job(cfg: Config, launch: JobLaunch, out: Optional[TextIO] = None, progress: bool = True) -> JobResult:
    """Take the run's lease, plan (fails fast), start or join Ray, fit while showing progress,
    summarise. Raises LeaseHeld, DataError or ClusterError (one line) early.

    Console order: the cluster line first (which cluster and its address), then the run
    directory, the job's plan, worker-group events and the progress line.
    """
    out = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    def lost(rec: dict) -> None:
        say(f"[elastic] warning: pid {rec.get('pid')} on {rec.get('host')} took over the lease of {paths.run_dir}: "
            "this run's heartbeat stalled past the lease TTL")

    command_start = take_command_start(time.time())
    paths = run_paths(cfg)
    choice = resolve_cluster()
    try:
        return _run(cfg, launch, paths, choice, say, lost, out, progress, command_start)
    except BaseException as e:  # stopped by a signal (runtime/stop.py): say where the run can resume
        stopped = as_stop(e)
        if stopped is None:
            raise
        stopped.checkpoint = resume_checkpoint(paths.run_dir)
        raise stopped from None


def resume_checkpoint(run_dir: str) -> Optional[str]:
    """The checkpoint a relaunch resumes from: the newest one Ray Train registered (its
    checkpoint_manager_snapshot.json), else the newest complete one on storage. A save in flight
    when a job is stopped can finish on storage without being registered; it is not resumed."""
    import pyarrow.fs as pafs

    try:
        fs, base = pafs.FileSystem.from_uri(run_dir) if "://" in run_dir else (pafs.LocalFileSystem(), run_dir)
        with fs.open_input_stream(f"{base.rstrip('/')}/checkpoint_manager_snapshot.json") as f:
            name = json.loads(f.read())["latest_checkpoint_result"]["checkpoint_dir_name"]
        return f"{run_dir.rstrip('/')}/{name}"
    except Exception:  # no snapshot yet, or another Ray version's layout
        found = ckpt_lib.latest_complete(run_dir)
        return found[0] if found else None


def _run(cfg: Config, launch: JobLaunch, paths: RunPaths, choice, say, lost, out: TextIO, progress: bool,
         command_start: float) -> JobResult:
    # The progress line follows the run once the lease is taken: until the first step it says
    # what the job waits for when a phase takes a while (runtime/progress.py), and the driver's
    # lines go through it. (It follows a local metrics file; records on object stores have none.)
    follow = Progress(paths.records_dir if "://" not in paths.records_dir else paths.local_dir, cfg.train.steps,
                      cfg.train.until_step or cfg.train.steps, stream=out)
    try:
        return _run_followed(cfg, launch, paths, choice, follow.say if progress else say, follow.waiting_for, lost,
                             progress, follow, command_start)
    finally:
        follow.stop()  # (a follower never started stops at once)


def _run_followed(cfg: Config, launch: JobLaunch, paths: RunPaths, choice, say, wait, lost, progress: bool,
                  follow: Progress, command_start: float) -> JobResult:
    with RunLease(paths.run_dir, on_lost=lost) as lease:
        if progress:
            follow.start()
        os.makedirs(paths.local_dir, exist_ok=True)
        t0 = time.time()
        wait("the job's plan: its data, tokenizer and inputs")
        launch.plan(cfg, paths, say)
        check_lora_base(cfg, paths.run_dir)  # LoRA: the adapters' base is the one they were trained on
        with open(os.path.join(paths.local_dir, "config.json"), "w") as f:
            json.dump(to_dict(cfg), f, indent=2)
        # While the cluster starts (after planning: it would share the GIL with it).
        loading = preload(background=choice.kind != FROM_ENV)
        wait("a private Ray instance to start" if choice.kind == PRIVATE else
             "this process's Ray connection" if choice.kind == CONNECTED else f"the Ray cluster at {choice.address}")
        choice = connect(choice, private_cpus(cfg), worker_env())
        say(choice.describe())
        prev = lease.took_over
        if prev:
            say(f"[elastic] lease: took over a stale lease (pid {prev.get('pid')} on {prev.get('host')}: its run is gone)"
                if "pid" in prev else "[elastic] lease: replaced an unreadable lease file")
        latest = ckpt_lib.latest_complete(paths.run_dir)
        say(f"[elastic] run directory: {paths.run_dir} "
            f"({'existing run, latest checkpoint ' + os.path.basename(latest[0]) if latest else 'new run'})")
        for line in launch.describe():
            say(line)
        gpu = use_gpu(cfg)
        check_generation_weights(cfg, gpu, launch.job)
        if gpu:  # ask for no more GPU workers than the cluster has (scaling.fit, elastic/launch/runtime/fit.py)
            import ray

            cfg, note = fit_to_gpus(cfg, ray.cluster_resources().get("GPU", 0.0), launch.job)
            if note:
                say(note)
                with open(os.path.join(paths.local_dir, "config.json"), "w") as f:
                    json.dump(to_dict(cfg), f, indent=2)
        bundles, words = required_bundles(cfg, gpu)
        wait(f"the cluster's resources for {words}")
        wait_for_resources(bundles, words, cfg.scaling.resource_wait_s, "scaling.resource_wait_s")
        try:
            wait("the job's services and its trainer")
            launch.start(cfg, paths)
            if loading is not None:
                loading.join()
            trainer = launch.trainer(cfg, paths, gpu)
            wait("the Ray Train controller")
            try:
                from elastic.launch.runtime.cluster_watch import ClusterWatch

                with ClusterWatch(bundles, words, say):  # nodes that leave may leave it too small
                    result = call_interruptibly(trainer.fit)
            finally:
                job_s = time.time() - t0  # job time, the one figure the report, summary and console show
                if progress:
                    follow.stop()
                if stopped_by() is not None:
                    disconnect(abort_running)
                # also for a run that failed (it says where), or was stopped (then quietly: the stop is the one line)
                report = write_run_report(paths, say if stopped_by() is None else (lambda line: None), job_s)
        finally:
            if stopped_by() is None:
                launch.stop()
            else:  # stopped: the job's actors end with the driver's connection (stop.disconnect)
                disconnect(abort_running)
        ckpt = result.checkpoint.path if result.checkpoint is not None else None
        if result.error is not None:
            raise result.error
        from elastic.records import EVENTS, read_records

        stops = [e for e in read_records(os.path.join(paths.records_dir, EVENTS)) if e.get("event") == "stop" and e["time"] >= t0]
        summary = summarize(paths, job_s, ckpt, report, command_start)
        return JobResult(paths.run_dir, paths.local_dir, job_s, ckpt, summary, ray_logs_dir(),
                              stopped=stops[-1]["reason"] if stops else None, records_dir=paths.records_dir)


def write_run_report(paths: RunPaths, say, job_s: Optional[float] = None) -> Optional[dict]:
    """report.md, plots and the named bottleneck (elastic/report); never fails the run."""
    try:
        path, _, diag = build_report(paths.local_dir, records_dir=paths.records_dir, job_s=job_s)
    except Exception as e:  # a report must never take a finished run down
        say(f"[elastic] report: not written ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})")
        return None
    say(f"[elastic] bottleneck: {diag.name}: {diag.evidence} Lever: {diag.lever}.")
    return {"report": path, "bottleneck": diag.name, "evidence": diag.evidence, "lever": diag.lever}
