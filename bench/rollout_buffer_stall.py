"""What a save of an asynchronous RL run costs the training step, by rollout-buffer size.

The buffer (elastic/rl/rollout/buffer_table.py) is staleness x prompts x group completions of
up to max_new_tokens tokens each, with their log-probs. Before issue 58 it went into
`train_state.json` as JSON, written by the training thread at every save; now the training
thread writes a reference and the save's background thread writes the table as Parquet. For
each size, alternating the sides, median of --reps:

  json_stall_s     the old saving step: json.dump of the state with the buffer in it
  table_stall_s    the new saving step: split_tables + the state file (the buffer's reference)
  table_write_s    the new background write: the Arrow table made and written as Parquet
  ratio            table_stall_s / json_stall_s
  file MB          train_state.json (old) and rollout_buffer.parquet (new)

  python bench/rollout_buffer_stall.py [--tokens 1024] [--sizes 64,256,1024,4096] [--reps 3]

Writes bench/results/rollout_buffer_stall.json; deletes what it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from elastic.rl.rollout.buffer_table import rows_in, to_table  # noqa: E402
from elastic.train.checkpoint import _write_state_file, split_tables, write_tables  # noqa: E402
from elastic.train.checkpoint_files import TableState  # noqa: E402


def buffer(rows: int, tokens: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    per_step = max(1, rows // 2)  # staleness 1: two steps in flight
    out = {}
    for s in range(2):
        out[str(s + 2)] = [{"k": k, "tokens": rng.integers(0, 32000, tokens).tolist(),
                            "logprobs": (-rng.random(tokens, dtype=np.float32) * 5).tolist(),
                            "truncated": bool(k % 2), "version": 1} for k in range(per_step)]
    return out


def measure(buf: dict, d: str) -> dict:
    base = {"step": 3, "prompt_cursor": 48, "scheduler": {}, "counters": {}}
    old, new = os.path.join(d, "old"), os.path.join(d, "new")
    for p in (old, new):
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)
    t0 = time.perf_counter()
    _write_state_file(old, {**base, "rollout_buffer": buf})
    json_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    js, tables = split_tables({**base, "rollout_buffer": TableState(buf, to_table, rows_in(buf))})
    _write_state_file(new, js)
    stall_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_tables(new, tables)
    write_s = time.perf_counter() - t0
    return {"json_stall_s": json_s, "table_stall_s": stall_s, "table_write_s": write_s,
            "json_mb": os.path.getsize(os.path.join(old, "train_state.json")) / 2**20,
            "parquet_mb": os.path.getsize(os.path.join(new, "rollout_buffer.parquet")) / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per completion")
    ap.add_argument("--sizes", default="64,256,1024,4096", help="completions in the buffer")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "rollout_buffer_stall.json"))
    a = ap.parse_args(argv)
    d = tempfile.mkdtemp(prefix="elastic-bufstall-")
    rows = []
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            buf = buffer(n, a.tokens)
            reps = [measure(buf, d) for _ in range(a.reps)]  # each rep runs old then new on the same buffer
            med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
            rows.append({"completions": n, "tokens_per_completion": a.tokens, **med,
                         "ratio": med["table_stall_s"] / med["json_stall_s"]})
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("| completions | json stall s | table stall s | ratio | table write s (background) | json MB | parquet MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['completions']} | {r['json_stall_s']:.3f} | {r['table_stall_s']:.5f} | {r['ratio']:.4f} | "
              f"{r['table_write_s']:.3f} | {r['json_mb']:.1f} | {r['parquet_mb']:.1f} |")
    print("ratio = table_stall_s / json_stall_s (the saving step's time spent on the buffer, new / old)")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
