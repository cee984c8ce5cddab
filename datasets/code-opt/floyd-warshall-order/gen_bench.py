#!/usr/bin/env python3
"""Benchmark input for floyd-warshall-order (deterministic)."""
import random
import sys

rng = random.Random(5150)
n = 600
lines = [str(n)]
for i in range(n):
    row = []
    for j in range(n):
        r = rng.random()
        row.append("-1" if r < 0.3 else str(int(r * 1000000)))
    lines.append(" ".join(row))
sys.stdout.write("\n".join(lines) + "\n")
