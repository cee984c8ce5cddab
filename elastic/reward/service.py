"""The run's one shared reward service: a named Ray actor that owns the RewardPool.

Every train worker sends each finished completion here at once, so sandboxed evaluation
overlaps generation and the log-prob passes, and identical programs from different workers
are evaluated once (the pool's dedup window)::

    # driver, before training (problems are loaded and checked here, then shipped by value)
    client = start_service(cfg.reward, "datasets/code-opt", name=f"reward-{run_name}")
    # any train worker (or pass `client` itself: it pickles)
    client = connect(f"reward-{run_name}")
    client.submit([(key, problem_id, completion), ...])   # idempotent per key; wait=False: no round trip
    client.submit([(key, problem_id, completion, Request(feedback="details"))])  # + Result.feedback
    got = client.results(keys, timeout_s=60)               # {key: Result}; partial on timeout
    client.forget(keys)                                    # free what the trainer consumed
    client.stats()

Keys are the caller's (e.g. ``"step:prompt:sample"``). Submitting a key that is done or in
flight does nothing, so a restarted train worker may resubmit its step's completions. An item's
optional fourth element is a :class:`~elastic.reward.request.Request`: the multi-turn feedback
to make where the task is at hand, and with ``rl.env`` (``start_service(..., env=...)``) which
turn of an episode the completion answers (elastic/reward/request.py).

The service actor takes no CPU (``num_cpus=0``): it is a dispatcher. Its threads serve
submit/results/stats/forget concurrently (``max_concurrency``); one more thread feeds the
pool continuously through the same ``RewardPool.submit``/``poll`` mechanism that
``evaluate_batch`` uses. The items of one ``submit`` are queued together, so that batched
verifiers (``python_tests``) get them in batches of up to ``reward.batch_size`` per actor call.
Results keep the pool's semantics: infrastructure failures are retried, after
``max_retries`` reported as ``sandbox_error`` (never a program verdict), dead pool actors are
replaced.

Failure bound. Callers never hang: :class:`RewardClient` raises :class:`RewardServiceError`
(one line saying why)

* at once when the service actor is gone (killed, its node lost: it is not restarted, since
  its in-flight keys would be lost with it; the run stops and resumes from its checkpoint);
* when the pool is gone for good: no evaluation completed for ``reward.unavailable_after_s``
  while work waited (actors that cannot be placed or never answer), or
  ``RewardPool.failure_limit`` consecutive failed attempts (actors that keep dying), plus at
  most ``LOOP_POLL_S``;
* when the service does not answer a call within its timeout plus ``CALL_MARGIN_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import ray

from elastic.reward.pool import RewardPool, RewardUnavailable
from elastic.reward.verifiers.code_opt.problems import Problem, load_problems
from elastic.reward.result import Result
from elastic.reward.tasks import Task, tasks_from_problems

log = logging.getLogger("elastic.reward")

SERVICE_THREADS = 128  # concurrent calls served; each waiting results() call holds one
LOOP_POLL_S = 0.05  # the dispatcher thread's longest wait before it looks at new submissions
CALL_MARGIN_S = 30.0  # a call's answer may take this much longer than its own timeout
START_TIMEOUT_S = 120.0
Item = Tuple  # (key, task id, completion) or (key, task id, completion, Request)


class RewardServiceError(RuntimeError):
    """The shared reward service cannot serve this call (gone, broken pool, no answer)."""


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=SERVICE_THREADS)
class RewardService:
    """The named actor behind :class:`RewardClient` (call it through the client)."""

    def __init__(self, section, tasks: Dict[str, Task], env: str = "") -> None:
        logging.basicConfig(level=logging.WARNING)
        self.pool = RewardPool(section, None, tasks=tasks, env=env)
        self._cond = threading.Condition()
        self._results: Dict[str, Result] = {}
        self._pending: Set[str] = set()
        self._error = ""
        self._stop = False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._feed, name="reward-dispatch", daemon=True)
        self._thread.start()

    def ping(self) -> bool:
        return True

    def submit(self, items: Sequence[Item]) -> int:
        """Accept new keys (known ones are ignored); returns how many were new."""
        new = 0
        with self._cond:
            self._raise_if_failed()
            try:
                for key, problem_id, completion, *request in items:
                    if key in self._results or key in self._pending:
                        continue
                    self._pending.add(key)
                    self.pool.submit(key, problem_id, completion, dispatch=False, request=request[0] if request else None)
                    new += 1
                self.pool.dispatch()  # all at once: they can share batches (reward.batch_size)
            except RewardUnavailable as e:
                self._error = str(e)
                raise
            self._cond.notify_all()  # wake the dispatcher if it idles
        return new

    def results(self, keys: Sequence[str], timeout_s: float) -> Dict[str, Result]:
        """Block until every key has a Result or `timeout_s` passes; returns those done."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            unknown = [k for k in keys if k not in self._results and k not in self._pending]
            if unknown:
                raise KeyError(f"{len(unknown)} keys were never submitted or were forgotten, e.g. {unknown[0]!r}")
            if any(k not in self._results for k in keys):
                try:
                    self.pool.flush()  # a caller waits: partial batches go now
                except RewardUnavailable as e:
                    self._error = str(e)
            while True:
                missing = any(k not in self._results for k in keys)
                if not missing:
                    break
                self._raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return {k: self._results[k] for k in keys if k in self._results}

    def forget(self, keys: Sequence[str]) -> int:
        """Drop results (and pending keys) the caller no longer needs; returns how many."""
        n = 0
        with self._cond:
            for k in keys:
                if self._results.pop(k, None) is not None or k in self._pending:
                    self._pending.discard(k)
                    n += 1
        return n

    def stats(self) -> Dict[str, Any]:
        s = self.pool.stats()
        with self._cond:
            s.update(keys_pending=len(self._pending), keys_done=len(self._results),
                     uptime_s=time.monotonic() - self._started, error=self._error or None)
        return s

    def layers(self) -> Dict[str, Any]:
        return self.pool.layers()

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.pool.shutdown()

    # -- the dispatcher thread -------------------------------------------------------------
    def _feed(self) -> None:
        """Keep the pool busy and move finished results to their keys."""
        while True:
            with self._cond:
                while not self._stop and self.pool.outstanding == 0:
                    self._cond.wait(1.0)
                if self._stop:
                    return
            try:
                finished = self.pool.poll(LOOP_POLL_S)
            except RewardUnavailable as e:
                self._fail(str(e))
                return
            except Exception as e:  # a bug here must not leave callers waiting forever
                log.exception("reward service dispatcher crashed")
                self._fail(f"reward service dispatcher crashed: {type(e).__name__}: {e}")
                return
            if finished:
                with self._cond:
                    for key, r in finished:
                        if key in self._pending:
                            self._pending.discard(key)
                            self._results[key] = r
                    self._cond.notify_all()

    def _fail(self, why: str) -> None:
        with self._cond:
            self._error = why
            self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error:
            raise RewardUnavailable(self._error)


