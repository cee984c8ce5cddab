"""The global data cursor: one position in a deterministic, world-size-independent stream.

The stream is: for epoch 0, 1, ...: the shards in that epoch's order (a seeded permutation),
each shard's packed samples in order. A position is (epoch, index into the epoch's shard
order, sample offset inside that shard's seeded sample order). Seeking to a position looks at
no earlier shard and reads no sample before it (the shard cache is read by sample index), so
resuming costs the same however much data was consumed. Walking positions forward is
elastic/data/reader.py's `SampleStream.walk`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# A global sample id packs (shard id, offset in shard): stable across runs and world sizes.
SHARD_SHIFT = 24


def sample_id(shard_id: int, offset: int) -> int:
    return (int(shard_id) << SHARD_SHIFT) | int(offset)


def split_sample_id(sid: int) -> tuple[int, int]:
    return int(sid) >> SHARD_SHIFT, int(sid) & ((1 << SHARD_SHIFT) - 1)


@dataclass(frozen=True)
class Cursor:
    epoch: int = 0
    shard_pos: int = 0
    offset: int = 0
    consumed: int = 0  # samples consumed so far (= step * global batch)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cursor":
        return cls(**{k: int(d[k]) for k in ("epoch", "shard_pos", "offset", "consumed")})

    def key(self) -> tuple:
        return (self.epoch, self.shard_pos, self.offset)


def shard_order(num_shards: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """Shard ids in the order epoch `epoch` visits them."""
    if not shuffle:
        return np.arange(num_shards)
    return np.random.default_rng([seed, epoch]).permutation(num_shards)


def sample_order(n: int, seed: int, epoch: int, shard_id: int, shuffle: bool) -> np.ndarray:
    """Order in which the `n` packed samples of a shard are visited in `epoch`."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch, shard_id, 1]).permutation(n)
