"""A pool of Ray actors serving evaluations, with backpressure, deadlines and retries.

* Each actor reserves 1 CPU (evaluations are single-threaded and timed on one pinned core)
  plus, when ``reward.actor_resource`` is set, 0.01 of that custom resource: the resource is
  a *label* ("this node may host reward actors", e.g. ``ray start --resources
  '{"reward": 1}'``); CPUs bound how many land on a node, the label only decides where.
* The driver keeps at most ``max_in_flight_per_actor`` items queued on each actor (bounded
  memory, and no long tail stuck behind one slow actor).
* Infrastructure failures (actor/worker/node died, per-item deadline breached) are retried
  on a new actor, up to ``max_retries`` times, then reported as ``sandbox_error``, which is
  never a verdict on the program. A deadline breach kills and replaces the actor (the
  sandbox already enforces the program's own time limits, so a breach means the
  infrastructure is stuck). Dead actors are replaced by new ones in the same slot.
* Problems are shipped by value through the object store (``ray.put`` once per problem),
  so actors need no shared filesystem.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import ray

from elastic.reward.evaluator import default_sandbox, evaluate_completion
from elastic.reward.problems import Problem, load_problems
from elastic.reward.result import Result
from elastic.reward.settings import EvalSettings

log = logging.getLogger("elastic.reward")
RESOURCE_AMOUNT = 0.01


@ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)
class RewardActor:
    """Evaluates one item at a time on core `index % cores` of its node."""

    def __init__(self, settings: EvalSettings, index: int) -> None:
        logging.basicConfig(level=logging.WARNING)
        self.settings = dataclasses.replace(settings, cpu=index)
        self.sandbox = default_sandbox(settings.env_allow)

    def layers(self) -> Dict[str, Any]:
        return self.sandbox.layers

    def pid(self) -> int:
        return os.getpid()

    def evaluate(self, problem: Problem, completion: str) -> Result:
        self.sandbox.sweep_stale()  # leftovers of a killed predecessor on this node (cheap)
        return evaluate_completion(problem, completion, self.settings, self.sandbox)


class RewardPool:
    """``RewardPool(cfg.reward, problems_dir).evaluate_batch([(problem_id, completion), ...])``."""

    def __init__(self, section, problems_dir: "str | Path", problems: Optional[Dict[str, Problem]] = None) -> None:
        self.section = section
        self.settings = EvalSettings.from_section(section)
        self.problems = problems if problems is not None else load_problems(problems_dir)
        self._refs: Dict[str, Any] = {}
        self.actors: List[Any] = [None] * section.num_actors
        self._gen = [0] * section.num_actors
        self.replaced = 0
        for i in range(section.num_actors):
            self._start(i)

    def _start(self, slot: int) -> None:
        opts: Dict[str, Any] = {"num_cpus": 1}
        if self.section.actor_resource:
            opts["resources"] = {self.section.actor_resource: RESOURCE_AMOUNT}
        self.actors[slot] = RewardActor.options(**opts).remote(self.settings, slot)
        self._gen[slot] += 1

    def _replace(self, slot: int, gen: int, why: str) -> None:
        if self._gen[slot] != gen:  # already replaced after an earlier failure
            return
        log.warning("reward actor %d replaced: %s", slot, why)
        try:
            ray.kill(self.actors[slot])
        except Exception:  # already dead
            pass
        self.replaced += 1
        self._start(slot)

    def layers(self) -> Dict[str, Any]:
        """Isolation layers active on the first actor's node."""
        return ray.get(self.actors[0].layers.remote())

    def _problem_ref(self, pid: str) -> Any:
        if pid not in self._refs:
            self._refs[pid] = ray.put(self.problems[pid])
        return self._refs[pid]

    def evaluate_batch(self, items: Sequence[Tuple[str, str]]) -> List[Result]:
        """Results in the order of `items`; every item gets one, whatever fails."""
        n = len(items)
        results: List[Optional[Result]] = [None] * n
        attempts = [0] * n
        last_slot: List[Optional[int]] = [None] * n
        pending = collections.deque()
        for i, (pid, _) in enumerate(items):
            if pid in self.problems:
                pending.append(i)
            else:
                results[i] = Result(pid, "sandbox_error", self.settings.failure_reward, reason=f"unknown problem id {pid!r}")
        cap = self.section.max_in_flight_per_actor
        deadline = self.section.item_deadline_s
        load = [0] * len(self.actors)
        in_flight: Dict[Any, Tuple[int, int, int, float]] = {}  # ref -> (item, slot, gen, dispatched)

        def infra_failure(i: int, slot: int, why: str) -> None:
            attempts[i] += 1
            last_slot[i] = slot
            if attempts[i] > self.section.max_retries:
                pid = items[i][0]
                results[i] = Result(pid, "sandbox_error", self.settings.failure_reward, attempts=attempts[i],
                                    reason=f"infrastructure failure after {attempts[i]} attempts: {why}")
            else:
                pending.appendleft(i)

        while pending or in_flight:
            while pending:
                i = pending[0]
                free = [s for s in range(len(self.actors)) if load[s] < cap]
                if not free:
                    break
                other = [s for s in free if s != last_slot[i]] or free  # retry elsewhere when possible
                slot = min(other, key=lambda s: load[s])
                pending.popleft()
                pid, completion = items[i]
                ref = self.actors[slot].evaluate.remote(self._problem_ref(pid), completion)
                in_flight[ref] = (i, slot, self._gen[slot], time.monotonic())
                load[slot] += 1
            now = time.monotonic()
            wait_s = max(0.0, min(t + deadline for (_, _, _, t) in in_flight.values()) - now)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=min(wait_s, 5.0))
            if ready:
                ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
            for ref in ready:
                i, slot, gen, _ = in_flight.pop(ref)
                load[slot] -= 1
                try:
                    r = ray.get(ref)
                except ray.exceptions.RayError as e:
                    why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                    self._replace(slot, gen, why)
                    infra_failure(i, slot, why)
                    continue
                r.attempts = attempts[i] + 1
                results[i] = r
            now = time.monotonic()
            for ref, (i, slot, gen, t) in list(in_flight.items()):
                if now - t > deadline and ref in in_flight:
                    del in_flight[ref]
                    load[slot] -= 1
                    self._replace(slot, gen, f"item deadline {deadline:g}s exceeded")
                    infra_failure(i, slot, f"item deadline {deadline:g}s exceeded")
                    # the actor's other items fail with RayActorError and are retried too
        return results  # type: ignore[return-value]

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []
