"""The one per-worker loop skeleton that Ray Train runs on every worker, for every job
(pretraining, SFT, GRPO, DPO). Ray Train re-runs it from the top after every elastic restart,
so all state comes from the checkpoint.

Per global step: take this rank's updates from the job (timed as the job's wait phase), run
each through `train_step` (loss, backward, clip, optimizer) with a global normaliser, let the
stability guard judge the step, log one metrics record with the time breakdown, append the
ledger, and every `checkpoint.every_steps` save a DCP checkpoint and report it to Ray Train.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional

import ray.train
import torch
import torch.distributed as dist

from elastic.config import from_dict, resolved_model_dims
from elastic.config.micro_batch import fit_micro_batches
from elastic.model import ModelArgs, Transformer, choose_backend, flops_per_token
from elastic.model.lora import LoRAConfig, apply_lora, init_adapters
from elastic.model.quantize import is_nf4, quantize_base
from elastic.records import EVENTS, LEDGER, METRICS, append_record
from elastic.train.checkpoint import Checkpointer, TrainState
from elastic.train.guard import StabilityGuard
from elastic.train.job import Job, WorkerContext
from elastic.train.metrics import MetricsWriter, init_wandb_async, peak_flops
from elastic.train.optim import build_optimizer, build_scheduler
from elastic.train.mesh import Layout, WorkerMesh, layout_for
from elastic.train.parallelize import parallelize
from elastic.train.profiling import StepProfiler
from elastic.train.comm import Comm
from elastic.train.step import train_step
from elastic.train.timing import StepTimer, memory_gib


def resolve_device(use_gpu: bool) -> torch.device:
    if use_gpu and torch.cuda.is_available():
        return ray.train.torch.get_device()
    return torch.device("cpu")


def resolve_compile(setting: str, device: torch.device) -> bool:
    """`train.compile`: auto compiles on CUDA (kernel fusion pays there), not on CPU."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def resolve_param_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "bf16" or (name == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def lora_of(cfg) -> Optional[LoRAConfig]:
    """The run's adapters (`model.lora`), or None for full fine-tuning."""
    return LoRAConfig.from_section(cfg.model.lora)


def quantized(cfg) -> bool:
    """QLoRA: the frozen base's block linears in NF4 (`model.quantize_base`, elastic/model/quantize.py)."""
    return getattr(cfg.model, "quantize_base", "none") == "nf4"


def build_model(cfg, device: torch.device) -> tuple[Transformer, ModelArgs, str]:
    """Deterministic full init of an unsharded model on the host, then to device (tests and
    single-process tools; workers use `build_sharded_model`). With `model.lora`, adapters are
    added (seeded, B = 0) and the base is frozen."""
    dims = resolved_model_dims(cfg)
    args = ModelArgs(**dims)
    backend = choose_backend(cfg.model.attention, device, resolve_compile(cfg.train.compile, device), cfg.data.seq_len)
    model = Transformer(args, attention_backend=backend)
    lora = lora_of(cfg)
    if lora is not None:
        apply_lora(model, lora)
    model.init_weights(seed=cfg.run.seed)
    if lora is not None:
        init_adapters(model, seed=cfg.run.seed)
    if quantized(cfg):
        quantize_base(model)
    return model.to(device), args, backend


def _assign_shard(p: torch.Tensor, full: torch.Tensor) -> None:
    """Keep this rank's shard of a full value (every rank holds the same full value, so no
    communication: `src_data_rank=None`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(p, DTensor):
        p.copy_(distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None))
    else:
        p.copy_(full)


def layout_of(cfg) -> Layout:
    """This worker group's layout (elastic/train/mesh.py) from its world size and `parallel.*`."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return layout_for(world, cfg.parallel.dp_replicate, cfg.parallel.tp, cfg.parallel.pp)


def worker_mesh(cfg, device: torch.device) -> WorkerMesh:
    """The worker's one mesh (elastic/train/mesh.py): built once per worker-group attempt by
    `run_worker` and handed to every model it builds (policy, reference, critic)."""
    return WorkerMesh.build(device.type, layout_of(cfg))


