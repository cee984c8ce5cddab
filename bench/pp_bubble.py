"""The pipeline bubble, measured against its theory, for each schedule (issue 59, item 6).

Two gloo ranks (pp 2, one CPU thread each) run a pipelined training step of a seeded model
(elastic/train/pipeline.py `Pipeline.of_model`) for each schedule and micro-batch count. Per
rank and configuration, median over --reps steps after a warm-up:

  step_s      wall seconds of one pipelined step (forward + backward of every micro-batch;
              a barrier before each)
  busy_s      the same rank's stages run alone on the same micro-batch pieces, forward +
              backward, no pipeline (its compute)
  bubble      1 - busy_s / step_s: the share of the step the rank is not computing (waiting on
              the other stage, plus p2p sends and receives), mean over the two ranks
  theory      (p - 1) / (m + p - 1) for gpipe and 1f1b; (p - 1) / (v m + p - 1) for the
              interleaved schedules with v stages per rank (Megatron-LM's bubble)
  speedup     unsplit_s / step_s: unsplit_s is the whole model's step on one rank (the
              baseline, measured in the same run, before and after, mean of the two); the
              ideal at pp 2 is 2 x (1 - bubble)

  python bench/pp_bubble.py [--dim 256] [--layers 8] [--seq 128] [--rows 2] [--micro 2,4,8] [--reps 5]

Writes bench/results/pp_bubble.json (--out) and deletes its rendezvous files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from elastic.data.packing import IGNORE  # noqa: E402
from elastic.model.llama import ModelArgs, Transformer  # noqa: E402
from elastic.train.pipeline_bubble import bubble_theory  # noqa: E402

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2))
PP = 2


def theory(schedule: str, virtual: int, m: int, p: int = PP) -> float:
    """elastic/train/pipeline_bubble.py's formula (the one each run's report uses)."""
    return bubble_theory(schedule, p, m, virtual)


def _model(a) -> Transformer:
    m = Transformer(ModelArgs(dim=a.dim, n_layers=a.layers, n_heads=4, n_kv_heads=4, ffn_hidden=4 * a.dim,
                              vocab_size=512, max_seq_len=a.seq, tie_embeddings=False))
    m.init_weights(seed=0)
    return m


def _batch(a, m: int):
    g = torch.Generator().manual_seed(1)
    rows = a.rows * m
    tokens = torch.randint(0, 512, (rows, a.seq), generator=g)
    labels = torch.roll(tokens, -1, 1)
    labels[:, -1] = IGNORE
    positions = torch.arange(a.seq).expand(rows, a.seq).contiguous()
    return tokens, labels, positions, torch.zeros_like(tokens)


def _busy(pipe, a, tokens, positions, doc_ids) -> float:
    """This rank's stages alone on `m` pieces of a.rows rows: forward + backward, no pipeline."""
    t0 = time.perf_counter()
    for i in range(pipe.microbatches):
        sl = slice(i * a.rows, (i + 1) * a.rows)
        for st in pipe.modules:
            x = tokens[sl] if st.is_first else torch.randn(a.rows, a.seq, a.dim, requires_grad=True)
            out = st(x, positions[sl], doc_ids[sl])
            out.float().square().mean().backward()
    for p in pipe.parameters():
        p.grad = None
    return time.perf_counter() - t0


def _worker(rank: int, a, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=PP)
    from elastic.train.pipeline import Pipeline

    try:
        res = {}
        for schedule, virtual in SCHEDULES:
            for m in a.micro:
                if virtual > 1 and m % PP:
                    continue
                pipe = Pipeline.of_model(_model(a), dist.group.WORLD, torch.device("cpu"), virtual=virtual,
                                         microbatches=m, schedule=schedule)
                tokens, labels, positions, doc_ids = _batch(a, m)
                steps, busy = [], []
                for r in range(a.reps + 1):
                    dist.barrier()
                    t0 = time.perf_counter()
                    pipe.step(tokens, labels, positions, doc_ids)
                    dt = time.perf_counter() - t0
                    for p in pipe.parameters():
                        p.grad = None
                    dist.barrier()
                    b = _busy(pipe, a, tokens, positions, doc_ids)
                    if r:  # the first is the warm-up (shape inference)
                        steps.append(dt)
                        busy.append(b)
                res[f"{schedule}/{m}"] = {"step_s": statistics.median(steps), "busy_s": statistics.median(busy)}
        torch.save(res, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def unsplit_step(a, m: int) -> float:
    """The whole model's step on one process over the same rows (the baseline)."""
    torch.set_num_threads(1)
    model = _model(a)
    tokens, labels, positions, doc_ids = _batch(a, m)
    times = []
    for r in range(a.reps + 1):
        t0 = time.perf_counter()
        for i in range(m):
            sl = slice(i * a.rows, (i + 1) * a.rows)
            logits = model(tokens[sl], positions[sl], doc_ids[sl])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[sl].flatten(), ignore_index=IGNORE).backward()
        model.zero_grad(set_to_none=True)
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rows", type=int, default=2, help="rows per pipeline micro-batch")
    ap.add_argument("--micro", default="2,4,8", help="micro-batch counts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "pp_bubble.json"))
    a = ap.parse_args(argv)
    a.micro = [int(x) for x in a.micro.split(",")]
    base_before = {m: unsplit_step(a, m) for m in a.micro}
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(a, f"file://{d}/rdzv", f"{d}/res"), nprocs=PP, join=True)
        got = [torch.load(f"{d}/res.{r}") for r in range(PP)]
    base_after = {m: unsplit_step(a, m) for m in a.micro}
    rows = []
    for key in got[0]:
        schedule, m = key.split("/")
        m = int(m)
        virtual = dict(SCHEDULES)[schedule]
        step = max(g[key]["step_s"] for g in got)
        bubble = statistics.mean(1 - g[key]["busy_s"] / g[key]["step_s"] for g in got)
        unsplit = (base_before[m] + base_after[m]) / 2
        rows.append({"schedule": schedule, "virtual_stages": virtual, "microbatches": m, "step_s": step,
                     "busy_s": [g[key]["busy_s"] for g in got], "bubble": bubble, "theory": theory(schedule, virtual, m),
                     "unsplit_s": unsplit, "speedup": unsplit / step})
    print(f"pp {PP}, dim {a.dim}, {a.layers} layers, seq {a.seq}, {a.rows} rows per micro-batch, gloo on CPU, 1 thread per rank")
    print("| schedule | v | m | step s | bubble (measured) | theory | speedup vs unsplit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule']} | {r['virtual_stages']} | {r['microbatches']} | {r['step_s']:.3f} | {r['bubble']:.3f} | "
              f"{r['theory']:.3f} | {r['speedup']:.2f}x |")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"pp": PP, "args": {k: v for k, v in vars(a).items() if k != "out"}, "rows": rows,
                   "formulas": {"bubble": "mean over ranks of 1 - busy_s / step_s",
                                "theory": "(p-1)/(m+p-1); interleaved: (p-1)/(v*m+p-1)",
                                "speedup": "unsplit_s / step_s"}}, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
