#!/usr/bin/env python3
"""Benchmark input for sum-min-max-scanf (deterministic)."""
import random
import sys

rng = random.Random(123456789)
n = 4000000
r = rng.getrandbits
out = [str(n)]
for i in range(0, n, 10):
    out.append(" ".join(str(r(21) % 2000001 - 1000000) for _ in range(10)))
sys.stdout.write("\n".join(out) + "\n")
