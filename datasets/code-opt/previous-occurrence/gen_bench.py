#!/usr/bin/env python3
"""Benchmark input for previous-occurrence (deterministic)."""
import random
import sys

rng = random.Random(2718)
n = 80000
pool = [rng.randint(-10**9, 10**9) for _ in range(40000)]
sys.stdout.write(f"{n}\n" + " ".join(str(rng.choice(pool)) for _ in range(n)) + "\n")
