"""A user's environment (``rl.env: "module:Class"``), stepped in a child process of a reward actor,
exactly like a user's reward function (elastic/reward/verifiers/user_function.py): never in the
trainer, never in the actor's own interpreter.

The class::

    class MyEnv:
        def reset(self, task: dict) -> str: ...            # the episode's first user message
        def step(self, completion: str) -> tuple: ...      # (feedback: str | None, reward: float, done: bool)

is constructed without arguments; ``task`` is what a reward function gets (``id``, ``prompt``,
``answer`` and the task row's ``fields``). After each answer the turn's reward is ``step``'s;
``feedback`` is the next user message; ``done`` (or no feedback: None or empty) ends the episode.
A turn counts as passed (pass rate, pass@t) when its reward >= ``reward.pass_threshold``.

**Stateless replay.** No environment object outlives a call. To score turn t the actor builds a
fresh one, calls ``reset(task)``, replays the episode's earlier answers with ``step`` (their
results are discarded) and steps the new answer. So any actor can score any turn: a retried
call after an actor died, a resized pool, a resumed run (nothing of an environment is in the
checkpoint) all get the same message and reward, and the pool's dedup window may answer an
identical (task, earlier answers, answer) once for all. The price is the contract and some
repeated work:

* **an environment must be deterministic given (task, answers)**: no clock, no unseeded random
  numbers, no state shared between instances (seed from ``task["id"]`` when it needs
  randomness). A replay that ends the episode early is reported as ``runtime_error``;
* turn t costs t ``step`` calls (k turns: k(k+1)/2 in all), cheap for the few turns an episode
  has; an environment whose step is expensive may memoize on (task id, answers) itself.

Why not keep one live environment per episode, as verl's interactions (``BaseInteraction``:
``start_interaction(instance_id)``, then ``generate_response(instance_id, messages)`` against
state kept by the one rollout worker) and TRL's environments (one stateful instance per
rollout, OpenEnv servers) do? Their episodes live and die with one process. Ours are scored by
an elastic pool whose actors are replaced when they die or stall, and a run must resume to the
same feedback after a stop or a resize: live state would pin an episode to one actor and be
lost with it. (verl, too, hands its interaction the whole message list at every turn.)

Failures are scored, never fatal: a raise (also in the constructor or ``reset``), a crash of
the child or a result of the wrong form is ``runtime_error``, a call not returned within its
time limit is ``timeout`` (the child is killed and restarted next time); the reward is
``reward.failure_reward`` and the episode ends. A failed ``reset`` has no message: the trainer
drops that episode (it is no verdict on the policy). Time limit: ``reward.function_timeout_s``
per environment call, so a replay of turn t gets t + 1 of them.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Dict, Optional, Sequence, Tuple

from elastic.reward.result import Result
from elastic.reward.verifiers.user_function import ChildRunner, serve_user_code

MESSAGE_BYTES = 65536  # an environment's message is cut here on the actor (the trainer cuts further)


def check_spec(spec: str) -> Tuple[str, str]:
    """(module, class) of ``module:Class``; ValueError (one line naming rl.env) when it is not
    of that form (the import is tried on the actors, where the module must be importable)."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod.strip() or not name.isidentifier() or not all(p.isidentifier() for p in mod.split(".")):
        raise ValueError(f"rl.env: {spec!r} is not 'module:Class' (e.g. 'my_envs:Counter')")
    return mod, name


def resolve_env(spec: str) -> type:
    """Import ``module:Class``; ValueError (one line naming rl.env) when it fails."""
    mod, name = check_spec(spec)
    try:
        m = importlib.import_module(mod)
    except Exception as e:
        raise ValueError(f"rl.env: cannot import {mod!r} ({type(e).__name__}: {e})") from None
    cls = getattr(m, name, None)
    if not isinstance(cls, type) or not callable(getattr(cls, "reset", None)) or not callable(getattr(cls, "step", None)):
        raise ValueError(f"rl.env: {mod!r} has no class {name!r} with reset(task) and step(completion)")
    return cls


class EnvError(Exception):
    """The environment broke its contract (a result of the wrong form, a replay that differs)."""


def _step_result(value: Any) -> Tuple[Optional[str], float, bool]:
    if not isinstance(value, tuple) or len(value) != 3:
        raise EnvError(f"step returned {type(value).__name__}, not a (feedback, reward, done) tuple")
    feedback, reward, done = value
    if feedback is not None and not isinstance(feedback, str):
        raise EnvError(f"step's feedback is {type(feedback).__name__}, not str or None")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise EnvError(f"step's reward {reward!r} is not a finite number")
    return feedback, float(reward), bool(done)


def replay(cls: type, task: Dict[str, Any], history: Sequence[str], completion: Optional[str]) -> Any:
    """On the child: a fresh environment, reset, the earlier answers replayed, then the new one
    stepped. Returns the first message (``completion`` None: a reset) or step's (feedback,
    reward, done). Raises whatever the environment raises, or EnvError."""
    env = cls()
    first = env.reset(task)
    if not isinstance(first, str) or not first.strip():
        raise EnvError(f"reset returned {type(first).__name__ if not isinstance(first, str) else 'an empty string'}, "
                       "not the first user message")
    if completion is None:
        return first
    for t, earlier in enumerate(history):
        _, _, done = _step_result(env.step(earlier))
        if done:
            raise EnvError(f"not deterministic: replaying answer {t + 1} ended the episode, which went on before")
    return _step_result(env.step(completion))


def _env_child(conn, spec: str, path: list) -> None:
    serve_user_code(conn, spec, path, resolve_env, replay)


class EnvRunner(ChildRunner):
    """The user's environment class in a child process (imported once, kept between calls)."""

    what = "rl.env"

    def __init__(self, spec: str, timeout_s: float) -> None:
        super().__init__(spec, timeout_s, child=_env_child)


def env_turn(runner: Optional[EnvRunner], task_id: str, payload: Dict[str, Any], history: Sequence[str],
             completion: Optional[str], failure_reward: float, pass_threshold: float,
             broken: str = "") -> Result:
    """One environment call on a reward actor as a Result: a reset (``completion`` None; the
    first message in ``feedback``, status ok) or a turn (``feedback`` the next message, None when
    the episode ends). `broken`: why the runner could not start (the class does not import on
    this actor): an infrastructure failure, ``sandbox_error``."""
    if runner is None:
        return Result(task_id, "sandbox_error", failure_reward, reason=broken or "rl.env: no environment")
    calls = 1 + len(history) + (completion is not None)
    kind, value = runner.ask((payload, tuple(history), completion), timeout_s=runner.timeout_s * calls)
    if kind == "timeout":
        return Result(task_id, "timeout", failure_reward, reason=f"rl.env: {value}")
    if kind in ("raised", "crashed"):
        return Result(task_id, "runtime_error", failure_reward, reason=f"rl.env: {value}"[:400])
    if completion is None:
        return Result(task_id, "ok", 0.0, feedback=_cut(value))
    feedback, reward, done = value
    status = "ok" if reward >= pass_threshold else "wrong_answer"
    return Result(task_id, status, reward, feedback=None if done or not feedback else _cut(feedback))


def _cut(text: str) -> str:
    from elastic.reward.feedback import cut_bytes

    return cut_bytes(text, MESSAGE_BYTES, "\n[truncated]")
