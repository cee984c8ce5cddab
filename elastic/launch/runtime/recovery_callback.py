"""Record Ray Train controller decisions (failure retries, elastic resizes) with timestamps.

Runs inside the Ray Train controller. Together with the workers' `start` events and the
step records, these events let :mod:`elastic.report.recovery` say, for every restart, what
caused it, the world sizes before and after, how long recovery took and how many steps
were redone. Uses Ray Train's ControllerCallback hooks (a DeveloperAPI in Ray 2.5x/2.60).
"""

from __future__ import annotations

import os
import time

from ray.train.v2._internal.constants import DEFAULT_HEALTH_CHECK_INTERVAL_S, HEALTH_CHECK_INTERVAL_S_ENV_VAR
from ray.train.v2._internal.execution.callback import ControllerCallback

from elastic.records import append_record


class RecoveryEventsCallback(ControllerCallback):
    def __init__(self, events_path: str):
        self.events_path = events_path

    def _write(self, rec: dict) -> None:
        try:
            append_record(self.events_path, {"time": time.time(), **rec})
        except OSError:
            pass  # accounting must never break training

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        self._write({"event": "failure_decision", "decision": getattr(failure_decision, "value", str(failure_decision))})

    def before_controller_execute_resize_decision(self, resize_decision) -> None:
        self._write({"event": "resize_decision", "num_workers": int(resize_decision.num_workers)})

    def after_controller_state_update(self, previous_state, current_state) -> None:
        if type(previous_state) is type(current_state):
            return  # RunningState → RunningState every poll: not an event
        rec = {"event": "controller_state", "from": type(previous_state).__name__, "to": type(current_state).__name__}
        if rec["from"] == "InitializingState":  # how often this controller polls (lean_train.POLL_S): the
            # latency of every end, failure and checkpoint registration it sees
            rec["poll_s"] = float(os.environ.get(HEALTH_CHECK_INTERVAL_S_ENV_VAR, DEFAULT_HEALTH_CHECK_INTERVAL_S))
        err = getattr(current_state, "training_failed_error", None)
        if err is not None:
            rec["error"] = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
        self._write(rec)
