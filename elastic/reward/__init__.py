"""Reward service: sandboxed compile/test/benchmark of untrusted C/C++ programs, and
sandboxed test runs of Python programs (:mod:`elastic.reward.python_tests`).

Knows nothing of models or the trainer. Entry points: :func:`evaluate` (one program),
:class:`RewardPool` (a Ray actor pool), :func:`start_service` / :func:`connect` (the run's one
shared reward service, a named actor owning the pool), ``python -m elastic.reward`` (the CLI).
"""

from elastic.reward.evaluator import evaluate, evaluate_completion
from elastic.reward.extract import extract_code
from elastic.reward.isolation import SandboxUnavailable
from elastic.reward.problems import Problem, ProblemError, load_problem, load_problems
from elastic.reward.python_tests import PythonTests, check_tests, evaluate_python, extract_program
from elastic.reward.result import STATUSES, Result, TestResult, Timing
from elastic.reward.scoring import speedup_reward
from elastic.reward.settings import EvalSettings


_LAZY = {"RewardPool": "pool", "RewardUnavailable": "pool", "RewardClient": "service",
         "RewardServiceError": "service", "start_service": "service", "connect": "service"}


def __getattr__(name: str):
    if name in _LAZY:  # imports ray only when the pool or the service is used
        import importlib

        return getattr(importlib.import_module(f"elastic.reward.{_LAZY[name]}"), name)
    raise AttributeError(name)


__all__ = ["STATUSES", "EvalSettings", "Problem", "ProblemError", "PythonTests", "Result", "RewardClient",
           "RewardPool", "RewardServiceError", "RewardUnavailable", "SandboxUnavailable", "TestResult", "Timing",
           "check_tests", "connect", "evaluate", "evaluate_completion", "evaluate_python", "extract_code",
           "extract_program", "load_problem", "load_problems", "speedup_reward", "start_service"]
