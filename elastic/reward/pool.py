"""A pool of Ray actors serving evaluations: streaming, deduplicated, retried, bounded.

One mechanism serves both callers: :meth:`RewardPool.submit` enqueues a completion and
:meth:`RewardPool.poll` dispatches queued work to free actors and collects what finished.
:meth:`RewardPool.evaluate_batch` is submit-all-then-poll; the shared reward service
(:mod:`elastic.reward.service`) calls the same two methods from its threads.

* Each actor reserves 1 CPU (evaluations are single-threaded and timed on one pinned core)
  plus, when ``reward.actor_resource`` is set, 0.01 of that custom resource: the resource is
  a *label* ("this node may host reward actors", e.g. ``ray start --resources
  '{"reward": 1}'``); CPUs bound how many land on a node, the label only decides where.
* At most ``max_in_flight_per_actor`` calls are queued on each actor (bounded memory, and no
  long tail stuck behind one slow actor); the rest wait in the pool's queue. A batching
  verifier gets one call per actor at a time: a batch queued behind a busy actor could not
  move to one that frees first.
* Batches: when a verifier scores several completions at once cheaper than one by one
  (``python_tests``: one sandbox and one interpreter for the batch), a call carries up to
  ``reward.batch_size`` items through ``RewardActor.evaluate_many``: no Ray round trip per
  item. While nobody waits, the pool sends full batches only and holds a partial one for at
  most ``reward.batch_wait_s`` (from its oldest item), so completions that trickle in during
  generation are not evaluated in ones and twos, each paying a sandbox and an interpreter start
  on the cores generation uses; once a caller waits for results (:meth:`flush`: the service's
  ``results``, ``evaluate_batch``) whatever is pending goes at once, spread over the actors
  (shares of at least ``MIN_SHARE``; a busy actor takes its share when it frees). A batch's
  deadline is ``item_deadline_s`` per item, at most half of ``unavailable_after_s``; the items of a batch whose actor died or breached it are retried
  one by one, each counting its own attempts.
* Dedup: the program is extracted here, and identical programs (same problem, language and
  source) are evaluated once: a submission joins an evaluation in flight or copies a result
  among the last ``dedup_window`` distinct programs (``Result.dedup`` marks copies). A
  GRPO group often repeats a program verbatim. Infrastructure failures are never cached.
* Infrastructure failures (actor/worker/node died, per-item deadline breached) are retried
  on another actor, up to ``max_retries`` times, then reported as ``sandbox_error``, which
  is never a verdict on the program. A deadline breach kills and replaces the actor (the
  sandbox already enforces the program's own time limits, so a breach means the
  infrastructure is stuck). Dead actors are replaced by new ones in the same slot.
* Gone for good: :meth:`poll` raises :class:`RewardUnavailable` (and keeps raising) when
  work has waited ``unavailable_after_s`` with no evaluation completing (actors that cannot
  be placed, or that never finish), or after :attr:`RewardPool.failure_limit` consecutive
  failed attempts with no success in between (actors that die at once, again and again).
* Tasks (code-optimisation problems, Python tests, math answers...: elastic/reward/tasks.py)
  are shipped by value through the object store (``ray.put`` once per task), so actors need no
  shared filesystem. What scores them is ``reward.kind`` (elastic/reward/verifiers/registry.py),
  or with ``env`` (``rl.env``) a user's environment class, stepped by stateless replay
  (elastic/reward/verifiers/user_env.py): a submission then carries the episode's earlier
  answers (:class:`~elastic.reward.request.Request`), and they are part of its dedup identity.
* Feedback for multi-turn RL is made here, where the task is at hand: a submission whose
  Request names an ``rl.feedback`` mode gets ``Result.feedback`` (elastic/reward/feedback.py),
  computed per delivery, so one evaluation (and its dedup copies) serves every mode.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence, Tuple

import ray

from elastic.reward.verifiers.code_opt.problems import Problem, load_problems
from elastic.reward.feedback import MARKER, cut_bytes, feedback_text
from elastic.reward.request import Request
from elastic.reward.result import STATUSES, Result
from elastic.reward.settings import EvalSettings
from elastic.reward.tasks import Task, tasks_from_problems
from elastic.reward.verifiers.registry import (Env, RewardSpec, batched, empty_result, identities, score, score_many,
                                               spec_from_section)

log = logging.getLogger("elastic.reward")
RESOURCE_AMOUNT = 0.01
RATE_WINDOW_S = 60.0  # evals/s in stats() is measured over this trailing window


class RewardUnavailable(RuntimeError):
    """The pool cannot evaluate at all (the message says why); the run should stop."""


@ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)
class RewardActor:
    """Evaluates one item at a time on core `index % cores` of its node."""

    def __init__(self, settings: EvalSettings, index: int, spec: RewardSpec) -> None:
        logging.basicConfig(level=logging.WARNING)
        self.settings = dataclasses.replace(settings, cpu=index)
        self.spec = spec
        self.env = Env(self.settings, spec)
        if SANDBOXED & set(spec.kinds) and not spec.env:
            self.env.sandbox  # noqa: B018 - probe now (fails closed at once), sweep a killed predecessor's leftovers
        if spec.env:
            self.env.start_env()  # the environment's child, imported now rather than within a turn's deadline

    def layers(self) -> Dict[str, Any]:
        return self.env.sandbox.layers if SANDBOXED & set(self.spec.kinds) and not self.spec.env else {}

    def pid(self) -> int:
        return os.getpid()

    def evaluate(self, task: Task, completion: str) -> Result:
        # The evaluating thread and everything it starts (compiler, sandbox, program) stay on
        # this actor's core: left to the scheduler, two actors' process chains (evaluator ->
        # runner -> program, each waking the next through a pipe) were often woken onto the
        # same core while the other idled (~20% of the machine idle, bench/reward_throughput.py).
        cpu = self.settings.pinned_cpu()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        return score(task, completion, self.spec, self.env)

    def evaluate_many(self, completions: List[str], *tasks: Task) -> List[Result]:
        """``evaluate`` of each (tasks[i], completions[i]), in order, scored as one batch (the
        tasks come as arguments so that Ray resolves their object references)."""
        cpu = self.settings.pinned_cpu()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        return score_many(list(zip(tasks, completions)), self.spec, self.env)

    def env_turn(self, task: Task, history: Tuple[str, ...], completion: Optional[str]) -> Result:
        """rl.env: the episode's first message (``completion`` None) or one turn, replayed from
        a fresh environment (elastic/reward/verifiers/user_env.py)."""
        cpu = self.settings.pinned_cpu()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        return self.env.env_turn(task, history, completion)


SANDBOXED = {"code_opt", "python_tests"}  # verifiers that run untrusted programs


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()


def program_key(problem_id: str, *parts: Optional[str]) -> str:
    """Identity of a submission for dedup: task and what its verdict depends on (the extracted
    program, answer... of each verifier term)."""
    h = hashlib.sha256()
    for part in (problem_id, *parts):
        h.update(b"\1" if part is None else part.encode(errors="surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


@dataclasses.dataclass
class _Job:
    """One distinct program to evaluate, and who waits for it."""

    key: str
    problem_id: str
    completion: str
    language: str
    tokens: List[Hashable]
    history: Optional[Tuple[str, ...]] = None  # rl.env: the episode's earlier answers; None: not an env call
    reset: bool = False  # rl.env: the first message (the completion is not used)
    attempts: int = 0
    last_slot: Optional[int] = None
    queued_t: float = dataclasses.field(default_factory=time.monotonic)  # when it (last) entered the queue


MIN_SHARE = 4  # a batching pool's smallest share of a flush (python_tests: a sandbox start ~ 3-4 evaluations)


class RewardPool:
    """``RewardPool(cfg.reward, problems_dir).evaluate_batch([(task_id, completion), ...])``;
    ``tasks=`` instead of a problem directory for task files (elastic/reward/tasks.py).

    Thread-safe: ``submit``/``poll``/``stats`` may be called from several threads (the
    service does); ``evaluate_batch`` must not run concurrently with other pollers.
    """

    def __init__(self, section, problems_dir: "str | Path | None" = None,
                 problems: Optional[Dict[str, Problem]] = None, tasks: Optional[Dict[str, Task]] = None,
                 env: str = "") -> None:
        self.section = section
        self.settings = EvalSettings.from_section(section)
        self.spec = spec_from_section(section, env)
        # The verifier whose feedback a Request asks for (a `model` term has none).
        self.feedback_kind = next((k for k in self.spec.kinds if k != "model"), "")
        if tasks is None:
            self.problems = problems if problems is not None else load_problems(problems_dir)  # type: ignore[arg-type]
            tasks = tasks_from_problems(self.problems)
        self.tasks: Dict[str, Task] = tasks
        self._lock = threading.RLock()
        self._refs: Dict[str, Any] = {}
        self.actors: List[Any] = [None] * section.num_actors
        self._gen = [0] * section.num_actors
        self._load = [0] * section.num_actors
        self._queue: Deque[_Job] = collections.deque()
        self._flushing = False  # a caller waits: partial batches go now (until the queue empties)
        self._jobs: Dict[str, _Job] = {}  # program key -> job queued or in flight
        # ref -> (jobs, slot, gen, deadline, batched call)
        self._in_flight: Dict[Any, Tuple[List[_Job], int, int, float, bool]] = {}
        self.batch_size = max(1, section.batch_size) if batched(self.spec) and not env else 1
        self._requests: Dict[Hashable, Request] = {}  # token -> its Request, until delivered
        self._recent: "collections.OrderedDict[str, Result]" = collections.OrderedDict()  # dedup window
        self._ready: List[Tuple[Hashable, Result]] = []
        self._batch_ids = itertools.count()
        self._done_times: Deque[float] = collections.deque()
        self._started = time.monotonic()
        self._progress_t = time.monotonic()  # last completed evaluation, or when work last arrived at an idle pool
        self._consecutive_failures = 0
        self._last_failure = ""
        self._broken = ""
        self.replaced = 0
        self.counts: Dict[str, int] = collections.Counter()
        self.status_counts: Dict[str, int] = collections.Counter({s: 0 for s in STATUSES})
        for i in range(section.num_actors):
            self._start(i)

    # -- actors --------------------------------------------------------------------------
    @property
    def failure_limit(self) -> int:
        """Consecutive failed attempts (no success between) after which the pool is gone:
        every actor failing every retry of a full load of items, twice over."""
        return (2 * self.section.num_actors * self.section.max_in_flight_per_actor * self.batch_size
                * (self.section.max_retries + 1))

    def _start(self, slot: int) -> None:
        # Nice 0, not Ray's worker default of 15: an actor times programs by the wall clock, and
        # at 15 every wake-up of a Ray daemon (or of a train worker, which runs at 0) preempts
        # the program being timed.
        opts: Dict[str, Any] = {"num_cpus": 1, "runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}}
        if self.section.actor_resource:
            opts["resources"] = {self.section.actor_resource: RESOURCE_AMOUNT}
        self.actors[slot] = RewardActor.options(**opts).remote(self.settings, slot, self.spec)
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

    def _task_ref(self, tid: str) -> Any:
        if tid not in self._refs:
            self._refs[tid] = ray.put(self.tasks[tid])
        return self._refs[tid]

    # -- the streaming mechanism -----------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Distinct programs queued or in flight, plus results not yet returned by poll."""
        with self._lock:
            return len(self._jobs) + len(self._ready)

    def submit(self, token: Hashable, problem_id: str, completion: str, dispatch: bool = True,
               request: Optional[Request] = None) -> None:
        """Enqueue one completion; its Result comes out of :meth:`poll` as ``(token, Result)``.
        `request`: the feedback it should come with, and, with an environment, which turn of
        the episode it is (elastic/reward/request.py).
        With `dispatch` False it waits in the queue for :meth:`dispatch` or :meth:`poll` (a
        caller with several completions at hand enqueues them all first, so they can share
        batches)."""
        with self._lock:
            self._raise_if_broken()
            self.counts["submitted"] += 1
            if request is not None:
                self._requests[token] = request
            task = self.tasks.get(problem_id)
            if task is None:
                self.counts["immediate"] += 1
                self._deliver(token, Result(problem_id, "sandbox_error", self.settings.failure_reward,
                                            reason=f"unknown task id {problem_id!r}"))
                return
            history: Optional[Tuple[str, ...]] = None
            reset = False
            if self.spec.env:  # the environment's answer depends on the whole episode so far
                reset = request is not None and request.reset
                history = () if reset or request is None else request.history
                parts = ("env-reset",) if reset else ("env-step", str(len(history)),
                                                      *(_digest(c) for c in history + (completion,)))
                key = program_key(problem_id, *parts)
            else:
                ids = identities(task, completion, self.spec)
                if all(i is None for i in ids):  # nothing to evaluate (no code block, no answer)
                    self.counts["immediate"] += 1
                    self._deliver(token, empty_result(task, self.spec, self.settings))
                    return
                key = program_key(problem_id, *ids)
            lang = task.problem.language if task.problem is not None else ""
            dedup = self.section.dedup_window > 0
            if dedup and key in self._recent:
                self._recent.move_to_end(key)
                self.counts["dedup_hits"] += 1
                self._deliver(token, self._copy(self._recent[key]))
                return
            if dedup and key in self._jobs:
                self.counts["dedup_hits"] += 1
                self._jobs[key].tokens.append(token)
                return
            if not self._jobs:
                self._progress_t = time.monotonic()  # an idle pool starts its no-progress clock now
            if not dedup:
                key = f"{key}:{next(self._batch_ids)}"
            job = _Job(key, problem_id, completion, lang, [token], history=history, reset=reset)
            self._jobs[key] = job
            self._queue.append(job)
            if dispatch:
                self._dispatch()

    def dispatch(self) -> None:
        """Send queued work to free actors now."""
        with self._lock:
            self._raise_if_broken()
            self._dispatch()

    def poll(self, timeout_s: float) -> List[Tuple[Hashable, Result]]:
        """Dispatch queued work, wait up to `timeout_s` for any to finish, return what did.

        Raises :class:`RewardUnavailable` once the pool is gone for good.
        """
        with self._lock:
            self._raise_if_broken()
            self._dispatch()
            held = (self.section.batch_wait_s - (time.monotonic() - self._queue[0].queued_t)
                    if self._queue and self._hold() else 0.0)
            if self._ready or (not self._in_flight and held <= 0):
                return self._take_ready()
            nap = None if self._in_flight else min(timeout_s, held)
        if nap is not None:  # only a partial batch, held: no busy loop until it goes
            time.sleep(max(0.0, nap))
            return []
        with self._lock:
            if not self._in_flight:  # another poller collected them meanwhile
                return self._take_ready()
            refs = list(self._in_flight)
            now = time.monotonic()
            nearest = min(d for (_, _, _, d, _) in self._in_flight.values())
            wait_s = max(0.0, min(timeout_s, nearest - now, self._progress_t + self.section.unavailable_after_s - now))
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)  # unlocked: submitters go on meanwhile
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        with self._lock:
            for ref in ready:
                entry = self._in_flight.pop(ref, None)
                if entry is None:  # collected by another poller, or expired
                    continue
                jobs, slot, gen, _, many = entry
                self._load[slot] -= 1
                try:
                    got = ray.get(ref)
                except ray.exceptions.RayError as e:
                    text = str(e).strip()
                    why = f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"
                    self._replace(slot, gen, why)
                    for job in jobs:
                        self._infra_failure(job, slot, why)
                    continue
                rs = got if many else [got]
                if len(rs) != len(jobs):  # a bug, never a verdict: retried like a dead actor's
                    why = f"actor returned {len(rs)} results for {len(jobs)} items"
                    self._replace(slot, gen, why)
                    for job in jobs:
                        self._infra_failure(job, slot, why)
                    continue
                for job, r in zip(jobs, rs):
                    self._finish(job, r)
            now = time.monotonic()
            for ref, (jobs, slot, gen, deadline, _) in list(self._in_flight.items()):
                if now > deadline and ref in self._in_flight:
                    del self._in_flight[ref]
                    self._load[slot] -= 1
                    why = (f"item deadline {self.section.item_deadline_s:g}s exceeded" if len(jobs) == 1 else
                           f"batch deadline {self._deadline_s(len(jobs)):g}s exceeded ({len(jobs)} items)")
                    self._replace(slot, gen, why)
                    for job in jobs:
                        self._infra_failure(job, slot, why)
                    # the actor's other items fail with RayActorError and are retried too
            self._check_health(now)
            self._dispatch()
            return self._take_ready()

    def evaluate_batch(self, items: Sequence[Tuple]) -> List[Result]:
        """Results in the order of `items`, ``(task id, completion[, Request])`` each; every item
        gets one, whatever fails (unless the whole pool is gone: :class:`RewardUnavailable`)."""
        batch = next(self._batch_ids)
        results: List[Optional[Result]] = [None] * len(items)
        for i, (pid, completion, *request) in enumerate(items):
            self.submit(("batch", batch, i), pid, completion, dispatch=False, request=request[0] if request else None)
        self.flush()  # the caller waits for all of them
        left = len(items)
        while left:
            for token, r in self.poll(5.0):
                if isinstance(token, tuple) and len(token) == 3 and token[:2] == ("batch", batch):
                    results[token[2]] = r
                    left -= 1
        return results  # type: ignore[return-value]

    # -- bookkeeping (callers hold the lock) ---------------------------------------------------
    def flush(self) -> None:
        """Someone waits for results: send whatever is pending now, partial batches included
        (until the queue is empty; then batches are filled again)."""
        with self._lock:
            self._flushing = True
            self._raise_if_broken()
            self._dispatch()

    def _hold(self) -> bool:
        """Keep a partial batch queued: batching verifier, nobody waiting, fewer than a batch
        queued, and its oldest item younger than ``reward.batch_wait_s``."""
        if self.batch_size <= 1 or self._flushing or len(self._queue) >= self.batch_size:
            return False
        oldest = self._queue[0]
        return oldest.attempts == 0 and time.monotonic() - oldest.queued_t < self.section.batch_wait_s

    def _dispatch(self) -> None:
        # A batching verifier gets one call at a time per actor: the rest stays in this queue,
        # so whichever actor frees first takes the next share (a batch queued behind a busy
        # actor could not move to an idle one).
        batching = self.batch_size > 1
        cap = 1 if batching else self.section.max_in_flight_per_actor
        if not self._queue:
            self._flushing = False
        while self._queue:
            if self._hold():
                return
            free = [s for s in range(len(self.actors)) if self._load[s] < cap]
            if not free:
                return
            job = self._queue[0]
            other = [s for s in free if s != job.last_slot] or free  # retry elsewhere when possible
            slot = min(other, key=lambda s: self._load[s])
            # Flushing (or a batch's wait is over): what is pending, spread over the free
            # actors; else full batches. A retried item goes alone: a batch's failure must not
            # keep failing its neighbours. A batching pool spreads it over all its actors (a
            # busy one takes its share when it frees), but never in shares under MIN_SHARE: a
            # sandbox and interpreter start costs about as much as a few evaluations.
            if self.spec.env:  # an environment's turn is one call (its replay is the batch)
                want = 1
            elif batching:
                want = min(self.batch_size, max(MIN_SHARE, -(-len(self._queue) // len(self.actors))))
            else:
                want = -(-len(self._queue) // len(free))
            jobs = [self._queue.popleft()]
            while len(jobs) < want and job.attempts == 0 and self._queue and self._queue[0].attempts == 0:
                jobs.append(self._queue.popleft())
            n = len(jobs)
            if job.history is not None:  # rl.env (never batched)
                ref = self.actors[slot].env_turn.remote(self._task_ref(job.problem_id), job.history,
                                                        None if job.reset else job.completion)
            elif n == 1:
                ref = self.actors[slot].evaluate.remote(self._task_ref(job.problem_id), job.completion)
            else:
                ref = self.actors[slot].evaluate_many.remote([j.completion for j in jobs],
                                                             *[self._task_ref(j.problem_id) for j in jobs])
                self.counts["batches"] += 1
                self.counts["batched_items"] += n
            deadline = time.monotonic() + self._deadline_s(n)
            self._in_flight[ref] = (jobs, slot, self._gen[slot], deadline, n > 1)
            self._load[slot] += 1

    def _deadline_s(self, n: int) -> float:
        """An actor call's deadline: ``item_deadline_s`` per item, but a stuck batch is replaced
        within half of ``unavailable_after_s`` (before the pool would declare itself gone)."""
        sec = self.section
        return max(sec.item_deadline_s, min(sec.item_deadline_s * n, sec.unavailable_after_s / 2))

    def _infra_failure(self, job: _Job, slot: int, why: str) -> None:
        job.attempts += 1
        job.last_slot = slot
        self.counts["infra_failures"] += 1
        self._consecutive_failures += 1
        self._last_failure = why
        if job.attempts > self.section.max_retries:
            self.counts["sandbox_errors_after_retries"] += 1
            r = Result(job.problem_id, "sandbox_error", self.settings.failure_reward, attempts=job.attempts,
                       reason=f"infrastructure failure after {job.attempts} attempts: {why}", language=job.language)
            self._finish(job, r, from_actor=False)
        else:
            self.counts["retries"] += 1
            self._queue.appendleft(job)

    def _finish(self, job: _Job, r: Result, from_actor: bool = True) -> None:
        del self._jobs[job.key]
        if from_actor:
            r.attempts = job.attempts + 1
            now = time.monotonic()
            self.counts["evaluations"] += 1
            self._done_times.append(now)
            self._progress_t = now
            self._consecutive_failures = 0
            if self.section.dedup_window > 0 and r.status != "sandbox_error":  # never cache infrastructure
                self._recent[job.key] = r
                while len(self._recent) > self.section.dedup_window:
                    self._recent.popitem(last=False)
        for n, token in enumerate(job.tokens):
            self._deliver(token, r if n == 0 else self._copy(r))

    @staticmethod
    def _copy(r: Result) -> Result:
        c = copy.deepcopy(r)
        c.dedup = True
        return c

    def _deliver(self, token: Hashable, r: Result) -> None:
        request = self._requests.pop(token, None)
        if self.spec.env:  # the environment's message, cut to the caller's budget (a first message is not cut)
            if r.feedback is not None and request is not None and not request.reset:
                r = dataclasses.replace(r, feedback=cut_bytes(r.feedback, request.feedback_bytes, MARKER))
        elif request is not None and request.feedback:  # made per delivery: a cached result serves every mode
            r = dataclasses.replace(r, feedback=feedback_text(r, self.feedback_kind, request.feedback,
                                                              request.feedback_bytes, task=self.tasks.get(r.problem_id)))
        self.status_counts[r.status] += 1
        self._ready.append((token, r))

    def _take_ready(self) -> List[Tuple[Hashable, Result]]:
        out, self._ready = self._ready, []
        return out

    def _check_health(self, now: float) -> None:
        if self._broken:
            return
        if self._jobs and now - self._progress_t > self.section.unavailable_after_s:
            where = f"1 CPU and 0.01 {self.section.actor_resource!r}" if self.section.actor_resource else "1 CPU"
            self._broken = (f"reward pool unavailable: no evaluation completed in {now - self._progress_t:.0f} s "
                            f"(reward.unavailable_after_s={self.section.unavailable_after_s:g}) with "
                            f"{len(self._jobs)} programs waiting; {self.replaced} actors replaced (each needs "
                            f"{where}); last failure: {self._last_failure or 'none'}")
        elif self._consecutive_failures >= self.failure_limit:
            self._broken = (f"reward pool unavailable: {self._consecutive_failures} consecutive infrastructure "
                            f"failures with no evaluation completing; {self.replaced} actors replaced; last "
                            f"failure: {self._last_failure}")
        if self._broken:
            log.error("%s", self._broken)
            self._raise_if_broken()

    def _raise_if_broken(self) -> None:
        if self._broken:
            raise RewardUnavailable(self._broken)

    # -- observability -------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """Counters since start, plus the current queue and evals/s over the last minute."""
        with self._lock:
            now = time.monotonic()
            while self._done_times and now - self._done_times[0] > RATE_WINDOW_S:
                self._done_times.popleft()
            window = min(RATE_WINDOW_S, max(now - self._started, 1e-9))
            return {
                "evaluations": self.counts["evaluations"],
                "submitted": self.counts["submitted"],
                "dedup_hits": self.counts["dedup_hits"],
                "immediate": self.counts["immediate"],
                "retries": self.counts["retries"],
                "infra_failures": self.counts["infra_failures"],
                "sandbox_errors_after_retries": self.counts["sandbox_errors_after_retries"],
                "statuses": dict(self.status_counts),
                "replaced_actors": self.replaced,
                "evals_per_s": len(self._done_times) / window,
                "queue_length": len(self._queue),
                "in_flight": sum(len(jobs) for jobs, *_ in self._in_flight.values()),
                "batches": self.counts["batches"],
                "mean_batch": self.counts["batched_items"] / self.counts["batches"] if self.counts["batches"] else 0.0,
                "busy_actors": sum(1 for n in self._load if n > 0),
                "calls_per_actor": list(self._load),
                "actors": len(self.actors),
                "dedup_window_size": len(self._recent),
                "unavailable": self._broken or None,
            }

    def shutdown(self) -> None:
        with self._lock:
            for a in self.actors:
                try:
                    ray.kill(a)
                except Exception:
                    pass
            self.actors = []
