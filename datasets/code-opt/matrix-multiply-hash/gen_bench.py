#!/usr/bin/env python3
"""Benchmark input for matrix-multiply-hash (deterministic)."""
import random
import sys

rng = random.Random(768768)
n = 768
vals = [str(v) for v in range(1000)]
lines = [str(n)]
for _ in range(2 * n):
    lines.append(" ".join(rng.choices(vals, k=n)))
sys.stdout.write("\n".join(lines) + "\n")
