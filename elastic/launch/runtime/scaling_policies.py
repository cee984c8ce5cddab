"""The scaling policies of our jobs' Ray Train controllers, importable without torch.

They are pickled into the controller, a process of its own at every job start, which imports
the module that defines them: here, not elastic/launch/runtime/lean_train.py, whose
TorchTrainer import brings torch (see elastic/launch/runtime/process_group.py for why the
controller stays without it). Private Ray Train API (Ray 2.5x/2.60); on another Ray each name
is None and Ray's own policy stays.
"""

from __future__ import annotations

try:  # the fixed policy and its coordinator calls (Ray 2.5x/2.60)
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
except ImportError:  # another Ray: its own policy stays
    FixedScalingPolicy = None


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


try:  # the elastic policy (Ray 2.5x/2.60)
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
except ImportError:
    ElasticScalingPolicy = None


def _coordinator_recomputes() -> bool:
    """Whether this Ray's autoscaling coordinator can answer from a fresh view of the cluster
    (`get_reserved_resources(..., recompute=True)`, Ray 2.60)."""
    try:
        import inspect

        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import _AutoscalingCoordinatorActor

        return "recompute" in inspect.signature(_AutoscalingCoordinatorActor.get_reserved_resources).parameters
    except Exception:  # noqa: BLE001 - another Ray: its own policy stays
        return False


if ElasticScalingPolicy is not None and _coordinator_recomputes():
    import logging

    import ray

    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import \
        AUTOSCALING_REQUESTS_GET_TIMEOUT_S
    from ray.train.v2._internal.util import time_monotonic

    class FreshElasticScalingPolicy(ElasticScalingPolicy):
        """ElasticScalingPolicy that sizes the group from the cluster as it is now.

        Ray Train's policy asks Ray Data's autoscaling coordinator which resources it holds for
        the run, and the coordinator refreshes its view of the cluster's nodes every 20 s (its
        tick). So a node that joined could be used up to 20 s late, and a restart could count a
        node the GCS had already declared dead, then wait out
        `scaling.worker_group_start_timeout_s` for its placement group before the right size was
        tried. Here every decision asks with `recompute=True` (a fresh `ray.nodes()`, one GCS
        call): once per `scaling.elastic_resize_monitor_interval_s` while the group runs, and at
        each restart. (A node whose loss a collective reports before the GCS has declared it
        dead is still counted at the first restart: that wait remains.)"""

        def _get_reserved_resources(self):
            now = time_monotonic()
            if now - self._latest_reserved_resources_query_time < self.GET_RESERVED_RESOURCES_INTERVAL_S:
                return self._latest_reserved_resources
            reserved = None
            try:
                reserved = ray.get(self._autoscaling_coordinator.get_reserved_resources.remote(self._requester_id,
                                                                                              recompute=True),
                                   timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - as Ray's own: no resize this time, the next poll asks again
                logging.getLogger(__name__).warning("could not get the run's reserved resources; no resize this time",
                                                    exc_info=True)
            finally:
                self._latest_reserved_resources_query_time = time_monotonic()
                self._latest_reserved_resources = reserved
            return reserved
else:
    FreshElasticScalingPolicy = ElasticScalingPolicy

if FreshElasticScalingPolicy is not None:
    class UnitElasticScalingPolicy(FreshElasticScalingPolicy):
        """The policy of every elastic run (min_workers < max_workers): sizes from the cluster as it
        is now (FreshElasticScalingPolicy), in whole units of `unit` workers (`parallel.tp`; 1
        without tensor parallelism): a group of 3 when tp is 2 would hold a rank without its
        tensor-parallel peer. The workers the cluster can hold
        are rounded down to a multiple of the unit (below min_workers the policy waits, as for
        any shortage); each time that leaves workers out, one `layout_wait` event says so and
        the console prints it."""

        def __init__(self, scaling_config, unit: int, events: str = ""):
            super().__init__(scaling_config)
            self.unit, self.events, self._said = unit, events, None

        def _count_possible_workers(self, reserved_resources) -> int:
            n = super()._count_possible_workers(reserved_resources)
            used = n - n % self.unit
            if used != n and self.events and self._said != n:
                import time

                from elastic.records import append_record

                self._said = n
                append_record(self.events, {"event": "layout_wait", "time": time.time(), "possible": n,
                                            "used": used, "unit": self.unit})
            return used
else:
    UnitElasticScalingPolicy = None
