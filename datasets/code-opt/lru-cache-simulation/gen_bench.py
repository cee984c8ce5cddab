#!/usr/bin/env python3
"""Benchmark input for lru-cache-simulation (deterministic)."""
import random
import sys

rng = random.Random(4000)
C, n, W = 4000, 50000, 6000
ids = rng.sample(range(1, 10**9 + 1), 40000)
base = 0
out = []
for i in range(n):
    if i % 25 == 0:
        base += 1                                  # the working set drifts slowly
    out.append(ids[(base + int(W * rng.random() ** 1.5)) % len(ids)])
sys.stdout.write(f"{C} {n}\n" + " ".join(map(str, out)) + "\n")
