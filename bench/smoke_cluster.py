"""One Ray instance for the jobs of a benchmark's smoke run (CI, CPU), instead of one per job.

A smoke job trains for a second or two; most of what it costs is processes starting. Each job
that starts its own private instance also starts that instance's daemons (GCS, raylet, the
agents) and Ray Data's bookkeeping actors (stats, autoscaling requester, actor locations),
about 9 CPU-seconds per job on the 2-core machine. In smoke mode a benchmark starts one lean
private instance in its own process, exactly as a job starts its own (elastic/launch/runtime/
cluster.py: no dashboard, monitors or prestarted workers, without Ray Train's metrics export
and preemption watcher), and its jobs join it through RAY_ADDRESS, as under `ray job submit`:
two pretraining jobs took 74.5 CPU-s there against 85.2 CPU-s with an instance each. A job
run in this process (bench/train_throughput.py's sweep) keeps this process's connection.
Full runs are unchanged: every job starts its own instance, as a user's does.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def shared_instance(cpus: int) -> Iterator[str]:
    """Start the instance with `cpus` logical CPUs (what the jobs running at once need: Ray
    places by these counts, the cores may be fewer) and set RAY_ADDRESS to it for the jobs this
    process starts; on the way out stop the instance and restore the environment (RAY_ADDRESS,
    and the auth and Ray Train variables a private instance's driver sets). Yields its GCS
    address."""
    import ray

    from elastic.launch.driver import worker_env
    from elastic.launch.runtime.cluster import ENV, PRIVATE, ClusterChoice, connect

    saved = dict(os.environ)
    os.environ.pop(ENV, None)  # RAY_ADDRESS=local (as CI sets it) is what starts one
    try:
        address = connect(ClusterChoice(PRIVATE, None, ""), cpus, worker_env()).address
        os.environ[ENV] = address
        yield address
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
