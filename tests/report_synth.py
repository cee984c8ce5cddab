"""Synthetic but realistic run directories for the report tests.

A small simulator writes what the trainer and the Ray Train controller write: a `start` event
per worker-group attempt (and a `worker` event per rank), one metrics record per step with the
step-time split that sums to `step_s`, checkpoints every `every` steps, controller decisions and
state changes around failures and resizes, steps redone from the last checkpoint after a
failure, validation every `eval_every` steps, and for GRPO the generate / reward wait /
log-prob / update split and the reward statistics. The clock is simulated, so a 1000-step run
is written in milliseconds.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from elastic.records import append_record


@dataclass
class Profile:
    """Mean seconds of each part of a step (pretraining), or of a GRPO step."""

    data_wait: float = 0.01
    forward: float = 0.30
    backward: float = 0.60
    optimizer: float = 0.05
    comm_frac: float = 0.05  # exposed comm as a share of forward+backward (profiled steps)
    checkpoint: float = 0.05  # on saving steps (asynchronous saves: their stall)
    # Set: asynchronous saves (today's trainer): on the saving step `checkpoint` is the stall, of
    # which `checkpoint_wait` waited for the previous save; the write takes `checkpoint_write`
    # seconds in the background and is registered at the next step (`checkpoint_done` event).
    # None: synchronous saves without stall fields or events (trainers before async saves).
    checkpoint_write: Optional[float] = None
    checkpoint_wait: float = 0.0
    sync: float = 0.002  # waiting at the step's collectives for the slowest rank
    # GRPO (used when grpo=True)
    generate: float = 2.0
    reward_wait: float = 0.3
    logprob: float = 0.3
    update: float = 0.8


@dataclass
class Sim:
    steps: int = 200
    total: Optional[int] = None  # train.steps (default: steps)
    world: int = 2
    device: str = "cpu"
    grpo: bool = False
    profile: Profile = field(default_factory=Profile)
    every: int = 20
    eval_every: int = 50
    profile_every: int = 10
    mfu: float = 0.02
    device_mem_gib: Optional[float] = None  # set → CUDA memory fields
    mem_frac: float = 0.5
    # (after_step, kind, new_world): kind "failure" | "resize"
    restarts: List[Tuple[int, str, int]] = field(default_factory=list)
    skipped: Set[int] = field(default_factory=set)
    loss_spikes: Set[int] = field(default_factory=set)
    first_step_wait: float = 0.0  # extra data wait on the first step of each attempt (pipeline start)
    seed: int = 0
    t0: float = 1_795_000_000.0


def simulate(sim: Sim) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], float]:
    """(metrics, events, end time) of a simulated run."""
    rng = np.random.default_rng(sim.seed)
    p = sim.profile
    total = sim.total or sim.steps
    metrics: List[Dict[str, Any]] = []
    events: List[Dict[str, Any]] = []
    t = sim.t0
    world = sim.world
    seq, B = 256, 16
    peak_tokens = 0.0
    useful = 0.0
    pending = sorted(sim.restarts)
    last_ckpt = 0

    attempt: List[Dict[str, Any]] = []

    def start(step: int) -> None:
        attempt.clear()
        events.append({"event": "start", "time": t, "world_size": world, "step": step,
                       "resumed_from": f"/runs/x/step_{step:08d}" if step else None,
                       "attention_backend": "sdpa_mask" if sim.device == "cpu" else "flex", "device": sim.device})
        for rank in range(world):
            events.append({"event": "worker", "time": t, "rank": rank, "world_size": world, "pid": 1000 + rank})

    start(0)
    step, first = 0, True
    while step < sim.steps:
        step += 1
        j = lambda m: float(m * rng.lognormal(0.0, 0.08))  # noqa: E731  per-part noise
        if sim.grpo:
            parts = {"generate_s": j(p.generate), "reward_wait_s": j(p.reward_wait), "logprob_s": j(p.logprob),
                     "update_s": j(p.update)}
        else:
            parts = {"data_wait_s": j(p.data_wait) + (sim.first_step_wait if first else 0.0), "forward_s": j(p.forward),
                     "backward_s": j(p.backward), "optimizer_s": j(p.optimizer)}
        parts["sync_s"] = j(p.sync)
        extra: Dict[str, Any] = {}
        if step % sim.every == 0 or step == total:
            parts["checkpoint_s"] = j(p.checkpoint)
            if p.checkpoint_write is not None:
                extra = {"checkpoint_stall_s": parts["checkpoint_s"], "checkpoint_wait_s": min(p.checkpoint_wait, parts["checkpoint_s"])}
        elif p.checkpoint_write is not None and step % sim.every == 1 and step > 1:
            parts["checkpoint_s"] = 0.004  # the agreement and the registration of the previous save
        step_s = sum(parts.values()) + 0.002
        t += step_s
        tokens = int(B * seq * 0.97)
        progress = step / total
        loss = 2.5 + 5.0 * math.exp(-step / (0.15 * total)) + float(rng.normal(0, 0.02))
        grad = float(0.8 * rng.lognormal(0, 0.15))
        warm = max(1, total // 20)
        lr = 3e-3 * (step / warm if step <= warm else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))
        rec: Dict[str, Any] = {
            "step": step, "loss": loss, "lr": lr, "grad_norm": grad, "tokens": tokens, "tokens_per_s": tokens / step_s,
            "mfu": sim.mfu * (1 + float(rng.normal(0, 0.02))), "step_s": step_s, "world_size": world,
            "samples_consumed": step * B, "bad_rows": 3, "time": t, **parts, **extra,
            "slowest_rank_step_s": step_s * 0.98, "skipped": False, "bad_steps": 0,
        }
        if step % sim.profile_every == 0 and not sim.grpo:
            rec["comm_s"] = (parts["forward_s"] + parts["backward_s"]) * p.comm_frac
        if sim.device_mem_gib:
            peak = sim.device_mem_gib * sim.mem_frac * min(1.0, 0.6 + step / 20)
            rec.update(max_mem_gib=peak * 0.9, max_reserved_gib=peak, device_mem_gib=sim.device_mem_gib)
        else:
            peak_tokens = max(peak_tokens, 1.1 + 0.2 * min(1.0, step / 10))
            rec["peak_rss_gib"] = peak_tokens
        if step in sim.skipped:
            rec.update(loss=float("nan"), grad_norm=float("inf"), skipped=True, bad_steps=1)
            events.append({"event": "bad_step", "time": t, "step": step, "reason": "non-finite grad norm"})
        if step in sim.loss_spikes:
            rec["loss"] = loss * 1.8
            rec["grad_norm"] = grad * 12
        if step % sim.eval_every == 0:
            rec["val_loss"] = loss + 0.1
            rec["val_ppl"] = math.exp(loss + 0.1)
            events.append({"event": "eval", "time": t, "step": step, "val_loss": loss + 0.1})
        if sim.grpo:
            pr = min(0.9, 0.1 + 0.6 * progress + float(rng.normal(0, 0.03)))
            rec.update(reward_mean=0.1 + 0.7 * pr, reward_std=0.2, reward_max=min(1.0, 0.3 + pr), pass_rate=pr,
                       compile_error_rate=0.3 * (1 - progress), wrong_answer_rate=0.5 * (1 - pr), timeout_rate=0.02,
                       sandbox_error_rate=0.0, speedup_mean=1.0 + progress, zero_var_frac=0.25, adv_mean=0.0, adv_std=0.9,
                       resp_len_mean=180.0, resp_len_max=256, trunc_rate=0.1, entropy=0.9 - 0.3 * progress,
                       kl=0.002 * step, clip_frac_low=0.01, clip_frac_high=0.02, policy_loss=-0.01,
                       gen_tokens_per_s=900.0, reward_evals_per_s=6.0)
            if step % sim.eval_every == 0:
                rec.update(heldout_pass_at_1=pr * 0.8, heldout_speedup=1.0 + progress / 2)
        if "checkpoint_s" in parts and (p.checkpoint_write is None or "checkpoint_stall_s" in extra):
            last_ckpt = step
        if "checkpoint_stall_s" in extra:
            events.append({"event": "checkpoint_done", "time": t + p.checkpoint_write, "step": step,
                           "write_s": j(p.checkpoint_write), "stall_s": extra["checkpoint_stall_s"], "async": True})
        useful += step_s
        rec["goodput"] = useful / (t - sim.t0)
        metrics.append(rec)
        attempt.append(rec)
        first = False
        if pending and pending[0][0] == step:
            _, kind, new_world = pending.pop(0)
            if kind == "failure":
                t += 3.0
                events.append({"event": "failure_decision", "time": t, "decision": "RETRY"})
                events.append({"event": "controller_state", "time": t, "from": "RunningState", "to": "RestartingState",
                               "error": "Worker group failed: RayActorError: the actor died unexpectedly"})
                events.append({"event": "resize_decision", "time": t + 0.5, "num_workers": new_world})
            else:
                t += 1.0
                events.append({"event": "resize_decision", "time": t, "num_workers": new_world})
                events.append({"event": "controller_state", "time": t, "from": "RunningState", "to": "ResizingState"})
            useful -= sum(r["step_s"] for r in attempt if r["step"] > last_ckpt)  # redone from the checkpoint
            step = last_ckpt
            t += 12.0  # worker group restart, model build, data seek
            world = new_world
            events.append({"event": "controller_state", "time": t - 1, "from": "SchedulingState", "to": "RunningState"})
            start(step)
            first = True
    return metrics, events, t


def write_run(d: str, sim: Sim, state: str = "finished", name: str = "synth") -> str:
    """Write a run directory. state: finished | in_progress | crashed | stopped."""
    os.makedirs(d, exist_ok=True)
    metrics, events, t_end = simulate(sim)
    total = sim.total or sim.steps
    cfg = {"run": {"name": name, "storage_path": os.path.dirname(d), "seed": 0},
           "data": {"seq_len": 256, "tokenize_cpus": 1.0},
           "train": {"steps": total, "global_batch_size": 16, "micro_batch_size": 8, "lr": 3e-3, "warmup_steps": 10,
                     "grad_clip": 1.0, "compile": False, "activation_checkpointing": "none"},
           "scaling": {"min_workers": 1, "max_workers": 2, "cpus_per_worker": 1.0, "worker_group_start_timeout_s": 60.0,
                       "elastic_resize_monitor_interval_s": 60.0},
           "checkpoint": {"every_steps": sim.every, "keep_last": 2}, "reward": {"num_actors": 2, "timing": "wall", "timing_runs": 5},
           "model": {"attention": "auto"}}
    if sim.grpo:
        cfg["rl"] = {"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 256}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for r in metrics:
        append_record(os.path.join(d, "metrics.jsonl"), r)
    for e in sorted(events, key=lambda e: e["time"]):
        append_record(os.path.join(d, "events.jsonl"), e)
    for s in range(sim.every, metrics[-1]["step"] + 1, sim.every):
        os.makedirs(os.path.join(d, f"step_{s:08d}"), exist_ok=True)
        with open(os.path.join(d, f"step_{s:08d}", "train_state.json"), "w") as f:
            json.dump({"step": s}, f)
    if state == "finished":
        append_record(os.path.join(d, "events.jsonl"), {"event": "stop", "time": t_end, "reason": "reached train.steps"})
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump({"wall_s": t_end - sim.t0 + 20, "last_step": metrics[-1]["step"], "first_loss": metrics[0]["loss"],
                       "last_loss": metrics[-1]["loss"]}, f)
    elif state == "crashed":
        append_record(os.path.join(d, "events.jsonl"), {
            "event": "controller_state", "time": t_end + 5, "from": "RestartingState", "to": "ErroredState",
            "error": "Training failed after 3 failures: RayActorError: The actor died because its node was killed"})
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write('{"step": %d, "loss": 3.1, "lr": 0.00' % (metrics[-1]["step"] + 1))  # cut by the crash
    elif state == "in_progress":
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write('{"step": %d, "loss": 3.1' % (metrics[-1]["step"] + 1))  # being written
    elif state == "stopped":
        append_record(os.path.join(d, "events.jsonl"), {"event": "stop", "time": t_end, "reason": "until_step"})
    return d
