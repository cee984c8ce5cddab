"""Training throughput through the real path: Ray Train + Ray Data streaming + FSDP2 (+ bf16 on GPU).

For each configuration (attention backend × torch.compile × activation checkpointing ×
micro-batch size) it runs the pretraining job for `--warmup + --steps` steps, checkpointing
every `--ckpt-every` steps. It prints one table row per configuration: tokens/s and MFU over
the steady steps (after the warm-up, without the steps that save a checkpoint), the step-time
split into data wait and compute, peak memory, the attention backend actually used, and the
checkpoint figures apart: the stall of each save inside the run (what the training step waited)
and the background write's seconds. The final save is waited for before the run ends, so it is
shown apart too. Each configuration's run directory (checkpoints, shard cache) is deleted when
it is measured: a `1b` checkpoint with optimizer state is ~14 GB. It writes JSON with the GPU
name, driver, torch and Ray versions.

  python bench/train_throughput.py --preset 1b --seq-len 4096 --attention auto,flex --compile off,on
  python bench/train_throughput.py --smoke      # CPU, tiny, seconds; what CI runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import load_config, resolved_model_dims  # noqa: E402
from elastic.model import ModelArgs, flops_per_token  # noqa: E402


def environment() -> dict:
    import ray
    import torch

    env = {"torch": torch.__version__, "ray": ray.__version__, "python": platform.python_version(),
           "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            env["driver"] = "unknown"
    return env


def measure(recs: list, events: list, warmup: int) -> dict:
    """Steady-state figures from a run's records: the steps after `warmup` that do not start a
    checkpoint give tokens/s (Σ tokens / Σ step_s) and MFU (weighted by step time); the saves
    are listed apart (stall of the step, background write from the `checkpoint_done` events)."""
    after = recs[warmup:]
    # A saving step carries checkpoint_stall_s. A later step that registers a finished background
    # save carries only checkpoint_s (the agreement and Ray's registration): it stays a steady step.
    saves = [r for r in after if "checkpoint_stall_s" in r]
    steady = [r for r in after if r not in saves and not r.get("warmup")]
    n = max(1, len(steady))
    total_s = max(1e-9, sum(r["step_s"] for r in steady))
    step_s = total_s / n if steady else 0.0
    wait = sum(r.get("data_wait_s", 0.0) for r in steady) / n
    done = {e["step"]: e for e in events if e.get("event") == "checkpoint_done" and "step" in e}
    last = recs[-1]["step"] if recs else None
    ckpts = [{"step": r["step"], "final": r["step"] == last, "blocked_s": r.get("checkpoint_s"),
              "stall_s": r.get("checkpoint_stall_s", r.get("checkpoint_s")),
              "write_s": (done.get(r["step"]) or {}).get("write_s")} for r in saves]
    return {"steps_measured": len(steady),
            "tokens_per_s": sum(r["tokens"] for r in steady) / total_s if steady else None,
            "mfu": sum(r["mfu"] * r["step_s"] for r in steady) / total_s if steady else None, "step_s": step_s,
            "data_wait_s": wait, "compute_s": step_s - wait,
            "max_mem_gib": max((r.get("max_mem_gib", 0.0) for r in after), default=0.0), "checkpoints": ckpts}


def run_config(base: list, cfg_over: dict, warmup: int, steps: int, storage: str, ckpt_every: int = 0) -> dict:
    from elastic.launch.pretrain import run_pretraining
    from elastic.records import EVENTS, METRICS, read_records

    name = "tp-" + "-".join(f"{k.split('.')[-1]}={v}" for k, v in cfg_over.items()).replace("/", "_")
    over = base + [f"{k}={v}" for k, v in cfg_over.items()] + [
        f"run.name={name}", f"run.storage_path={storage}", f"train.steps={warmup + steps}",
        f"checkpoint.every_steps={ckpt_every or warmup + steps}", "wandb.mode=disabled",
        f"train.warmup_steps={min(warmup, 10)}"]
    cfg = load_config(None, over)
    t0 = time.time()
    run_dir = os.path.join(storage, name)
    try:
        res = run_pretraining(cfg)
        recs = [r for r in read_records(os.path.join(res.records_dir or res.local_dir, METRICS)) if "step" in r]
        events = read_records(os.path.join(res.records_dir or res.local_dir, EVENTS))
    except Exception as e:  # one failing configuration (e.g. OOM) must not end the sweep
        return {"config": cfg_over, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    finally:  # checkpoints and shard cache: a 1b configuration leaves ~14 GB per checkpoint
        shutil.rmtree(run_dir, ignore_errors=True)
    start = next(e for e in events if e.get("event") == "start")
    args = ModelArgs(**resolved_model_dims(cfg))
    return {
        "config": cfg_over, "wall_s": time.time() - t0, **measure(recs, events, warmup),
        "attention_backend": start["attention_backend"], "param_dtype": start["param_dtype"], "device": start["device"],
        "flops_per_token": flops_per_token(args, cfg.data.seq_len), "world_size": recs[-1]["world_size"] if recs else None,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", default="1,2", help="comma list")
    ap.add_argument("--attention", default="auto", help="comma list of backends")
    ap.add_argument("--compile", default="off", help="comma list of off/on/auto")
    ap.add_argument("--ac", default="none", help="comma list of none/full")
    ap.add_argument("--vocab", default="", help="comma list of data.vocab_size values (default: the preset's)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ckpt-every", type=int, default=10, help="checkpoint.every_steps (0: only the final save)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--smoke", action="store_true", help="CPU smoke mode: tiny model, few steps")
    ap.add_argument("--out", default="bench/results/train_throughput.json")
    return ap


def smoke_args(a: argparse.Namespace) -> None:
    a.preset, a.seq_len, a.global_batch, a.micro_batch, a.warmup, a.steps, a.ckpt_every = "tiny", 128, 4, "2", 1, 4, 3
    a.overrides += ["data.vocab_size=512", "data.tokenizer_sample_mb=0.5", "data.shard_mb=0.25", "train.param_dtype=fp32"]


def sweep(a: argparse.Namespace) -> list:
    """One row per configuration of the grid; every run directory is deleted once measured."""
    base = [f"model.preset={a.preset}", f"data.seq_len={a.seq_len}", f"train.global_batch_size={a.global_batch}",
            f"scaling.min_workers={a.workers}", f"scaling.max_workers={a.workers}"] + a.overrides
    storage = a.storage = tempfile.mkdtemp(prefix="elastic-tp-")
    vocabs = [v for v in a.vocab.split(",") if v] or [""]
    grid = list(itertools.product(vocabs, a.attention.split(","), a.compile.split(","), a.ac.split(","), a.micro_batch.split(",")))
    rows = []
    try:
        for vocab, att, comp, ac, mb in grid:
            over = {"model.attention": att, "train.compile": {"on": "true", "off": "false"}.get(comp, comp),
                    "train.activation_checkpointing": ac, "train.micro_batch_size": int(mb)}
            if vocab:
                over["data.vocab_size"] = int(vocab)
            rows.append(run_config(base, over, a.warmup, a.steps, storage, a.ckpt_every))
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return rows


def table(rows: list) -> list:
    """The printed table, one line per configuration."""
    hdr = (f"{'vocab':>7} {'attention':>13} {'compile':>7} {'ac':>4} {'mb':>3} {'tok/s':>10} {'MFU':>7} {'step_s':>7} "
           f"{'wait_s':>7} {'mem_GiB':>8} {'ckpt stall_s':>12} {'write_s':>8}  backend")
    out = [hdr]
    for r in rows:
        c = r["config"]
        head = (f"{c.get('data.vocab_size', '-'):>7} {c['model.attention']:>13} {c['train.compile']:>7} "
                f"{c['train.activation_checkpointing']:>4} {c['train.micro_batch_size']:>3}")
        if "error" in r:
            out.append(f"{head}  ERROR {r['error']}")
            continue
        mid = [x for x in r["checkpoints"] if not x["final"]]  # the saves the run went on past
        stall = max((x["stall_s"] or 0.0 for x in mid), default=None)
        write = max((x["write_s"] or 0.0 for x in mid), default=None)
        fmt = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
        out.append(f"{head} {r['tokens_per_s']:>10.0f} {r['mfu']:>7.2%} {r['step_s']:>7.3f} {r['data_wait_s']:>7.3f} "
                   f"{r['max_mem_gib']:>8.2f} {fmt(stall):>12} {fmt(write):>8}  {r['attention_backend']}")
    return out


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.smoke:
        smoke_args(a)
        a.ac = "none,full"
    rows = sweep(a)
    from elastic.train.metrics import peak_flops
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak, src = peak_flops(dev)
    print(f"preset {a.preset}, seq {a.seq_len}, global batch {a.global_batch}, workers {a.workers}; "
          f"steady steps: after {a.warmup} warm-up steps, saving steps left out")
    for line in table(rows):
        print(line)
    fpt = next((r["flops_per_token"] for r in rows if "flops_per_token" in r), float("nan"))
    print(f"MFU = flops_per_token x tokens/s / (peak x devices); flops_per_token = 6N + 6*L*d*T = {fpt:.3e} "
          f"(first row); peak = {peak:.3e} FLOP/s ({src})")
    print("ckpt stall_s: the longest stall of a save the run went on past (waiting for the previous save + copy to "
          "host); write_s: its background write")
    out = {"args": vars(a), "environment": environment(), "peak_flops": peak, "peak_source": src, "results": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
