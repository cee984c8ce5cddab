"""Training throughput through the real path: Ray Train + Ray Data streaming + FSDP2 (+ bf16 on GPU).

For each configuration (attention backend × torch.compile × activation checkpointing ×
micro-batch size) it runs the pretraining job for `--warmup + --steps` steps and averages the
measured steps. It prints one table row per configuration: tokens/s, MFU (formula and peak
named below the table), the step-time split into data wait and compute, peak memory and the
attention backend actually used. It writes JSON with the GPU name, driver, torch and Ray
versions.

  python bench/train_throughput.py --preset 1b --seq-len 4096 --attention auto,flex --compile off,on
  python bench/train_throughput.py --smoke      # CPU, tiny, seconds; what CI runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
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


def run_config(base: list, cfg_over: dict, warmup: int, steps: int, storage: str) -> dict:
    from elastic.launch.pretrain import run_pretraining
    from elastic.records import EVENTS, METRICS, read_records

    name = "tp-" + "-".join(f"{k.split('.')[-1]}={v}" for k, v in cfg_over.items()).replace("/", "_")
    over = base + [f"{k}={v}" for k, v in cfg_over.items()] + [
        f"run.name={name}", f"run.storage_path={storage}", f"train.steps={warmup + steps}",
        f"checkpoint.every_steps={warmup + steps}", "wandb.mode=disabled", f"train.warmup_steps={min(warmup, 10)}"]
    cfg = load_config(None, over)
    t0 = time.time()
    try:
        res = run_pretraining(cfg)
    except Exception as e:  # one failing configuration (e.g. OOM) must not end the sweep
        return {"config": cfg_over, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    recs = [r for r in read_records(os.path.join(res.local_dir, METRICS)) if "step" in r][warmup:]
    events = read_records(os.path.join(res.local_dir, EVENTS))
    start = next(e for e in events if e.get("event") == "start")
    n = max(1, len(recs))
    step_s = sum(r["step_s"] for r in recs) / n
    wait = sum(r["data_wait_s"] for r in recs) / n
    args = ModelArgs(**resolved_model_dims(cfg))
    return {
        "config": cfg_over, "steps_measured": len(recs), "wall_s": time.time() - t0,
        "tokens_per_s": sum(r["tokens"] for r in recs) / max(1e-9, sum(r["step_s"] for r in recs)),
        "mfu": sum(r["mfu"] for r in recs) / n, "step_s": step_s, "data_wait_s": wait, "compute_s": step_s - wait,
        "max_mem_gib": max((r.get("max_mem_gib", 0.0) for r in recs), default=0.0),
        "attention_backend": start["attention_backend"], "param_dtype": start["param_dtype"], "device": start["device"],
        "flops_per_token": flops_per_token(args, cfg.data.seq_len), "world_size": recs[-1]["world_size"] if recs else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", default="1,2", help="comma list")
    ap.add_argument("--attention", default="auto", help="comma list of backends")
    ap.add_argument("--compile", default="off", help="comma list of off/on")
    ap.add_argument("--ac", default="none", help="comma list of none/full")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--smoke", action="store_true", help="CPU smoke mode: tiny model, few steps")
    ap.add_argument("--out", default="bench/results/train_throughput.json")
    a = ap.parse_args(argv)
    if a.smoke:
        a.preset, a.seq_len, a.global_batch, a.micro_batch, a.warmup, a.steps = "tiny", 128, 4, "2", 1, 2
        a.ac = "none,full"
        a.overrides += ["data.vocab_size=512", "data.tokenizer_sample_mb=0.5", "data.shard_mb=0.25", "train.param_dtype=fp32"]
    base = [f"model.preset={a.preset}", f"data.seq_len={a.seq_len}", f"train.global_batch_size={a.global_batch}",
            f"scaling.min_workers={a.workers}", f"scaling.max_workers={a.workers}"] + a.overrides
    storage = tempfile.mkdtemp(prefix="elastic-tp-")
    grid = list(itertools.product(a.attention.split(","), a.compile.split(","), a.ac.split(","), a.micro_batch.split(",")))
    rows = []
    for att, comp, ac, mb in grid:
        rows.append(run_config(base, {"model.attention": att, "train.compile": str(comp == "on").lower(),
                                      "train.activation_checkpointing": ac, "train.micro_batch_size": int(mb)},
                               a.warmup, a.steps, storage))
    from elastic.train.metrics import peak_flops
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak, src = peak_flops(dev)
    hdr = f"{'attention':>13} {'compile':>7} {'ac':>4} {'mb':>3} {'tok/s':>10} {'MFU':>7} {'step_s':>7} {'wait_s':>7} {'mem_GiB':>8}  backend"
    print(f"preset {a.preset}, seq {a.seq_len}, global batch {a.global_batch}, workers {a.workers}")
    print(hdr)
    for r in rows:
        c = r["config"]
        if "error" in r:
            print(f"{c['model.attention']:>13} {c['train.compile']:>7} {c['train.activation_checkpointing']:>4} {c['train.micro_batch_size']:>3}  ERROR {r['error']}")
            continue
        print(f"{c['model.attention']:>13} {c['train.compile']:>7} {c['train.activation_checkpointing']:>4} {c['train.micro_batch_size']:>3} "
              f"{r['tokens_per_s']:>10.0f} {r['mfu']:>7.2%} {r['step_s']:>7.3f} {r['data_wait_s']:>7.3f} {r['max_mem_gib']:>8.2f}  {r['attention_backend']}")
    fpt = rows[0].get("flops_per_token") if rows else None
    print(f"MFU = flops_per_token x tokens/s / (peak x devices); flops_per_token = 6N + 6*L*d*T = {fpt:.3e}; peak = {peak:.3e} FLOP/s ({src})")
    out = {"args": vars(a), "environment": environment(), "peak_flops": peak, "peak_source": src, "results": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
