#!/usr/bin/env python3
"""Benchmark input for prefix-sums-iostream (deterministic)."""
import random
import sys

rng = random.Random(8675309)
n = 400000
r = rng.getrandbits
sys.stdout.write(f"{n}\n" + " ".join(str(r(31) % 2000000001 - 1000000000) for _ in range(n)) + "\n")
