#!/usr/bin/env python3
"""Benchmark input for hex-report-unbuffered (deterministic)."""
import random
import sys

rng = random.Random(64)
n = 175000
sys.stdout.write(f"{n}\n" + "\n".join(str(rng.getrandbits(64)) for _ in range(n)) + "\n")
