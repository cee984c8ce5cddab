#!/usr/bin/env python3
"""Benchmark input for count-inversions (deterministic)."""
import random
import sys

rng = random.Random(4242)
n = 22000
sys.stdout.write(f"{n}\n" + " ".join(str(rng.randint(0, 10**5)) for _ in range(n)) + "\n")