def build_sharded_model(cfg, device: torch.device, param_dtype: torch.dtype,
                        mesh: Optional[WorkerMesh] = None) -> tuple[Transformer, ModelArgs, str]:
    """Build on the meta device, apply FSDP2, then materialise only this rank's shards.

    `mesh`: the worker's mesh (`worker_mesh`; a single process or a test may leave it out and
    get one over every rank).

    No worker ever holds the whole model: parameters are drawn one at a time (the largest
    single tensor is the transient peak) and each rank keeps its shard. The weights equal
    `build_model`'s for the same seed, bit for bit, at any world size."""
    dims = resolved_model_dims(cfg)
    args = ModelArgs(**dims)
    backend = choose_backend(cfg.model.attention, device, resolve_compile(cfg.train.compile, device), cfg.data.seq_len)
    with torch.device("meta"):
        model = Transformer(args, attention_backend=backend)
    lora = lora_of(cfg)
    if lora is not None:  # before FSDP wraps the blocks: adapters are parameters of their block
        apply_lora(model, lora)
        if param_dtype != torch.float32:
            # The frozen base is stored in the compute dtype (e.g. bf16 on GPU): half the memory of
            # fp32 shards, and it never takes an optimizer step. Adapters stay fp32 (trainable).
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(param_dtype)
    ignored = None
    if quantized(cfg):
        # QLoRA: the base's block linears become NF4 on this device (zero codes until the base
        # is loaded: init_weights / load_initial_weights quantize each full weight, so the codes
        # never depend on the world size). FSDP2 leaves them out: each rank holds the whole
        # 4-bit base (torch 2.13's single-rank FSDP2 path drops NF4's extra all-gather inputs).
        ignored = quantize_base(model, device)
    mesh = mesh if mesh is not None else worker_mesh(cfg, device)
    if mesh.layout.pp > 1:
        return _build_stages(cfg, model, device, param_dtype, mesh), args, backend
    model = parallelize(model, device, param_dtype, cfg.train.activation_checkpointing, mesh, ignored_params=ignored,
                        loss_parallel=cfg.parallel.loss_parallel)
    model.to_empty(device=device)
    model.init_buffers()
    model.init_weights(seed=cfg.run.seed, assign=_assign_shard)
    if lora is not None:
        init_adapters(model, seed=cfg.run.seed, assign=_assign_shard)
    return model, args, backend


def lora_reference(cfg) -> Dict[str, Any]:
    """What a LoRA checkpoint's adapters apply to, as recorded in its train_state.json: the base
    (`model.init_from`, absolute; or `seed:N` for a seeded base) and the adapter settings. The
    driver adds the base's content hash (elastic/launch/lora_base.py)."""
    lo = cfg.model.lora
    base = os.path.abspath(cfg.model.init_from) if cfg.model.init_from else f"seed:{cfg.run.seed}"
    rec = {"base": base, "rank": lo.rank, "alpha": lo.alpha, "dropout": lo.dropout, "targets": list(lo.targets)}
    if quantized(cfg):  # the adapters were trained on the NF4 round trip of the base (export merges into it)
        rec["quantize_base"] = cfg.model.quantize_base
    return rec


def job_state_keys(make_job: Callable[[], Job]) -> tuple:
    return tuple(getattr(make_job, "state_keys", ()))


def load_initial_weights(model: torch.nn.Module, cfg) -> None:
    """`model.init_from` into the sharded model, each rank reading only what it holds: one of
    our DCP checkpoint directories (model tensors only; optimizer and data position start
    fresh), or a Hugging Face directory (elastic/model/hf.py). A LoRA checkpoint is its base
    with its adapters merged in. The model's own adapters, if any, are not touched."""
    src = getattr(cfg.model, "init_from", "")
    if src:
        load_weights_from(model, src)


def new_head(model: torch.nn.Module, src: str) -> bool:
    """A scalar-head model (reward model, critic) starting from a causal LM: the backbone comes
    from `src`, the score head keeps its seeded init (the vocabulary projection has no place)."""
    if not getattr(model.args, "num_labels", None):
        return False
    from elastic.config.init_from import resolve_init_from

    return not resolve_init_from(src).dims.get("num_labels")


