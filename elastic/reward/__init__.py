"""Rewards: verifiers that score completions (elastic/reward/verifiers), and the Ray actor pool
and named service that run them for a whole training run. Untrusted code runs only inside
elastic/sandbox. Knows nothing of models or the trainer.

    result.py    the structured outcome of one evaluation (Result)
    settings.py  evaluation knobs from the `reward` config section (EvalSettings)
    tasks.py     RL tasks: the prompt and what the verifiers check, read from task files
    verifiers/   the verifier registry and one module or subpackage per verifier
    pool.py      RewardPool: Ray actors serving evaluations (streaming, deduplicated, retried)
    service.py   the run's one shared reward service, a named actor owning the pool

Entry points: :func:`evaluate` (one C/C++ program), :func:`evaluate_python`, :class:`RewardPool`,
:func:`start_service` / :func:`connect`, ``python -m elastic.reward`` (the CLI).
"""

from elastic.reward.result import STATUSES, Result, TestResult, Timing
from elastic.reward.settings import EvalSettings
from elastic.reward.verifiers.code_opt.evaluator import evaluate, evaluate_completion
from elastic.reward.verifiers.code_opt.extract import extract_code
from elastic.reward.verifiers.code_opt.problems import Problem, ProblemError, load_problem, load_problems
from elastic.reward.verifiers.code_opt.scoring import speedup_reward
from elastic.reward.verifiers.python_tests.verifier import PythonTests, check_tests, evaluate_python, extract_program
from elastic.sandbox.isolation import SandboxUnavailable


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
