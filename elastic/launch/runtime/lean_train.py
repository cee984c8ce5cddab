"""Ray Train's TorchTrainer without the services our jobs do not use.

Each service is an actor, that is a Python process of its own: 1.8-2.5 CPU-seconds to start on
the 2-core machine, taken from the train workers starting at the same moment (the default job's
start-up, docs/benchmarks.md). Left out:

- always, Ray Train's dataset manager: it serves the shards of a trainer's `datasets=`, and no
  job passes any (workers read the shard cache, elastic/data/reader.py);
- on a private instance (cluster.py), which dies with the driver and never grows:
  - the placement-group cleaner, which removes a dead controller's placement groups from a
    cluster that outlives it, and asks the dashboard's state API every second whether the
    controller lives (a private instance has no dashboard);
  - for a fixed-size run, the autoscaling coordinator, through which a run asks an autoscaler
    for nodes. The controller waited for it before scheduling any worker (up to 5 s). An elastic
    run (min_workers < max_workers) keeps it: its scaling policy sizes the group from the
    coordinator's answer, asked with a fresh view of the cluster (FreshElasticScalingPolicy).

Its controller polls the workers every POLL_S (0.5 s) rather than Ray Train's 2 s, and its
process never imports torch: the backend config is ProcessGroupConfig (runtime/process_group.py)
and the scaling policies live in runtime/scaling_policies.py, both torch-free.

The services are matched by class name, so a Ray without them, or one that builds them some
other way, keeps its own defaults. Private Ray Train API (a DeveloperAPI in Ray 2.5x/2.60).
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer

from elastic.launch.runtime.process_group import ProcessGroupConfig
from elastic.launch.runtime.scaling_policies import (ElasticScalingPolicy, FixedScalingPolicy, LocalFixedScalingPolicy,
                                                     UnitElasticScalingPolicy)


# The running controller, so a stopped driver can abort it before `ray.shutdown` (stop.py's
# `disconnect`): `fit` runs in a helper thread (stop.call_interruptibly) blocked in a Ray call
# on the controller, and shutting Ray down under that thread can crash the driver (a Ctrl-C
# once ended it with SIGSEGV). Ray Train's own SIGINT handler, installed only when `fit` runs
# in the main thread, aborts the controller the same way.
RUNNING: list = []

# How often the controller polls its workers (Ray Train's RAY_TRAIN_HEALTH_CHECK_INTERVAL_S; a
# user's value wins). Every end of a worker group is seen at a poll: when the training function
# returns (the run's end, a finished attempt), when a worker dies, and when a checkpoint a worker
# reported is registered. Ray Train's 2 s default left each job idle for 1 s on average after its
# last step (up to 2 s), and as long again for every failure noticed; a poll is one actor call per
# worker, and a missed one (slower than the interval) only waits for the next: Ray Train fails a
# worker after 10 minutes of missed polls, not one.
POLL_S = 0.5

try:  # Ray 2.5x/2.60's controller start, with the handle kept (TorchTrainer._initialize_and_run_controller)
    import ray
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR
    from ray.train.v2._internal.constants import HEALTH_CHECK_INTERVAL_S_ENV_VAR
    from ray.train.v2._internal.execution.controller import TrainController
    from ray.train.v2.api.data_parallel_trainer import (DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE,
                                                        get_env_vars_to_propagate)

    def _run_controller(**kwargs):
        env_vars = get_env_vars_to_propagate()
        env_vars.setdefault(RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR, DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE)
        env_vars.setdefault(HEALTH_CHECK_INTERVAL_S_ENV_VAR, str(POLL_S))  # the user's own value, when set, is propagated above
        cls = ray.remote(num_cpus=0, label_selector={ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()},
                         runtime_env={"env_vars": env_vars})(TrainController)
        controller = cls.remote(**kwargs)
        RUNNING[:] = [controller]
        try:
            ray.get(controller.run.remote())
            return ray.get(controller.get_result.remote())
        finally:
            RUNNING.clear()
except ImportError:
    _run_controller = None


def abort_running(timeout_s: float = 15.0) -> None:
    """Abort the running controller, if any (its workers stop), so `fit` returns; never raises."""
    for controller in list(RUNNING):
        try:
            ray.get(controller.abort.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - gone already, or slow: shutdown follows either way
            pass


UNUSED_CALLBACKS = ("DatasetsCallback",)
UNUSED_PRIVATE_CALLBACKS = ("PlacementGroupCleanerCallback",)


class LeanTorchTrainer(TorchTrainer):
    """TorchTrainer without the dataset manager (when it has no datasets)."""

    private = False
    worker_unit = 1    # elastic sizes are multiples of this (parallel.tp): set by the driver
    events_path = ""   # where the unit policy says what it left out

    def __init__(self, *args, torch_config=None, **kwargs):
        # Ray's TorchConfig brings torch into the controller's process at every start (2.3 s on
        # 2 cores); ProcessGroupConfig is the same setup without it (runtime/process_group.py).
        super().__init__(*args, torch_config=torch_config or ProcessGroupConfig(), **kwargs)

    def _create_default_callbacks(self):
        callbacks = super()._create_default_callbacks()
        if getattr(self, "datasets", None):  # a caller's datasets: Ray Train's data services stay
            return callbacks
        unused = UNUSED_CALLBACKS + (UNUSED_PRIVATE_CALLBACKS if self.private else ())
        return [cb for cb in callbacks if type(cb).__name__ not in unused]

    def _initialize_and_run_controller(self, **kwargs):
        policy = kwargs.get("scaling_policy")
        if self.private and LocalFixedScalingPolicy is not None and type(policy) is FixedScalingPolicy:
            kwargs["scaling_policy"] = LocalFixedScalingPolicy(policy.scaling_config)
        if UnitElasticScalingPolicy is not None and type(policy) is ElasticScalingPolicy:
            kwargs["scaling_policy"] = UnitElasticScalingPolicy(policy.scaling_config, self.worker_unit, self.events_path)
        if _run_controller is None:  # another Ray: its own method (no abort on a stop)
            return super()._initialize_and_run_controller(**kwargs)
        return _run_controller(**kwargs)


class PrivateTorchTrainer(LeanTorchTrainer):
    """LeanTorchTrainer for a private instance: also without the placement-group cleaner and,
    for a fixed-size run, the autoscaling coordinator."""

    private = True


def trainer_class(private: bool) -> type:
    return PrivateTorchTrainer if private else LeanTorchTrainer
