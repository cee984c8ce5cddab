"""Train / held-out split of the problem set by explicit problem ids (``rl.heldout``).

One design, chosen for reproducibility: the held-out problems are *named* in the config, not
drawn from a seed. The split is then visible in the config and every report, survives problems
being added to the set, and two runs with different seeds evaluate on the same problems, so their
held-out curves compare. The default config holds out one problem of each kind of
``datasets/code-opt`` (see ``elastic/config/schema.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Tuple

from elastic.config import ConfigError


@dataclass(frozen=True)
class ProblemSplit:
    train: Tuple[str, ...]  # sorted
    heldout: Tuple[str, ...]  # in config order


def split_problems(available: Iterable[str], heldout: Sequence[str], where: str = "rl.problems") -> ProblemSplit:
    """Split the ids found in the problem directory (e.g. the keys of
    ``elastic.reward.verifiers.code_opt.problems.load_problems(cfg.rl.problems)``). An unknown held-out id, or
    nothing left to train on, is a one-line :class:`ConfigError` naming ``rl.heldout``: call it
    in the driver right after loading the config, before any work starts."""
    ids = sorted(set(available))
    known = set(ids)
    for h in heldout:
        if h not in known:
            shown = ", ".join(ids[:20]) + (", ..." if len(ids) > 20 else "")
            raise ConfigError(f"rl.heldout: problem {h!r} is not in {where} (found: {shown or 'none'})")
    held = set(heldout)
    train = tuple(i for i in ids if i not in held)
    if not train:
        raise ConfigError(f"rl.heldout: holds out all {len(ids)} problems of {where}; nothing is left to train on")
    return ProblemSplit(train=train, heldout=tuple(heldout))
