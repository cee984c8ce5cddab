#!/usr/bin/env python3
"""Benchmark input for range-sum-queries (deterministic)."""
import random
import sys

rng = random.Random(20240601)
n, q = 200000, 20000
out = [f"{n} {q}", " ".join(str(rng.randint(-10**9, 10**9)) for _ in range(n))]
for _ in range(q):
    l = rng.randint(1, n)
    r = rng.randint(1, n)
    if l > r:
        l, r = r, l
    out.append(f"{l} {r}")
sys.stdout.write("\n".join(out) + "\n")
