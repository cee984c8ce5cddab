#!/usr/bin/env python3
"""Benchmark input for collatz-range-max (deterministic)."""
import random
import sys

rng = random.Random(3141)
q = 2500
out = [str(q)]
for _ in range(q):
    length = rng.randint(1, 1500)
    a = rng.randint(1, 1000000 - length + 1)
    out.append(f"{a} {a + length - 1}")
sys.stdout.write("\n".join(out) + "\n")
