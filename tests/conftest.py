"""Shared fixtures: a real local Ray cluster, and an environment that reaches Ray workers.

Ray workers inherit the environment of the raylet that the test process starts, so putting
this checkout first on PYTHONPATH makes workers import this tree's `elastic` (also from a
git worktree), and WANDB_MODE=disabled keeps tests off the network.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray Train v2 and Ray Data are chatty on a 2-core machine; keep the test log readable.
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def ray_local():
    """A fresh local Ray cluster for this test session (never attaches to a `ray start` one).

    4 logical CPUs on a 2-core machine so two train workers plus Ray Data tasks can be
    scheduled at once (the work is small; oversubscription only costs time).
    """
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "WANDB_MODE": "disabled"}})
    yield ray
    ray.shutdown()


def pytest_report_header(config):
    """Say in every test log which sandbox isolation layers this machine provides."""
    try:
        from elastic.sandbox.isolation import detect

        return f"sandbox isolation layers: {detect().report()}"
    except Exception as e:  # the header must never break collection
        return f"sandbox isolation layers: detection failed ({type(e).__name__}: {e})"
