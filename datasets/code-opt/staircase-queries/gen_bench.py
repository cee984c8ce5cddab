#!/usr/bin/env python3
"""Benchmark input for staircase-queries (deterministic)."""
import random
import sys

rng = random.Random(271828)
m, q = 7, 40
steps = rng.sample(range(1, 101), m)
hs = [rng.randint(500000, 1000000) for _ in range(q)]
sys.stdout.write(f"{m} {q}\n{' '.join(map(str, steps))}\n{' '.join(map(str, hs))}\n")
