"""A user's reward function (``reward.function: "module:function"``), called in a child process
of a reward actor: never in the trainer, never in the actor's own interpreter.

Why a child: the function is the user's (trusted) code, but it runs on untrusted completions
and may raise, hang or crash. A hang is killed at ``reward.function_timeout_s`` and scored
``timeout``; an exception is scored ``runtime_error`` with its message kept; a crash of the
child (segfault, ``os._exit``) is scored ``runtime_error``. None of them stops the run. The
child is kept between calls (the module is imported once) and restarted after a kill or crash.

The function is called as ``fn(completion: str, task: dict) -> result`` where ``task`` holds
``id``, ``prompt``, ``answer`` and the task row's own ``fields``. Its result is one of:

* a bool: passed or not; reward 1.0 or ``reward.failure_reward``;
* a number: the reward; passed when it is >= ``reward.pass_threshold``;
* a dict with ``reward`` (number) and optionally ``passed`` (bool) and ``reason`` (str).

A non-finite reward or any other result type is scored ``runtime_error`` with a reason saying so.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing as mp
import os
import sys
import traceback
from typing import Any, Callable, Dict, Optional, Tuple

Outcome = Tuple[str, float, str]  # (status, reward, reason)


def resolve(spec: str) -> Callable:
    """Import ``module:function``; ValueError (one line naming reward.function) when it fails."""
    if ":" not in spec:
        raise ValueError(f"reward.function: {spec!r} is not 'module:function'")
    mod, _, name = spec.partition(":")
    try:
        m = importlib.import_module(mod)
    except Exception as e:
        raise ValueError(f"reward.function: cannot import {mod!r} ({type(e).__name__}: {e})") from None
    fn = getattr(m, name, None)
    if not callable(fn):
        raise ValueError(f"reward.function: {mod!r} has no function {name!r}")
    return fn


def interpret(value: Any, failure_reward: float, pass_threshold: float) -> Outcome:
    """The function's return value as (status, reward, reason)."""
    reason = ""
    passed: Optional[bool] = None
    if isinstance(value, bool):
        return ("ok", 1.0, "") if value else ("wrong_answer", failure_reward, "returned False")
    if isinstance(value, dict):
        if "reward" not in value:
            return "runtime_error", failure_reward, "returned a dict without 'reward'"
        reason = str(value.get("reason", ""))[:300]
        passed = value.get("passed")
        value = value["reward"]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "runtime_error", failure_reward, f"returned {type(value).__name__}, not a number, bool or dict"
    r = float(value)
    if not math.isfinite(r):
        return "runtime_error", failure_reward, f"returned a non-finite reward {r}"
    ok = bool(passed) if passed is not None else r >= pass_threshold
    return ("ok" if ok else "wrong_answer"), r, reason


def _serve(conn, target: Callable, call: Callable) -> None:
    """The child's loop: receive a message, answer ("value", call(target, *message)) or
    ("raised", one line naming the exception and where)."""
    conn.send(("ready", ""))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("value", call(target, *message)))
        except BaseException as e:  # noqa: BLE001 - the user's exception is the verdict
            tb = traceback.extract_tb(e.__traceback__)
            at = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            try:
                conn.send(("raised", f"{type(e).__name__}: {str(e)[:300]}{at}"))
            except Exception:  # an unpicklable exception message
                conn.send(("raised", f"{type(e).__name__}{at}"))


def serve_user_code(conn, spec: str, path: list, resolver: Callable[[str], Any], call: Callable) -> None:
    """A child process's body: the parent's sys.path first, `resolver(spec)` (one "fatal"
    message when it does not resolve), then `_serve` with `call`. Shared by the user's reward
    function (below) and environment class (user_env.py)."""
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        target = resolver(spec)
    except ValueError as e:
        conn.send(("fatal", str(e)))
        return
    _serve(conn, target, call)


def _child(conn, spec: str, path: list) -> None:
    serve_user_code(conn, spec, path, resolve, lambda f, completion, task: f(completion, task))


class ChildRunner:
    """One child process running the user's code (started by `child(conn, spec, sys.path)`);
    :meth:`ask` never raises for the user's sake (a raise, a hang or a crash is an answer); a
    broken spec raises ValueError at construction. `what` names the config key in messages."""

    what = "reward.function"

    def __init__(self, spec: str, timeout_s: float, child: Callable = _child) -> None:
        self.spec, self.timeout_s, self._target = spec, timeout_s, child
        self._proc: Optional[mp.process.BaseProcess] = None
        self._conn = None
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # no copy of the actor's threads or Ray state
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._target, args=(child, self.spec, list(sys.path)), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(60.0):
            self.close()
            raise ValueError(f"{self.what}: {self.spec} did not import within 60 s")
        kind, msg = parent.recv()
        if kind == "fatal":
            self.close()
            raise ValueError(msg)

    def ask(self, message: tuple, timeout_s: Optional[float] = None) -> Tuple[str, Any]:
        """Send one message; ("value", what the child's call returned) | ("raised", reason) |
        ("timeout", reason) (the child is killed) | ("crashed", reason) (restarted next time)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            self.close()
            self._start()
            self._conn.send(message)
        try:
            ready = self._conn.poll(timeout_s)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.close()
            return "timeout", f"{self.spec} did not return within {timeout_s:g} s"
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = None
            if self._proc is not None:
                self._proc.join(5)  # the pipe closes a moment before the exit status is known
                code = self._proc.exitcode
            self.close()
            return "crashed", f"{self.spec} crashed (exit code {code})"

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class FunctionRunner(ChildRunner):
    """The user's reward function in its child process: ``call`` gives an Outcome, whatever
    the function does."""

    def __init__(self, spec: str, timeout_s: float, failure_reward: float = 0.0, pass_threshold: float = 1.0) -> None:
        self.failure_reward, self.pass_threshold = failure_reward, pass_threshold
        super().__init__(spec, timeout_s)

    def call(self, completion: str, task: Dict[str, Any]) -> Outcome:
        kind, value = self.ask((completion, task))
        if kind == "timeout":
            return "timeout", self.failure_reward, value
        if kind in ("raised", "crashed"):
            return "runtime_error", self.failure_reward, value
        return interpret(value, self.failure_reward, self.pass_threshold)