def load_weights_from(model: torch.nn.Module, src: str) -> None:
    from elastic.train import checkpoint as ckpt_lib

    skip = ("output.weight",) if new_head(model, src) else ()
    if os.path.exists(os.path.join(src, ckpt_lib.STATE_FILE)):
        info = ckpt_lib.read_train_state(src).get("lora")
        nf4 = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters() if is_nf4(p)}
        if nf4 and info:  # the driver refused this already (elastic/model/hf.py check_init_from)
            raise RuntimeError(f"model.init_from {src}: model.quantize_base nf4 quantizes a full base; this checkpoint "
                               "holds LoRA adapters (export it merged with jobs/export_hf.py --merge-lora first)")
        if nf4:  # QLoRA on one of our checkpoints: DCP -> NF4, each weight read whole and quantized
            _load_whole_from_checkpoint(nf4, src)
            ckpt_lib.load(src, model, None, skip=skip + tuple(nf4))
            return
        if info:  # adapters only: the base it was trained on, then W += (alpha / r) B A
            base = info["base"]
            if base.startswith("seed:"):
                model.init_weights(seed=int(base[len("seed:"):]), assign=_assign_shard)
            else:
                load_weights_from(model, base)
            merge_checkpoint_adapters(model, src, LoRAConfig.from_section(info).scaling)
            return
        ckpt_lib.load(src, model, None, skip=skip)
        return
    from elastic.train.hf_load import load_hf_weights

    load_hf_weights(model, src, skip=skip)


@torch.no_grad()
def _load_whole_from_checkpoint(params: Dict[str, torch.Tensor], src: str) -> None:
    """Our name -> NF4 parameter, each read whole from checkpoint `src` (one tensor at a time, so
    the peak is the largest weight in full precision) and quantized by `copy_`, exactly as the
    Hugging Face path does (elastic/train/hf_load.py): the codes do not depend on where the
    weights came from. Every rank reads for itself (`no_dist`: no collective)."""
    import torch.distributed.checkpoint as dcp

    from elastic.model.dcp_io import model_tensor_specs

    specs = model_tensor_specs(src)
    for name, p in params.items():
        shape, dtype = specs[name]
        full = {"model": {name: torch.empty(shape, dtype=dtype)}}
        dcp.load(full, checkpoint_id=src, no_dist=True)
        p.copy_(full["model"][name].to(p.dtype).to(p.device))


@torch.no_grad()
def merge_checkpoint_adapters(model: torch.nn.Module, step_dir: str, scaling: float) -> None:
    """Add a LoRA checkpoint's ``scaling · B A`` to this rank's shards of the base weights. The
    adapters are small: every rank reads them whole (one process, no collective)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from elastic.model.dcp_io import read_model_state
    from elastic.model.lora import adapter_pairs

    params = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}
    for wname, (a, b) in adapter_pairs(read_model_state(step_dir, adapters_only=True)).items():
        p = params[wname]
        delta = (scaling * (b.float() @ a.float())).to(p.dtype)
        if isinstance(p, DTensor):
            delta = distribute_tensor(delta.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
        p.add_(delta)


def _build_stages(cfg, model: Transformer, device: torch.device, param_dtype: torch.dtype, mesh: WorkerMesh):
    """This pp rank's stages of the meta-device `model` (elastic/model/stages.py StageModel),
    each stage FSDP-sharded over the data-parallel axis, materialised with the whole model's
    seeded values for what it holds."""
    from elastic.model.stages import StageModel, init_stage_weights
    from elastic.train.pipeline import rank_stages

    layout, p = mesh.layout, cfg.parallel
    pp_rank = layout.pp_rank(dist.get_rank())
    stages = StageModel(model, layout.pp * p.pp_virtual_stages, rank_stages(pp_rank, layout.pp, p.pp_virtual_stages))
    for stage in stages.stages:
        parallelize(stage, device, param_dtype, cfg.train.activation_checkpointing, mesh, loss_parallel=False)
    stages.collect()  # the (wrapped) layers under their full names
    stages.to_empty(device=device)
    init_stage_weights(stages, cfg.run.seed, assign=_assign_shard)
    return stages


def pipeline_of(model, cfg, mesh: WorkerMesh, device: torch.device):
    """The schedule over this rank's stages (elastic/train/pipeline.py); None without pp."""
    if mesh.layout.pp == 1:
        return None
    from elastic.train.pipeline import Pipeline

    p = cfg.parallel
    return Pipeline(model, mesh.pp_group(), device, microbatches=p.pp_microbatches, schedule=p.pp_schedule,
                    tied_group=mesh.tied_group())


