"""Tokenize + pack throughput of the Ray Data pipeline per CPU core, against what the trainer eats.

Streams the real pipeline (shards → documents → tokenize → pack) on a local Ray cluster
limited to `--cpus` CPUs and reports real tokens/s and tokens/s per core. The trainer's
consumption is computed for a model preset, sequence length and MFU on a device:
tokens/s = MFU × peak / FLOPs-per-token. The ratio says how many CPU cores feed one GPU
(remember every train worker streams the whole sequence and keeps its slice, so a node with
k GPUs runs k streams).

  python bench/data_throughput.py --cpus 4 --preset 1b --seq-len 4096 --mfu 0.5 --peak 989e12
  python bench/data_throughput.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import PRESETS  # noqa: E402
from elastic.data import Cursor, build_dataset, prepare_data_plan  # noqa: E402
from elastic.data.pipeline import configure_data_context  # noqa: E402
from elastic.model import ModelArgs, flops_per_token  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="stdlib")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--shards", type=int, default=16, help="shards to stream (each ~shard-mb of text)")
    ap.add_argument("--shard-mb", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--mfu", type=float, default=0.5)
    ap.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s of one GPU (H100/H200 dense bf16)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default="bench/results/data_throughput.json")
    a = ap.parse_args(argv)
    if a.smoke:
        a.shards, a.shard_mb, a.vocab, a.seq_len = 2, 0.25, 1024, 256
    import ray

    ray.init(address="local", num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)
    configure_data_context()
    tmp = tempfile.mkdtemp(prefix="elastic-dt-")
    t0 = time.time()
    plan = prepare_data_plan(a.source, "**/*", "auto", "text", "", a.vocab, 4.0 if not a.smoke else 0.5, a.seq_len,
                             a.shard_mb, 0, True, tokenizer_save_path=os.path.join(tmp, "tok.json"), tokenize_cpus=1.0)
    plan_s = time.time() - t0
    plan.shards = plan.shards[: a.shards]  # stream a fixed prefix of shards
    ds = build_dataset(plan, Cursor(), epochs=1)
    t1 = time.time()
    tokens = samples = 0
    for b in ds.iter_batches(batch_size=256, batch_format="numpy"):
        tokens += int(b["n_real"].sum())
        samples += len(b["n_real"])
    dt = time.time() - t1
    ray.shutdown()
    tps = tokens / dt
    args = ModelArgs(**{**PRESETS[a.preset], "vocab_size": a.vocab, "max_seq_len": a.seq_len})
    fpt = flops_per_token(args, a.seq_len)
    need = a.mfu * a.peak / fpt
    res = {"args": vars(a), "plan_s": plan_s, "stream_s": dt, "tokens": tokens, "samples": samples,
           "tokens_per_s": tps, "tokens_per_s_per_core": tps / a.cpus, "bytes_per_token": plan.tokenizer.bytes_per_token,
           "trainer_tokens_per_s_per_gpu": need, "flops_per_token": fpt, "cores_per_gpu": need / (tps / a.cpus)}
    print(f"{'cpus':>5} {'tokens':>10} {'tok/s':>10} {'tok/s/core':>11} {'trainer tok/s/GPU':>18} {'cores/GPU':>10}")
    print(f"{a.cpus:>5} {tokens:>10} {tps:>10.0f} {tps / a.cpus:>11.0f} {need:>18.0f} {res['cores_per_gpu']:>10.2f}")
    print(f"trainer tok/s = MFU {a.mfu} x peak {a.peak:.3e} / flops_per_token {fpt:.3e} ({a.preset}, seq {a.seq_len})")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
