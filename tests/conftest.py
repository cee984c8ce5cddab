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

    from elastic.launch.runtime.cluster import start_private_instance

    if ray.is_initialized():
        ray.shutdown()
    # Started exactly as a job's own private instance (elastic/launch/runtime/cluster.py): no
    # prestarted idle workers, autoscaler monitor or log monitor, without Ray Train's metrics
    # export and preemption watcher, tried again if its node start times out on the busy machine;
    # and the jobs tests run on it are lean as on their own instance (no placement-group cleaner
    # or autoscaling coordinator for a fixed-size run: lean_train.PrivateTorchTrainer). Each of
    # those is a process per job: 2-3 CPU-seconds of start-up on the 2-core machine.
    start_private_instance(4, {"PYTHONPATH": os.environ["PYTHONPATH"], "WANDB_MODE": "disabled"})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def small_run_6(ray_local, tmp_path_factory):
    """(corpus, run directory) of the uninterrupted 6-step small run (helpers.small_run_overrides,
    2 workers), run once per session: the reference tests/test_resume.py and
    tests/test_parallel_layouts.py hold their stopped, resumed and re-laid-out runs to."""
    from elastic.config import load_config
    from elastic.launch.pretrain import run_pretraining
    from tests.helpers import make_text_corpus, small_run_overrides

    d = tmp_path_factory.mktemp("small6")
    corpus = make_text_corpus(d / "corpus")
    run_pretraining(load_config(None, small_run_overrides(d / "runs", "a", corpus, 6)))
    return corpus, d / "runs" / "a"


def pytest_report_header(config):
    """Say in every test log which sandbox isolation layers this machine provides."""
    try:
        from elastic.sandbox.isolation import detect

        return f"sandbox isolation layers: {detect().report()}"
    except Exception as e:  # the header must never break collection
        return f"sandbox isolation layers: detection failed ({type(e).__name__}: {e})"


_FILE_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    """Add each phase's seconds (setup, call, teardown) to its test file's total."""
    f = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[f] = _FILE_SECONDS.get(f, 0.0) + float(report.duration or 0.0)


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file, slowest first, beside the per-test --durations list: the suite's time
    budget (50 minutes in CI) is spent file by file, and this is where a cut pays."""
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"seconds per test file (all phases; {total:.0f} s in all)")
    for f, s in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        if s >= 1.0:
            terminalreporter.write_line(f"{s:8.1f}s {100 * s / total:5.1f}%  {f}")


# --- Running the suite on two processes (opt-in: `pytest -n 2 --dist loadfile --no-loadscope-reorder`) ---
# Each test file is one unit of work, so its module fixtures (a trained policy, a cluster) are
# built once; files that share a session fixture share a unit. Units start longest first
# (seconds from the per-file table every run prints; a file not listed takes a few seconds):
# with two processes the suite ends when the longer of two queues does, so the long files must
# not come last.
SHARED_UNITS = {"tests/test_resume.py": "small_run_6", "tests/test_parallel_layouts.py": "small_run_6"}
LONGEST_FIRST = (
    "tests/test_grpo.py", "tests/test_bench_smoke.py", "tests/test_grpo_turns.py", "tests/test_reward_model.py",
    "tests/test_launch.py", "tests/test_elastic.py", "tests/test_dpo.py", "small_run_6", "tests/test_checkpoint_crash.py",
    "tests/test_sft.py", "tests/test_job_submit.py", "tests/test_data_store_remote.py", "tests/test_step_breakdown.py",
    "tests/test_mixture.py", "tests/test_ray_dataset_source.py", "tests/test_lora_run.py", "tests/test_data_store.py",
    "tests/test_fsdp_equivalence.py", "tests/test_hf_export.py", "tests/test_scaling_ladder.py", "tests/test_reshard.py",
    "tests/test_eval_run.py", "tests/test_generate_engine.py", "tests/test_fit_gpus.py", "tests/test_python_tests_batch.py",
    "tests/test_reward_problems.py", "tests/test_qlora.py",
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or the unit its file shares."""
    f = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(f, f)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2`), longest units first; within a unit, the order of collection.
    A run in one process keeps the plain collection order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {u: i for i, u in enumerate(LONGEST_FIRST)}
    units = {id(it): unit_of(it.nodeid) for it in items}
    order = {u: n for n, u in enumerate(dict.fromkeys(units.values()))}
    items.sort(key=lambda it: (rank.get(units[id(it)], len(rank)), order[units[id(it)]]))  # stable


@pytest.hookimpl(optionalhook=True)  # a pytest without pytest-xdist (the GPU image) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with our units as the scopes (`--dist loadgroup` would need an
    xdist_group mark turned into a node-id suffix, which pytest 9.2's node ids no longer take).
    The queue keeps the collection order (--no-loadscope-reorder): longest first."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)
