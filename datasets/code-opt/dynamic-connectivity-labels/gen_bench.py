#!/usr/bin/env python3
"""Benchmark input for dynamic-connectivity-labels (deterministic)."""
import random
import sys

rng = random.Random(1618)
n, m = 25000, 50000
ops = ["U"] * (m // 2) + ["Q"] * (m - m // 2)
rng.shuffle(ops)
out = [f"{n} {m}"]
for op in ops:
    out.append(f"{op} {rng.randint(1, n)} {rng.randint(1, n)}")
sys.stdout.write("\n".join(out) + "\n")
