#!/usr/bin/env python3
"""Benchmark input for min-queue-operations (deterministic)."""
import random
import sys

rng = random.Random(99991)
pre, rest = 20000, 60000
out = [str(pre + rest)]
for _ in range(pre):
    out.append(f"+ {rng.randint(0, 10**6)}")
for _ in range(rest):
    out.append(f"+ {rng.randint(0, 10**6)}" if rng.random() < 0.5 else "-")
sys.stdout.write("\n".join(out) + "\n")