def _fault_steps(var: str) -> set:
    """Fault injection for tests and drills: e.g. ELASTIC_FAULT_NAN_STEPS="5,7-9" poisons the loss
    of those 1-based steps with NaN. Unset in normal runs."""
    out = set()
    for part in filter(None, os.environ.get(var, "").split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def run_worker(config: Dict[str, Any], make_job: Callable[[], Job]) -> None:
    """The skeleton. `config` is Ray Train's train_loop_config: {"cfg": dict, "local_dir": str,
    "use_gpu": bool, ...job inputs}; `make_job` builds this job's Job."""
    cfg = from_dict(config["cfg"])
    local_dir: str = config["local_dir"]  # wandb files, profiler traces (this machine)
    # metrics/ledger/events: the run directory, a pyarrow URI when storage is remote (elastic/records.py)
    records_dir: str = config.get("records_dir", local_dir)
    rctx = ray.train.get_context()
    rank, world = rctx.get_world_rank(), rctx.get_world_size()
    # wandb starts in the background from here (rank 0): its import and service take seconds,
    # which the model's build and the first step cover (elastic/train/metrics.py).
    wb = init_wandb_async(cfg.wandb.mode, cfg.wandb.project, cfg.wandb.entity, cfg.run.name, local_dir,
                          config["cfg"]) if rank == 0 else None
    device = resolve_device(config["use_gpu"])
    if device.type == "cpu":
        # This (training) thread's own pool; the launcher sets OMP_NUM_THREADS=1 so the actor's
        # main thread never builds a second one (see elastic/launch/driver.py worker_env).
        torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    t = cfg.train

    param_dtype = resolve_param_dtype(t.param_dtype, device)
    mesh = worker_mesh(cfg, device)  # the one mesh of this attempt: every group below is its
    layout = mesh.layout
    model, args, backend = build_sharded_model(cfg, device, param_dtype, mesh)
    comm = Comm.of(model)  # every collective of this worker, on the parameters' device
    # Under tensor parallelism the tp ranks of one data-parallel rank read the same batch: jobs
    # see the data-parallel rank and world, and sum loss units and tokens over their dp peers.
    dp_comm = Comm(comm.device, group=mesh.dp_group()) if mesh.dp_group() is not None else comm
    tp_comm = Comm(comm.device, group=mesh.tp_group()) if layout.tp > 1 else None
    dp_rank, dp_world = layout.dp_rank(rank), layout.dp
    # Micro-batch sizes are upper bounds: the largest that divides this world size's share.
    # The driver's console says it once per worker-group start (the "start" event below).
    fitted = fit_micro_batches(cfg, dp_world, getattr(make_job, "micro_batch_keys", ("train.micro_batch_size",)))
    if resolve_compile(t.compile, device):
        for block in (model.layers.values() if isinstance(model.layers, torch.nn.ModuleDict) else model.layers):
            block.compile()
    pipe = pipeline_of(model, cfg, mesh, device)  # pipeline stages: the schedule runs the step
    opt = build_optimizer(model, t.lr, t.weight_decay, (t.beta1, t.beta2), fused=device.type == "cuda")
    lora = lora_of(cfg)
    # LoRA checkpoints hold the adapters only: the frozen base is loaded from its source on
    # every (re)start, then the adapters and their optimizer state from the checkpoint.
    # Checkpoints go straight into the run dir (Ray Train's experiment dir); by default they are
    # written in the background (elastic/train/checkpoint.py).
    ckpt = Checkpointer(cfg.checkpoint.every_steps, job_state_keys(make_job), trainable_only=lora is not None,
                        run_dir=config["run_dir"], comm=comm, async_save=cfg.checkpoint.async_save,
                        events=os.path.join(records_dir, EVENTS), every_s=cfg.checkpoint.every_s)
    if lora is not None:
        load_initial_weights(model, cfg)
    job = make_job()
    aux = job.build_aux(cfg, device, param_dtype, mesh)  # a job's own modules (PPO's critic), checkpointed with the model
    state = ckpt.restore(model, opt, aux)
    if state is None:
        state = TrainState()
        if lora is None:
            load_initial_weights(model, cfg)  # model.init_from, if any (else the seeded init stands)
        job.init_aux(cfg)
    start_step, counters = state.step, state.counters
    job.start(WorkerContext(cfg, dp_rank, dp_world, device, model, records_dir, config, dp_comm, global_rank=rank,
                            tp_rank=layout.tp_rank(rank), tp_comm=tp_comm, mesh=mesh, pipeline=pipe), state.job)
    ups = job.updates_per_step  # optimizer updates per global step (GRPO: several per rollout)
    sched = build_scheduler(opt, t.warmup_steps * ups, t.steps * ups, t.min_lr_ratio)
    if state.scheduler:
        sched.load_state_dict(state.scheduler)
        # Building the scheduler set the step-0 LR on the (already restored) optimizer: put
        # back the LR of the step being resumed.
        for group, lr in zip(opt.param_groups, sched.get_last_lr()):
            group["lr"] = lr

    # One id per worker-group attempt, shared by all ranks (the ledger groups records by it).
    start_time = comm.broadcast_object(time.time(), src=0)
    counters.setdefault("tokens", 0)
    counters.setdefault("run_start", start_time)
    counters.setdefault("useful_s", 0.0)  # seconds of steps up to the checkpoint (they count)
    counters.setdefault("skipped_steps", 0)
    attempt_useful = 0.0
    os.makedirs(local_dir, exist_ok=True)
    events = os.path.join(records_dir, EVENTS)
    append_record(events, {"event": "worker", "time": start_time, "rank": rank, "world_size": world, "pid": os.getpid(),
                           "node_id": ray.get_runtime_context().get_node_id()})
    if rank == 0:
        append_record(events, {
            "event": "start", "time": start_time, "world_size": world, "step": start_step,
            "resumed_from": ckpt.resumed_from, "attention_backend": backend,
            "device": str(device), "param_dtype": str(param_dtype).replace("torch.", ""),
            "nice": os.nice(0), "torch_threads": torch.get_num_threads(),
            "mesh": layout.describe(), "micro_batches": {f.key: f.used for f in fitted},
            "micro_batch_notes": [f.describe("completions" if f.key.startswith("rl.") else "rows")
                                  for f in fitted if f.used != f.setting]})
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"[elastic] rank 0/{world}: step {start_step}/{t.steps}, attention={backend}, device={device}, "
              f"params={model.num_params()}, trainable={trainable}, param_dtype={param_dtype}")

    fpt = flops_per_token(args, cfg.data.seq_len)
    peak, peak_src = peak_flops(device)
    writer = None
    if rank == 0:
        writer = MetricsWriter(os.path.join(records_dir, METRICS), wb)
    ledger = os.path.join(records_dir, LEDGER) if cfg.data.ledger else None
    timer = StepTimer(device)
    profiler = StepProfiler(device, os.path.join(local_dir, "profile"), t.profile_steps, t.comm_sample_every, enabled=rank == 0)
    guard = StabilityGuard(t.max_bad_steps, t.spike_z)
    nan_steps = _fault_steps("ELASTIC_FAULT_NAN_STEPS")
    loss_fn = job.loss_fn()
    if pipe is not None:
        from elastic.train.pipeline import pipeline_train_step
        from elastic.train.step import causal_lm_loss

        if loss_fn is not causal_lm_loss:  # config validation allows pp for pretraining and SFT only
            raise RuntimeError(f"parallel.pp {layout.pp}: this job's loss ({getattr(loss_fn, '__name__', loss_fn)}) "
                               "does not run pipelined; pipeline stages train the causal LM loss")

    stop = t.until_step or t.steps
    try:
        for step in range(start_step, stop):
            s1 = step + 1
            timer.reset()
            t0 = time.perf_counter()
            lr = sched.get_last_lr()[0]
            losses, grad_norm, skipped, tokens, compute_tokens, sample_ids = [], 0.0, False, 0, 0, []
            with profiler.step(s1, first=step == start_step):
                it = job.updates(step)
                while True:
                    with timer.phase(job.wait_phase, host=True):
                        upd = next(it, None)
                    if upd is None:
                        break
                    if upd.normaliser is not None:
                        norm = upd.normaliser
                    else:
                        with timer.phase("sync", host=True):  # also where ranks wait for the slowest one's data
                            norm = dp_comm.sum([upd.units])[0]
                    if pipe is not None:
                        out = pipeline_train_step(pipe, opt, upd.micro_batches, norm, t.grad_clip, dp_comm, timer,
                                                  poison=s1 in nan_steps)
                    else:
                        out = train_step(model, opt, upd.micro_batches, loss_fn, norm, t.grad_clip, dp_comm, timer,
                                         poison=s1 in nan_steps)
                    sched.step()
                    job.observe(out)
                    losses.append(out.stats.get("loss_sum", float("nan")) / max(norm, 1e-12))
                    grad_norm, skipped = out.grad_norm, skipped or out.skipped
                    tokens += upd.tokens
                    compute_tokens += upd.tokens if upd.compute_tokens is None else upd.compute_tokens
                    sample_ids += upd.sample_ids
                sample_ids += job.consumed_sample_ids()
            local_s = time.perf_counter() - t0
            metrics_extra = job.step_metrics()
            with timer.phase("eval", host=True):  # held-out evaluation, on the steps the job evaluates
                evals = job.evaluate(s1)
            # One small collective: global token counts and the slowest rank's time (also a barrier).
            with timer.phase("sync", host=True):
                gathered = dp_comm.gather([float(tokens), local_s, float(compute_tokens), float(job.forward_tokens())])
            phases = timer.seconds()
            if not evals:
                phases.pop("eval_s", None)
            pp_figures = {}
            if pipe is not None:  # each stage's busy time and memory, gathered over the pp group
                from elastic.train.pipeline_bubble import BUSY_PHASE, stage_figures

                pp_figures = stage_figures(pipe.pp_comm, phases, next(iter(memory_gib(device).values())),
                                           schedule=pipe.schedule_name, microbatches=pipe.microbatches,
                                           virtual=pipe.virtual)
                phases.pop(f"{BUSY_PHASE}_s", None)  # inside pipeline_s: per stage in pp_stage_busy_s
            tokens_global = int(gathered[:, 0].sum())
            slowest = float(gathered[:, 1].max())
            trained_global, forward_global = float(gathered[:, 2].sum()), float(gathered[:, 3].sum())
            loss = sum(losses) / max(1, len(losses))
            verdict = guard.observe(s1, loss, grad_norm, skipped)
            if verdict.bad:
                counters["skipped_steps"] = int(counters["skipped_steps"]) + 1
            counters["tokens"] = int(counters["tokens"]) + tokens_global
            if ledger and layout.tp_rank(rank) == 0 and layout.pp_rank(rank) == 0:  # one record per data-parallel rank
                # (its tp peers and pp stages read the same rows)
                append_record(ledger, {"step": s1, "rank": dp_rank, "world_size": dp_world, "start_time": start_time,
                                       "sample_ids": sample_ids})
            if verdict.stop:
                if rank == 0:
                    append_record(events, {"event": "stop", "time": time.time(), "step": s1, "reason": verdict.stop})
                    print(f"[elastic] stopping: {verdict.stop}")
                break
            ckpt_t = None  # this step's checkpoint seconds (elastic/train/checkpoint.py)
            step_s_train = time.perf_counter() - t0
            # Never checkpoint inside a streak of bad steps: the last good checkpoint is what a
            # relaunch (e.g. with a lower LR) should resume from.
            if ckpt.due(s1, s1 == stop) and not verdict.bad:
                counters["useful_s"] = counters["useful_s"] + attempt_useful + step_s_train  # saved: they count
                attempt_useful = 0.0
                info = {"flops_per_token": fpt, "peak_flops": peak, "peak_flops_source": peak_src}
                if lora is not None:  # what the adapters apply to (export and init_from find the base here)
                    info["lora"] = config.get("lora_base") or lora_reference(cfg)
                state = TrainState(step=s1, scheduler=sched.state_dict(), counters=counters, job=job.state(),
                                   world_size=world, info=info)
                if rank == 0:
                    append_record(events, {"event": "checkpoint_start", "time": time.time(), "step": s1})
                ckpt_t = ckpt.save(model, opt, state, {"step": s1, "loss": loss}, final=s1 == stop, aux=aux)
            else:  # while a save is writing in the background: register it once every rank is done
                ckpt_t = ckpt.poll()
            step_s = time.perf_counter() - t0
            saved = ckpt_t is not None and "checkpoint_stall_s" in ckpt_t
            attempt_useful += step_s - (step_s_train if saved else 0.0)
            if rank == 0:
                # MFU = model FLOPs / step time / (peak x devices), model FLOPs = flops_per_token x
                # (tokens through forward+backward + forward-only tokens / 3): a forward is a third
                # of a training pass (2N of 6N per token). Forward-only: reference and old-policy
                # log-probs, generation, held-out evaluation (Job.forward_tokens).
                model_flops = fpt * (trained_global + forward_global / 3.0)
                rec = {"step": s1, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": tokens_global,
                       "tokens_per_s": tokens_global / step_s, "mfu": model_flops / step_s / (peak * world),
                       "step_s": step_s, "slowest_rank_step_s": slowest, "world_size": world,
                       # The attempt's first step (compile, CUDA/data start-up): not a steady rate.
                       **({"warmup": True} if step == start_step else {}),
                       **{k: v for k, v in phases.items()}, **pp_figures, **memory_gib(device), "time": time.time()}
                # The optimizer updates' own time (GRPO's update phase; forward+backward+optimizer).
                rec["update_s"] = sum(phases.get(k, 0.0) for k in ("forward_s", "backward_s", "pipeline_s", "optimizer_s"))
                if rec["update_s"] > 0:  # the same FLOPs formula over the updates' own time (rank 0's)
                    rec["update_mfu"] = fpt * trained_global / rec["update_s"] / (peak * world)
                if forward_global:
                    rec["forward_tokens"] = int(forward_global)
                if ckpt_t is not None:
                    rec.update(ckpt_t)
                if profiler.comm_s is not None:
                    rec["comm_s"] = profiler.comm_s
                if profiler.overhead_s:
                    rec["profile_s"] = profiler.overhead_s
                if verdict.bad:
                    rec.update(skipped=True, bad_steps=guard.consecutive_bad)
                    append_record(events, {"event": "bad_step", "time": rec["time"], "step": s1, "reason": verdict.reason})
                if verdict.spike_z is not None:
                    append_record(events, {"event": "loss_spike", "time": rec["time"], "step": s1, "z": verdict.spike_z, "loss": loss})
                if evals:
                    append_record(events, {"event": "eval", "time": rec["time"], "step": s1, **evals})
                rec.update(metrics_extra)
                rec.update(evals)
                # Live goodput: steps that will count (checkpointed + this attempt's) over wall time.
                rec["goodput"] = (counters["useful_s"] + attempt_useful) / max(1e-9, rec["time"] - counters["run_start"])
                writer.write(rec)
                if s1 % t.log_every == 0 or step == start_step:
                    print(f"[elastic] step {s1}/{t.steps} loss {loss:.4f} lr {lr:.2e} tok/s {rec['tokens_per_s']:.0f} "
                          f"mfu {rec['mfu']:.2%} data_wait {phases.get(job.wait_phase + '_s', 0) * 1e3:.0f}ms world {world}")
        # A stop rule ended the loop early (or the last step could not save): register the save
        # still writing, if any, before returning.
        ckpt.finish()
    finally:
        ckpt.close()
        profiler.close()
    job.close()
    if rank == 0:
        writer.close()


def train_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for language-modelling jobs (pretraining, SFT)."""
    from elastic.train.lm_job import LMJob

    run_worker(config, LMJob)
