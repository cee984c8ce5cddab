#!/usr/bin/env python3
"""Benchmark input for polynomial-eval-modpow (deterministic)."""
import random
import sys

rng = random.Random(1000000007)
p = 1000000007
d, q = 4000, 4000
sys.stdout.write(f"{d} {q}\n" + " ".join(str(rng.randrange(p)) for _ in range(d + 1)) + "\n"
                 + " ".join(str(rng.randrange(p)) for _ in range(q)) + "\n")
