"""The per-worker pretraining loop that Ray Train runs on every worker (and re-runs from the
top after every elastic restart, so all state comes from the checkpoint).

Per step: take the next exact global batch from the data stream, train on this rank's
slice, log one metrics record, and every `checkpoint.every_steps` save a DCP checkpoint and
report it to Ray Train.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import ray.train
import torch
import torch.distributed as dist

from elastic.config import from_dict, resolved_model_dims
from elastic.data.cursor import Cursor
from elastic.data.documents import BadRows
from elastic.data.pipeline import DataPlan, GlobalBatches, build_dataset, epochs_needed
from elastic.model import ModelArgs, Transformer, choose_backend, flops_per_token
from elastic.records import append_record
from elastic.train import checkpoint as ckpt_lib
from elastic.train.metrics import MetricsWriter, init_wandb, peak_flops
from elastic.train.optim import build_optimizer, build_scheduler
from elastic.train.parallelize import parallelize
from elastic.train.step import label_tokens, train_step


def resolve_device(use_gpu: bool) -> torch.device:
    if use_gpu and torch.cuda.is_available():
        return ray.train.torch.get_device()
    return torch.device("cpu")


def resolve_param_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "bf16" or (name == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def build_model(cfg, device: torch.device) -> tuple[Transformer, ModelArgs, str]:
    """Deterministic full init on the host (same weights at any world size), then to device."""
    dims = resolved_model_dims(cfg)
    args = ModelArgs(**dims)
    backend = choose_backend(cfg.model.attention, device)
    model = Transformer(args, attention_backend=backend)
    model.init_weights(seed=cfg.run.seed)
    return model.to(device), args, backend


def train_loop_per_worker(config: Dict[str, Any]) -> None:
    cfg = from_dict(config["cfg"])
    plan: DataPlan = config["plan"]
    local_dir: str = config["local_dir"]  # metrics/ledger/events (a local mirror when storage is remote)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = resolve_device(config["use_gpu"])
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    t, B = cfg.train, cfg.train.global_batch_size
    per_rank = B // world

    model, args, backend = build_model(cfg, device)
    param_dtype = resolve_param_dtype(t.param_dtype, device)
    model = parallelize(model, device, param_dtype, t.activation_checkpointing)
    if t.compile:
        for block in model.layers:
            block.compile()
    opt = build_optimizer(model, t.lr, t.weight_decay, (t.beta1, t.beta2), fused=device.type == "cuda")
    sched = build_scheduler(opt, t.warmup_steps, t.steps, t.min_lr_ratio)

    start_step, cursor, counters = 0, Cursor(), {"tokens": 0, "bad_rows": {}}
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = ckpt_lib.load(d, model, opt)
        sched.load_state_dict(state["scheduler"])
        start_step, cursor, counters = int(state["step"]), Cursor.from_dict(state["cursor"]), state["counters"]
    # One id per worker-group attempt, shared by all ranks (the ledger groups records by it).
    ids = [time.time()]
    dist.broadcast_object_list(ids, src=0)
    start_time = ids[0]
    counters.setdefault("run_start", start_time)
    counters.setdefault("useful_s", 0.0)  # seconds of steps up to the checkpoint (they count)
    attempt_useful = 0.0
    os.makedirs(local_dir, exist_ok=True)
    events = os.path.join(local_dir, "events.jsonl")
    append_record(events, {"event": "worker", "time": start_time, "rank": rank, "world_size": world, "pid": os.getpid(),
                          "node_id": ray.get_runtime_context().get_node_id()})
    if rank == 0:
        append_record(events, {
            "event": "start", "time": start_time, "world_size": world, "step": start_step,
            "resumed_from": ckpt.path if ckpt is not None else None, "attention_backend": backend,
            "device": str(device), "param_dtype": str(param_dtype).replace("torch.", "")})
        print(f"[elastic] rank 0/{world}: step {start_step}/{t.steps}, attention={backend}, device={device}, "
              f"params={model.num_params() if hasattr(model, 'num_params') else '?'}, param_dtype={param_dtype}")

    samples_total = t.steps * B

    def make_dataset(c: Cursor):
        return build_dataset(plan, c, epochs_needed(plan, c, max(0, samples_total - c.consumed)))

    batches = GlobalBatches(ray.train.get_dataset_shard("train"), make_dataset, cursor, B, plan.num_shards)
    bad_total = BadRows.from_dict(counters.get("bad_rows", {}), keep=plan.report_bad_rows)
    fpt = flops_per_token(args, plan.seq_len)
    peak, peak_src = peak_flops(device)
    writer = None
    if rank == 0:
        wb = init_wandb(cfg.wandb.mode, cfg.wandb.project, cfg.wandb.entity, cfg.run.name, local_dir, config["cfg"])
        writer = MetricsWriter(os.path.join(local_dir, "metrics.jsonl"), wb)
    ledger = os.path.join(local_dir, "ledger.jsonl") if cfg.data.ledger else None

    stop = t.until_step or t.steps
    for step in range(start_step, stop):
        t0 = time.perf_counter()
        gb = batches.next()
        data_wait = time.perf_counter() - t0
        local = {k: gb[k][rank * per_rank:(rank + 1) * per_rank] for k in ("tokens", "positions", "doc_ids")}
        n_labels = label_tokens(gb)  # the whole global batch's: the loss normaliser on every rank
        out = train_step(model, opt, local, n_labels, t.micro_batch_size, world, t.grad_clip, device, backend)
        lr = sched.get_last_lr()[0]
        sched.step()
        loss_sum = out["loss_sum"].clone()
        dist.all_reduce(loss_sum)  # also a barrier: step time is the slowest rank's
        loss = float(loss_sum) / max(1, n_labels)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_s = time.perf_counter() - t0
        attempt_useful += step_s
        tokens = int(gb["n_real"].sum())
        counters["tokens"] = int(counters["tokens"]) + tokens
        bad_total.merge(batches.take_bad_rows())
        if ledger:
            append_record(ledger, {"step": step + 1, "rank": rank, "world_size": world, "start_time": start_time,
                                  "sample_ids": gb["sample_id"][rank * per_rank:(rank + 1) * per_rank].tolist()})
        if rank == 0:
            rec = {
                "step": step + 1, "loss": loss, "lr": lr,
                "grad_norm": out["grad_norm"], "tokens": tokens, "tokens_per_s": tokens / step_s,
                "mfu": fpt * tokens / step_s / (peak * world), "data_wait_s": data_wait, "step_s": step_s,
                "world_size": world, "samples_consumed": batches.cursor.consumed, "bad_rows": bad_total.total,
                "time": time.time(),
            }
            # Live goodput: steps that will count (checkpointed + this attempt's) over wall time.
            rec["goodput"] = (counters["useful_s"] + attempt_useful) / max(1e-9, rec["time"] - counters["run_start"])
            if device.type == "cuda":
                rec["max_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            writer.write(rec)
            if (step + 1) % t.log_every == 0 or step == start_step:
                print(f"[elastic] step {step + 1}/{t.steps} loss {rec['loss']:.4f} lr {lr:.2e} "
                      f"tok/s {rec['tokens_per_s']:.0f} mfu {rec['mfu']:.2%} data_wait {data_wait * 1e3:.0f}ms world {world}")
        done = step + 1 == stop
        if (step + 1) % cfg.checkpoint.every_steps == 0 or done:
            counters["bad_rows"] = bad_total.to_dict()
            counters["useful_s"] = counters["useful_s"] + attempt_useful
            attempt_useful = 0.0
            state = {"step": step + 1, "cursor": batches.cursor.to_dict(), "scheduler": sched.state_dict(),
                     "counters": counters, "world_size": world, "time": time.time(),
                     "flops_per_token": fpt, "peak_flops": peak, "peak_flops_source": peak_src}
            local_ckpt = ckpt_lib.save_local(model, opt, state)
            ray.train.report({"step": step + 1, "loss": loss},
                             checkpoint=ray.train.Checkpoint.from_directory(local_ckpt),
                             checkpoint_dir_name=ckpt_lib.checkpoint_dir_name(step + 1))
            ckpt_lib.cleanup_local(local_ckpt)
    if rank == 0:
        if bad_total.total:
            print(f"[elastic] skipped {bad_total.total} malformed rows {bad_total.counts}; first: {bad_total.examples}")
        writer.close()
