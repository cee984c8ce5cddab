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
    coordinator's answer.

The services are matched by class name, so a Ray without them, or one that builds them some
other way, keeps its own defaults. Private Ray Train API (a DeveloperAPI in Ray 2.5x/2.60).
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer

try:  # the fixed policy and its coordinator calls (Ray 2.5x/2.60)
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
except ImportError:  # another Ray: its own policy stays
    FixedScalingPolicy = None

UNUSED_CALLBACKS = ("DatasetsCallback",)
UNUSED_PRIVATE_CALLBACKS = ("PlacementGroupCleanerCallback",)


if FixedScalingPolicy is not None:
    class LocalFixedScalingPolicy(FixedScalingPolicy):
        """FixedScalingPolicy that asks no autoscaler for nodes (a private instance has none)."""

        def after_controller_start(self, train_run_context) -> None:
            self._requester_id = f"train-{train_run_context.run_id}"

        def _maybe_send_resource_request(self) -> None:
            pass

        def _send_resource_request(self) -> None:
            pass

        def _cancel_resource_request(self) -> None:
            pass
else:
    LocalFixedScalingPolicy = None


class LeanTorchTrainer(TorchTrainer):
    """TorchTrainer without the dataset manager (when it has no datasets)."""

    private = False

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
        return super()._initialize_and_run_controller(**kwargs)


class PrivateTorchTrainer(LeanTorchTrainer):
    """LeanTorchTrainer for a private instance: also without the placement-group cleaner and,
    for a fixed-size run, the autoscaling coordinator."""

    private = True


def trainer_class(private: bool) -> type:
    return PrivateTorchTrainer if private else LeanTorchTrainer