class RewardClient:
    """What callers hold: the service's actor handle, with bounded, translated calls."""

    def __init__(self, name: str, actor: Any) -> None:
        self.name = name
        self.actor = actor
        self._unanswered: List[Any] = []  # refs of submits sent without waiting (submit(wait=False))

    def __getstate__(self) -> Dict[str, Any]:  # a pickled client carries the handle, not this process's refs
        return {"name": self.name, "actor": self.actor}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["name"], state["actor"])

    def _call(self, method: str, *args: Any, timeout_s: float = CALL_MARGIN_S) -> Any:
        return self._get(getattr(self.actor, method).remote(*args), method, timeout_s)

    def _get(self, ref: Any, method: str, timeout_s: float) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RewardServiceError(f"reward service {self.name!r} did not answer {method} within "
                                     f"{timeout_s:g} s") from None
        except ray.exceptions.RayActorError as e:
            raise RewardServiceError(f"reward service {self.name!r} is gone: {_first_line(e)}") from None
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, KeyError):
                raise KeyError(cause.args[0] if cause.args else str(cause)) from None
            raise RewardServiceError(f"reward service {self.name!r}: {_first_line(cause)}") from None

    def _settle(self) -> None:
        """Wait for the submits sent without waiting (the service serves calls on many threads,
        so a later call could otherwise overtake them); their errors raise here."""
        refs, self._unanswered = self._unanswered, []
        for ref in refs:
            self._get(ref, "submit", CALL_MARGIN_S)

    def submit(self, items: Sequence[Item], wait: bool = True) -> Optional[int]:
        """Queue ``(key, problem_id, completion[, Request])`` items; returns how many keys were new.

        ``wait=False`` sends them and returns None at once: a trainer streaming completions
        during generation does not stop for a round trip per completion (2-5 ms each on 2
        busy cores). The next ``results``, ``forget`` or ``stats`` call first waits for the
        service to have taken them, and raises what their submit raised."""
        batch = [(str(k), *rest) for k, *rest in items]
        if wait:
            self._settle()
            return self._call("submit", batch)
        self._unanswered.append(self.actor.submit.remote(batch))
        return None

    def results(self, keys: Sequence[str], timeout_s: float) -> Dict[str, Result]:
        """``{key: Result}`` for the keys done within `timeout_s` (all of them, or fewer)."""
        self._settle()
        return self._call("results", list(keys), timeout_s, timeout_s=timeout_s + CALL_MARGIN_S)

    def forget(self, keys: Sequence[str]) -> int:
        self._settle()
        return self._call("forget", list(keys))

    def stats(self) -> Dict[str, Any]:
        """Evaluations, per-status counts, dedup hits, replaced actors, evals/s, queue, busy actors."""
        self._settle()
        return self._call("stats")

    def layers(self, timeout_s: float = START_TIMEOUT_S) -> Dict[str, Any]:
        return self._call("layers", timeout_s=timeout_s)

    def shutdown(self) -> None:
        """Stop the pool's actors and the service (idempotent)."""
        try:
            self._call("shutdown")
        except RewardServiceError:
            pass
        try:
            ray.kill(self.actor)
        except Exception:
            pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def start_service(section, problems_dir: "str | Path | None", name: str, namespace: Optional[str] = None,
                  problems: Optional[Dict[str, Problem]] = None, tasks: Optional[Dict[str, Task]] = None,
                  env: str = "") -> RewardClient:
    """Create the named service (on the driver, once per run) and wait until it answers.
    `env`: ``rl.env``, a user's environment class that scores instead of reward.kind.

    Tasks (or code-optimisation problems, loaded here from `problems_dir` when neither is given)
    are checked on the driver, so a malformed problem raises ``ProblemError`` (one line naming
    the file and field) before anything starts.
    """
    if tasks is None:
        tasks = tasks_from_problems(problems if problems is not None else load_problems(problems_dir))
    try:
        actor = RewardService.options(name=name, namespace=namespace).remote(section, tasks, env)
    except ValueError as e:  # the name is taken
        raise RewardServiceError(f"cannot start reward service {name!r}: {_first_line(e)}") from None
    client = RewardClient(name, actor)
    client._call("ping", timeout_s=START_TIMEOUT_S)
    return client


def connect(name: str, namespace: Optional[str] = None, timeout_s: float = 60.0) -> RewardClient:
    """The client of a running service, waiting up to `timeout_s` for it to be registered."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return RewardClient(name, ray.get_actor(name, namespace=namespace))
        except ValueError:
            if time.monotonic() >= deadline:
                raise RewardServiceError(f"no reward service named {name!r} after {timeout_s:g} s "
                                         "(the driver starts it with start_service)") from None
            time.sleep(0.5)


__all__: List[str] = ["RewardClient", "RewardService", "RewardServiceError", "RewardUnavailable", "connect",
                      "start_service"]
