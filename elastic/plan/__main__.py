"""python -m elastic.plan --preset 8b --gpus 8 --gpu-gib 80: the layouts that fit, per GPU."""

from __future__ import annotations

import argparse
import sys

from elastic.plan.memory import SHAPES, VOCAB, plan, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m elastic.plan", description=__doc__)
    ap.add_argument("--preset", default="8b", help=f"model shape: {', '.join(SHAPES)}")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary (default: the shape's, 128256 from 1b up)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch on one data-parallel rank")
    ap.add_argument("--max-tp", type=int, default=8, help="the largest tp (GPUs of one node)")
    ap.add_argument("--max-pp", type=int, default=0,
                    help="the most pipeline stages (default: any that divides the layers; ranked after every fit without)")
    ap.add_argument("--all", action="store_true", help="also the layouts that do not fit")
    a = ap.parse_args(argv)
    if a.preset not in SHAPES:
        ap.error(f"--preset: unknown {a.preset!r} (known: {', '.join(SHAPES)})")
    vocab = a.vocab or VOCAB[a.preset]
    rows = plan(SHAPES[a.preset], vocab, a.gpus, a.gpu_gib, a.seq_len, a.micro_batch, max_tp=a.max_tp,
                max_pp=a.max_pp or a.gpus)
    fit = [r for r in rows if r.fits(a.gpu_gib * 2**30)]
    print(f"{a.preset} (vocab {vocab}) on {a.gpus} x {a.gpu_gib:g} GiB, seq {a.seq_len} x micro-batch {a.micro_batch}, "
          f"bf16 compute: {len(fit)} of {len(rows)} layouts fit (GiB per GPU; formulas: elastic/plan/memory.py)")
    print("\n".join(table(rows if a.all else fit, a.gpu_gib)))
    if not fit:
        print("nothing fits: more GPUs, a shorter sequence or micro-batch, or a larger tp", file=sys.stderr)
    return 0 if fit else 1


if __name__ == "__main__":
    sys.exit(main())
