"""Sampling seeds derived from ``run.seed``, independent of the world size.

A rollout's randomness must depend on *what* is sampled (step, prompt slot in the step, sample in
the group), never on *where* (rank, batch composition), or an elastic restart at another world
size would draw different completions for the same step. Each completion therefore gets its own
seed, hashed from its coordinates, which the sampler uses for that completion's private RNG.

BLAKE2b rather than Python's ``hash`` (salted per process) or arithmetic mixing (correlated
streams): stable across processes, machines and Python versions.
"""

from __future__ import annotations

import hashlib
import struct

_MASK63 = (1 << 63) - 1


def derive_seed(run_seed: int, purpose: str, *coords: int) -> int:
    """A 63-bit seed from ``run_seed``, a purpose label and integer coordinates.

    Different purposes ("rollout", "prompt_order", ...) give unrelated streams for the same
    coordinates. 63 bits fit every consumer (``torch.Generator.manual_seed``, numpy).
    """
    h = hashlib.blake2b(digest_size=8, person=b"elastic-rl-seed")
    h.update(struct.pack("<q", int(run_seed)))
    h.update(purpose.encode("utf-8") + b"\0")
    for c in coords:
        h.update(struct.pack("<q", int(c)))
    return int.from_bytes(h.digest(), "little") & _MASK63


def rollout_seed(run_seed: int, step: int, prompt: int, sample: int) -> int:
    """Seed of sample ``sample`` (0..G-1) of prompt slot ``prompt`` (0..P-1) in GRPO step ``step``."""
    return derive_seed(run_seed, "rollout", step, prompt, sample)
