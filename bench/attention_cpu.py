"""Forward + backward of the CPU attention backends on packed rows (elastic/model/attention.py).

For each case, q/k/v of the `tiny` preset's heads ([B, T, H, D] transposed, as the model hands
them to attention) go through `attention()` with each backend's metadata, then backward of a
fixed random projection of the output. The backends run in turn, round after round (A B A B
...), so a drifting machine moves them alike; printed: each backend's median milliseconds and
the median over rounds of the paired ratio sdpa_mask ÷ backend (> 1: faster than sdpa_mask).
The metadata is built once per case, as the model builds it once per forward for all layers.

Cases (B rows of T tokens):
  sft     ~75-token conversations (55..95) packed whole into each row, the rest padding (SFT)
  two     two documents per row (300 + 212 at T 512)
  geoN    pretraining: documents of geometric length (mean N, e.g. geo150) cut at row ends
  long    one document per row (long-document pretraining)
  grpo    one prompt + completion per row (100..170 tokens), right-padded to 170

`coverage` is the documents' share of the T x T causal area; `padded` the share of B x T x T
that sdpa_docs's buckets compute (each document padded to its bucket length), against
sdpa_mask's whole B x T x T.

  python bench/attention_cpu.py                          # every case, tiny heads, B 4, T 512, 1 thread
  python bench/attention_cpu.py --cases sft --rounds 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from elastic.config.presets import PRESETS  # noqa: E402
from elastic.model.attention import attention, build_attention_metadata, host_doc_spans  # noqa: E402


def rows_of(lens_per_row, T):
    doc = np.full((len(lens_per_row), T), -1, np.int64)
    for b, lens in enumerate(lens_per_row):
        ids = np.repeat(np.arange(len(lens)), lens)
        doc[b, :len(ids)] = ids
    return doc


def case_doc_ids(case: str, B: int, T: int, rng) -> np.ndarray:
    if case == "sft":
        out = []
        for _ in range(B):
            lens, left = [], T
            while True:
                n = int(rng.integers(55, 96))
                if n > left:
                    break
                lens.append(n)
                left -= n
            out.append(lens)  # the rest of the row is padding (its own document, id -1)
        return rows_of(out, T)
    if case == "two":
        return rows_of([[T * 300 // 512, T - T * 300 // 512]] * B, T)
    if case.startswith("geo"):
        out = []
        for _ in range(B):
            lens, left = [], T
            while left:
                n = min(left, int(rng.geometric(1 / int(case[3:]))))
                lens.append(n)
                left -= n
            out.append(lens)
        return rows_of(out, T)
    if case == "long":
        return rows_of([[T]] * B, T)
    if case == "grpo":
        return rows_of([[int(rng.integers(100, 171))] for _ in range(B)], 170)
    raise SystemExit(f"unknown case {case!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="sft,two,geo150,long,grpo")
    ap.add_argument("--backends", default="sdpa_docs,sdpa_mask")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--heads", default="", help="H,Hkv,D instead of the preset's (e.g. 4,4,24)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a train worker has one CPU)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = PRESETS[args.preset]
    H, Hkv, D = (int(x) for x in args.heads.split(",")) if args.heads else (p["n_heads"], p["n_kv_heads"], p["dim"] // p["n_heads"])
    backends = args.backends.split(",")
    print(f"preset {args.preset}: {H} heads, {Hkv} kv heads, head dim {D}; batch {args.batch}, fp32, {args.threads} thread(s), {args.rounds} rounds")
    for case in args.cases.split(","):
        run_case(case, args, H, Hkv, D, backends)


def run_case(case: str, args, H: int, Hkv: int, D: int, backends: list) -> None:
    rng = np.random.default_rng(args.seed)
    doc = case_doc_ids(case, args.batch, args.seq_len, rng)
    B, T = doc.shape
    g = torch.Generator().manual_seed(args.seed)
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2).requires_grad_(True)
    k = torch.randn(B, T, Hkv, D, generator=g).transpose(1, 2).requires_grad_(True)
    v = torch.randn(B, T, Hkv, D, generator=g).transpose(1, 2).requires_grad_(True)
    go = torch.randn(B, H, T, D, generator=g)
    doc_t = torch.from_numpy(doc)
    cu, longest = host_doc_spans(doc)
    metas = {be: build_attention_metadata(doc_t, be, (torch.from_numpy(cu), longest)) for be in backends}

    def step(be):
        q.grad = k.grad = v.grad = None
        (attention(q, k, v, metas[be]) * go).sum().backward()

    times = {be: [] for be in backends}
    for be in backends:
        step(be), step(be)
    for _ in range(args.rounds):
        for be in backends:
            t0 = time.perf_counter()
            step(be)
            times[be].append(time.perf_counter() - t0)
    lens = np.diff(cu.astype(np.int64))
    cover = float((lens * (lens + 1) / 2).sum() / (B * T * (T + 1) / 2))
    buckets = build_attention_metadata(doc_t, "sdpa_docs").doc_buckets
    padded = sum(n * L * L for L, n in buckets) / (B * T * T) if buckets else 1.0
    print(f"{case}: B {B} T {T}, {len(lens)} documents (mean {lens.mean():.0f} tokens), coverage {cover:.3f}, "
          f"padded {padded:.3f} in {len(buckets) if buckets else 'no'} buckets")
    for be in backends:
        line = f"  {be:10s} median {statistics.median(times[be]) * 1e3:7.2f} ms"
        if be != "sdpa_mask" and "sdpa_mask" in times:
            ratio = statistics.median(a / b for a, b in zip(times["sdpa_mask"], times[be]))
            line += f"   sdpa_mask / {be} = {ratio:.2f}x (paired median)"
        print(line, flush=True)

if __name__ == "__main__":
    main()
