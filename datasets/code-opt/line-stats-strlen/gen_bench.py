#!/usr/bin/env python3
"""Benchmark input for line-stats-strlen (deterministic)."""
import random
import sys

rng = random.Random(9001)
alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;!?-" + " " * 12


def text(k):
    return "".join(rng.choices(alphabet, k=k))


lines = [text(rng.randint(0, 80)) for _ in range(2000)]
for _ in range(24):
    lines.insert(rng.randrange(len(lines) + 1), text(50000))
sys.stdout.write("\n".join(lines) + "\n")
