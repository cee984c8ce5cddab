"""The structured outcome of one evaluation (a plain dataclass; ``to_dict`` for JSON/logs).

Statuses, in the order an evaluation can fail:

* ``compile_error``: no code block, or the compiler failed / timed out / ran out of memory;
* ``syntax_error`` (python_tests): no Python code found, or the program does not parse;
* ``runtime_error``: non-zero exit, a signal, the output cap or the file-size cap hit;
  python_tests: an exception while loading the program or raised by the program's code in a
  test, or the program's process ended before the harness reported every test;
* ``timeout``: wall clock or CPU limit exceeded (on a test or on the benchmark input);
* ``memory_limit``: evidence of the memory limit (see evaluator.classify);
* ``wrong_answer``: the checker rejected the output of a test or of the benchmark input;
  python_tests: a test's assertion failed, a value the program returned was not plain
  builtin data, or the test could not use the returned value;
* ``sandbox_error``: the *infrastructure* failed (sandbox could not start, actor/node died,
  deadline of the pool breached, broken problem); never a verdict on the program, so
  trainers should drop, not penalise, such samples;
* ``ok``: every test passed and the program was timed (python_tests: the harness reported
  every test as run and passed; nothing is timed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

STATUSES = ("ok", "compile_error", "syntax_error", "wrong_answer", "runtime_error", "timeout", "memory_limit",
            "sandbox_error")


@dataclass
class TestResult:
    name: str
    status: str  # a STATUSES value, or "skipped" after an earlier failure
    wall_s: float = 0.0
    detail: str = ""
    # The head of what the program printed on a test the checker rejected (code_opt's
    # wrong_answer: at most OUTPUT_HEAD bytes of its stdout, decoded with replacement), for the
    # policy's feedback (elastic/reward/feedback.py); empty otherwise. Never part of the reward.
    output: str = ""


OUTPUT_HEAD = 512


@dataclass
class Timing:
    """Benchmark-input measurement. Unit is seconds (wall) or instructions."""

    mode: str
    unit: str
    candidate: float
    reference: float
    candidate_runs: List[float] = field(default_factory=list)
    reference_runs: List[float] = field(default_factory=list)
    tool: str = ""  # "wall", "perf" or "valgrind"
    reference_cached: bool = False


@dataclass
class Result:
    problem_id: str
    status: str
    reward: float
    reason: str = ""
    speedup: Optional[float] = None
    language: str = ""
    tests: List[TestResult] = field(default_factory=list)
    timing: Optional[Timing] = None
    compile_output: str = ""
    duration_s: float = 0.0
    attempts: int = 1
    sandbox: Dict[str, Any] = field(default_factory=dict)  # active isolation layers
    # True when this is a copy of an identical program's evaluation (the pool's dedup window),
    # so its timing was measured once for all copies.
    dedup: bool = False
    # A weighted sum of verifiers (reward.kind "a + 0.1*b"): each term's kind, weight, status,
    # reward and reason (elastic/reward/verifiers/registry.py); empty for a single verifier.
    components: List[Dict[str, Any]] = field(default_factory=list)
    # Multi-turn RL (issue 44): the next user message, made by the pool where the task is at
    # hand (elastic/reward/request.py): the verifier's feedback for the request's rl.feedback
    # mode (elastic/reward/feedback.py), or a user environment's message (rl.env; for a reset,
    # the first user message). None: no message (passed, done, or not asked for).
    feedback: Optional[str] = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Result":
        d = dict(d)
        d["tests"] = [TestResult(**t) for t in d.get("tests", [])]
        if d.get("timing") is not None:
            d["timing"] = Timing(**d["timing"])
        return cls(**d)
