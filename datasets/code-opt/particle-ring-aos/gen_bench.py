#!/usr/bin/env python3
"""Benchmark input for particle-ring-aos (deterministic)."""
import random
import sys

rng = random.Random(314159)
L = 1 << 20
n, T, W = 200000, 150, 300000
letters = "abcdefghijklmnopqrstuvwxyz"
colors = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]
out = [f"{n} {T} {W}"]
for _ in range(n):
    name = "".join(rng.choices(letters, k=rng.randint(3, 12)))
    r = rng.getrandbits
    out.append(f"{name} {rng.choice(colors)} {r(20)} {r(20)} {r(20) - (1 << 19)} "
               f"{r(20) - (1 << 19)} {r(20) % 1000000 + 1} {r(8) % 201 - 100}")
sys.stdout.write("\n".join(out) + "\n")
