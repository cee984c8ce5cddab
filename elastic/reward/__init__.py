"""Reward service: sandboxed compile/test/benchmark of untrusted C/C++ programs.

Knows nothing of models or the trainer. Entry points: :func:`evaluate` (one program),
:class:`RewardPool` (a Ray actor pool), ``python -m elastic.reward`` (the CLI).
"""

from elastic.reward.evaluator import evaluate, evaluate_completion
from elastic.reward.extract import extract_code
from elastic.reward.problems import Problem, ProblemError, load_problem, load_problems
from elastic.reward.result import STATUSES, Result, TestResult, Timing
from elastic.reward.scoring import speedup_reward
from elastic.reward.settings import EvalSettings


def __getattr__(name: str):
    if name == "RewardPool":  # imports ray only when the pool is used
        from elastic.reward.pool import RewardPool
        return RewardPool
    raise AttributeError(name)


__all__ = ["STATUSES", "EvalSettings", "Problem", "ProblemError", "Result", "RewardPool", "TestResult", "Timing",
           "evaluate", "evaluate_completion", "extract_code", "load_problem", "load_problems", "speedup_reward"]
