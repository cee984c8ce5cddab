#!/usr/bin/env python3
"""Benchmark input for longest-increasing-subsequence (deterministic)."""
import random
import sys

rng = random.Random(777)
n = 20000
vals = [i // 3 + rng.randint(-2000, 2000) for i in range(n)]
sys.stdout.write(f"{n}\n" + " ".join(map(str, vals)) + "\n")
