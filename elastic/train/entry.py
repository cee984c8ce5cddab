"""Ray Train entry points of the language-modelling jobs, importable without torch: the driver
hands Ray Train a reference to one of these, and only the worker that calls it imports the
training loop (elastic/train/loop.py: torch, FSDP, the model), so the driver does not."""

from __future__ import annotations

from typing import Any, Dict


def train_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for language-modelling jobs (pretraining, SFT): elastic/train/loop.py's."""
    from elastic.train.loop import train_loop_per_worker as run

    run(config)
