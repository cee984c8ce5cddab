"""Driver side of the disaggregated placement (`rl.rollout.placement: disaggregated`): start the
run's rollout coordinator and its fleet before the trainers, stop them after; and a command to
resize a running fleet:

    python -m elastic.launch.rollouts --run NAME --workers N     (scripts/scale_rollouts.sh)

The coordinator is a named actor of the driver's job (it ends with the job), in the
`elastic-rollouts` namespace so another driver finds it by the run's name; its rollout actors are placed by Ray wherever `rl.rollout.cpus_per_worker` /
`gpus_per_worker` fit, apart from the Ray Train workers.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, Optional

from elastic.config import Config
from elastic.launch.driver import JOB_WORK_ENV, fault_env
from elastic.rl.rollout import NAMESPACE, coordinator_name
from elastic.rl.rollout.coordinator import RolloutCoordinator

START_TIMEOUT_S = 300.0  # an actor that cannot be placed: one line, not a hang


def worker_options(cfg: Config) -> Dict[str, Any]:
    """Ray options of one rollout actor: its CPUs or GPUs, the job's niceness, one OpenMP thread
    on the actor's main thread (it sets its torch threads itself), and the driver's
    ELASTIC_FAULT_* variables (fault injection in tests and drills)."""
    ro = cfg.rl.rollout
    opts: Dict[str, Any] = {"num_cpus": ro.cpus_per_worker, "max_restarts": 0,
                            "runtime_env": {"env_vars": {**JOB_WORK_ENV, "OMP_NUM_THREADS": "1", **fault_env()}}}
    if ro.gpus_per_worker > 0:
        opts["num_gpus"] = ro.gpus_per_worker
    return opts


def start_fleet(cfg: Config, spec: Dict[str, Any]):
    """The coordinator and its fleet, started and answering (RuntimeError in one line if no
    rollout actor could start)."""
    import ray

    from elastic.config.load import to_dict

    spec = {**spec, "cfg": to_dict(cfg), "worker_options": worker_options(cfg)}
    actor = ray.remote(RolloutCoordinator).options(name=coordinator_name(cfg.run.name), namespace=NAMESPACE, num_cpus=0,
                                                   max_concurrency=1000, runtime_env={"env_vars": dict(JOB_WORK_ENV)}).remote(spec)
    try:
        info = ray.get(actor.start.remote(), timeout=START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        stop_fleet(actor)
        ro = cfg.rl.rollout
        need = f"{ro.cpus_per_worker:g} CPU" + (f" + {ro.gpus_per_worker:g} GPU" if ro.gpus_per_worker else "")
        free = {k: round(v, 2) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
        raise RuntimeError(f"rl.rollout: {ro.workers} rollout actor(s) of {need} each did not start within "
                           f"{START_TIMEOUT_S:g} s (free now: {free}); lower rl.rollout.cpus_per_worker or "
                           "rl.rollout.workers, or add nodes") from None
    return actor, info


def stop_fleet(actor) -> None:
    import ray

    if actor is None:
        return
    try:
        ray.get(actor.shutdown.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - already gone
        pass
    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001
        pass


def resize(run: str, workers: int, address: Optional[str] = None) -> Dict[str, Any]:
    """Set the rollout fleet of the running job `run` to `workers` actors."""
    import ray

    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    try:
        actor = ray.get_actor(coordinator_name(run), namespace=NAMESPACE)
    except ValueError:
        raise SystemExit(f"no running rollout fleet for run {run!r} on this cluster (is the run disaggregated and running?)")
    return ray.get(actor.resize.remote(workers), timeout=START_TIMEOUT_S)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Resize the rollout fleet of a running disaggregated RL job.")
    ap.add_argument("--run", required=True, help="run.name of the job")
    ap.add_argument("--workers", type=int, required=True, help="rollout actors wanted")
    ap.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else auto)")
    a = ap.parse_args(argv)
    if a.workers < 1:
        print("--workers: must be >= 1", file=sys.stderr)
        return 2
    print(resize(a.run, a.workers, a.address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
