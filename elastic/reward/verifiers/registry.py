"""The verifier registry: how a completion of a task is scored, chosen by name in ``reward.kind``.

``reward.kind`` names one verifier or a weighted sum of several::

    python_tests                      # reward = python_tests' reward
    math_answer + 0.1*regex           # reward = 1.0 * math_answer + 0.1 * regex

Registered verifiers (each a small class; add one with ``@register``):

============== ===================================================== ==================
name           verdict                                                runs where
============== ===================================================== ==================
code_opt       compile, test and time C/C++ (reward by speed-up)      bubblewrap sandbox
python_tests   HumanEval ``check(candidate)`` / MBPP ``test_list``    bubblewrap sandbox
math_answer    final answer (``\\boxed{}``, ``####``, last number)     actor (pure)
exact_match    the completion equals the task's answer                actor (pure)
regex          the completion matches ``reward.pattern`` / the task's actor (pure)
function       a user's ``module:function`` (reward.function)        child process
============== ===================================================== ==================

Every verifier runs on the CPU reward pool's actors, never in the trainer. A combined verdict's
status is the first term's, except that any term's ``sandbox_error`` (infrastructure, never a
verdict on the program) makes the whole a ``sandbox_error``, which trainers drop; each term's
status, reward and reason are kept in ``Result.components``.

Dedup: a verifier names the part of a completion its verdict depends on (:meth:`Verifier.identity`:
the extracted program, the extracted answer...); the pool evaluates identical identities once.
``None`` means there is nothing to evaluate (no code block, no answer): the verdict is then
:meth:`Verifier.empty`, decided at once without an actor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from elastic.reward.result import Result
from elastic.reward.settings import EvalSettings
from elastic.reward.tasks import Task

VERIFIERS: Dict[str, "Verifier"] = {}


def register(cls):
    """Class decorator: make a verifier available to ``reward.kind`` under ``cls.name``."""
    VERIFIERS[cls.name] = cls()
    return cls


@dataclass(frozen=True)
class RewardSpec:
    """A parsed ``reward.kind`` plus the options its verifiers read."""

    terms: Tuple[Tuple[str, float], ...]
    pattern: str = ""
    function: str = ""
    function_timeout_s: float = 10.0
    pass_threshold: float = 1.0
    ignore_case: bool = False
    # rl.env: a user's environment "module:Class" (elastic/reward/verifiers/user_env.py) scores
    # every turn instead of the verifiers (reward.kind then scores nothing).
    env: str = ""

    @property
    def kinds(self) -> Tuple[str, ...]:
        return tuple(k for k, _ in self.terms)

    @property
    def text(self) -> str:
        return " + ".join(k if w == 1.0 else f"{w:g}*{k}" for k, w in self.terms)

    def needs(self) -> Tuple[str, ...]:
        """What every task must carry ("problem", "tests", "answer", "pattern")."""
        out: List[str] = []
        for k in self.kinds:
            for n in VERIFIERS[k].needs:
                if n == "pattern" and self.pattern:
                    continue  # one pattern for every task
                if n not in out:
                    out.append(n)
        return tuple(out)


_TERM = re.compile(r"^\s*(?:([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\*\s*)?([a-z_]+)\s*$")


def parse_kind(text: str) -> Tuple[Tuple[str, float], ...]:
    """``"a + 0.1*b"`` -> (("a", 1.0), ("b", 0.1)); ValueError (one line naming reward.kind)."""
    if not text or not text.strip():
        raise ValueError("reward.kind: empty (one of " + ", ".join(sorted(VERIFIERS)) + ")")
    terms: List[Tuple[str, float]] = []
    for part in text.split("+"):
        m = _TERM.match(part)
        if not m:
            raise ValueError(f"reward.kind: cannot read {part.strip()!r} in {text!r} (form: 'name' or '0.5*name', "
                             "terms joined by '+')")
        w = float(m.group(1)) if m.group(1) else 1.0
        name = m.group(2)
        if name not in VERIFIERS:
            raise ValueError(f"reward.kind: unknown verifier {name!r} (known: {', '.join(sorted(VERIFIERS))})")
        if not math.isfinite(w):
            raise ValueError(f"reward.kind: weight of {name!r} must be a finite number, got {w}")
        if name in dict(terms):
            raise ValueError(f"reward.kind: {name!r} appears twice in {text!r}")
        terms.append((name, w))
    if all(w == 0 for _, w in terms):
        raise ValueError(f"reward.kind: every weight in {text!r} is 0: nothing would be rewarded (a 0 weight keeps a "
                         "verifier for its verdict only; at least one term needs a non-zero weight)")
    return tuple(terms)


def spec_from_section(section, env: str = "") -> RewardSpec:
    """The :class:`RewardSpec` of a ``reward`` config section (and ``rl.env``); ValueError (one
    line) when the kind does not parse or an option a verifier needs is missing or broken."""
    spec = RewardSpec(parse_kind(section.kind), pattern=section.pattern, function=section.function,
                      function_timeout_s=section.function_timeout_s, pass_threshold=section.pass_threshold,
                      ignore_case=section.ignore_case, env=env)
    if env:
        from elastic.reward.verifiers.user_env import check_spec

        check_spec(env)
        return spec  # the environment scores: reward.kind's options are not used
    if "code_opt" in spec.kinds and len(spec.terms) > 1:
        raise ValueError("reward.kind: code_opt scores its own problems (rl.problems) and does not combine with "
                         "other verifiers")
    if spec.pattern:
        from elastic.reward.verifiers.text_match import compile_pattern

        compile_pattern(spec.pattern)  # ValueError naming the pattern
    if "function" in spec.kinds and not spec.function:
        raise ValueError("reward.function: reward.kind names 'function' but reward.function is empty "
                         "(set it to 'module:function')")
    return spec


class Env:
    """What verifiers use on an actor: settings, and (created on first use) the sandbox and the
    user function's child process, so verifiers that need neither never probe for them."""

    def __init__(self, settings: EvalSettings, spec: RewardSpec) -> None:
        self.settings, self.spec = settings, spec
        self._sandbox = None
        self._runner = None
        self._env_runner = None
        self._env_broken = ""

    @property
    def sandbox(self):
        if self._sandbox is None:
            from elastic.reward.verifiers.programs import default_sandbox

            self._sandbox = default_sandbox(self.settings.env_allow, self.settings.allow_weak_isolation)
        return self._sandbox

    @property
    def runner(self):
        if self._runner is None:
            from elastic.reward.verifiers.user_function import FunctionRunner

            self._runner = FunctionRunner(self.spec.function, self.spec.function_timeout_s,
                                          self.settings.failure_reward, self.spec.pass_threshold)
        return self._runner

    def start_env(self) -> None:
        """rl.env: start the environment's child (the class imported once) unless it runs. A
        reward actor calls it at construction, so the first turn it scores does not pay the
        child's start within its item deadline. A start that failed (the class does not import,
        or not within 60 s on a loaded node) is tried again at the next call, never cached."""
        from elastic.reward.verifiers.user_env import EnvRunner

        if self._env_runner is None:
            try:
                self._env_runner = EnvRunner(self.spec.env, self.spec.function_timeout_s)
                self._env_broken = ""
            except ValueError as e:
                self._env_broken = str(e)

    def env_turn(self, task: Task, history: Tuple[str, ...], completion: Optional[str]) -> Result:
        """rl.env: a reset (``completion`` None) or a turn of ``task``'s episode, as a Result
        (elastic/reward/verifiers/user_env.py). A child that cannot start (the class does not
        import here) makes the call a sandbox_error (infrastructure, dropped by the trainer)."""
        from elastic.reward.verifiers.user_env import env_turn

        self.start_env()
        return env_turn(self._env_runner, task.id, task_payload(task), history, completion,
                        self.settings.failure_reward, self.spec.pass_threshold, self._env_broken)


def task_payload(task: Task) -> Dict[str, Any]:
    """What a user's function or environment gets of a task (plain data)."""
    return {"id": task.id, "prompt": task.prompt, "answer": task.answer, "fields": task.fields}


class Verifier:
    name = ""
    needs: Tuple[str, ...] = ()

    def identity(self, task: Task, completion: str, spec: RewardSpec) -> Optional[str]:
        """What the verdict depends on (dedup key), or None when there is nothing to evaluate."""
        return completion

    def empty(self, task: Task, settings: EvalSettings) -> Result:
        return Result(task.id, "wrong_answer", settings.failure_reward, reason="empty completion")

    def evaluate(self, task: Task, completion: str, env: Env) -> Result:
        raise NotImplementedError

    # A verifier that scores several completions at once cheaper than one by one overrides
    # evaluate_many (same results, in order); the pool then sends it batches (reward.batch_size).
    batched = False

    def evaluate_many(self, items: List[Tuple[Task, str]], env: Env) -> List[Result]:
        out = []
        for task, completion in items:
            try:
                out.append(self.evaluate(task, completion, env))
            except Exception as e:  # as score(): a verifier bug is infrastructure, never a verdict
                out.append(Result(task.id, "sandbox_error", env.settings.failure_reward,
                                  reason=f"{self.name}: {type(e).__name__}: {e}"))
        return out


def _verdict(task: Task, passed: bool, reason: str, settings: EvalSettings) -> Result:
    return Result(task.id, "ok" if passed else "wrong_answer", 1.0 if passed else settings.failure_reward,
                  reason="" if passed else reason)


@register
class CodeOpt(Verifier):
    name = "code_opt"
    needs = ("problem",)

    def identity(self, task, completion, spec):
        from elastic.reward.verifiers.code_opt.extract import extract_code

        code = extract_code(completion, task.problem.language)
        return None if code is None else f"{code[0]}\0{code[1]}"

    def empty(self, task, settings):
        from elastic.reward.verifiers.code_opt.evaluator import no_code_result

        return no_code_result(task.id, settings)

    def evaluate(self, task, completion, env):
        from elastic.reward.verifiers.code_opt.evaluator import evaluate_completion

        return evaluate_completion(task.problem, completion, env.settings, env.sandbox)


@register
class PythonTestsVerifier(Verifier):
    name = "python_tests"
    needs = ("tests",)

    def identity(self, task, completion, spec):
        from elastic.reward.verifiers.python_tests.verifier import extract_program

        return extract_program(completion, task.tests)

    def empty(self, task, settings):
        return Result(task.id, "syntax_error", settings.failure_reward, reason="no Python code found", language="python")

    def evaluate(self, task, completion, env):
        from elastic.reward.verifiers.python_tests.verifier import evaluate_python

        return evaluate_python(task.id, task.tests, completion, env.settings, env.sandbox)

    batched = True  # one sandbox and one interpreter for a batch of programs (harness.py --batch)

    def evaluate_many(self, items, env):
        from elastic.reward.verifiers.python_tests.verifier import evaluate_python_batch

        return evaluate_python_batch([(t.id, t.tests, c) for t, c in items], env.settings, env.sandbox)


@register
class MathAnswer(Verifier):
    name = "math_answer"
    needs = ("answer",)

    def identity(self, task, completion, spec):
        from elastic.reward.verifiers.math_answer import extract_answer

        return extract_answer(completion)

    def empty(self, task, settings):
        return Result(task.id, "wrong_answer", settings.failure_reward, reason="no final answer found")

    def evaluate(self, task, completion, env):
        from elastic.reward.verifiers.math_answer import score_math

        passed, reason = score_math(completion, task.answer)
        return _verdict(task, passed, reason, env.settings)


@register
class ExactMatch(Verifier):
    name = "exact_match"
    needs = ("answer",)

    def identity(self, task, completion, spec):
        return " ".join(completion.split()) or None  # exact_match's own whitespace normalisation

    def evaluate(self, task, completion, env):
        from elastic.reward.verifiers.text_match import exact_match

        passed, reason = exact_match(completion, task.answer, ignore_case=env.spec.ignore_case)
        return _verdict(task, passed, reason, env.settings)


@register
class Regex(Verifier):
    name = "regex"
    needs = ("pattern",)

    def evaluate(self, task, completion, env):
        from elastic.reward.verifiers.text_match import regex_match

        try:
            passed, reason = regex_match(completion, task.pattern or env.spec.pattern)
        except ValueError as e:  # a task's own broken pattern: the task's fault, not the program's
            return Result(task.id, "sandbox_error", env.settings.failure_reward, reason=str(e))
        return _verdict(task, passed, reason, env.settings)


@register
class Function(Verifier):
    name = "function"

    def identity(self, task, completion, spec):
        return completion

    def evaluate(self, task, completion, env):
        try:
            status, reward, reason = env.runner.call(completion, task_payload(task))
        except ValueError as e:  # the function cannot even be imported on this actor
            return Result(task.id, "sandbox_error", env.settings.failure_reward, reason=str(e))
        return Result(task.id, status, reward, reason=reason)


def identities(task: Task, completion: str, spec: RewardSpec) -> Tuple[Optional[str], ...]:
    return tuple(VERIFIERS[k].identity(task, completion, spec) for k in spec.kinds)


@register
class ModelTerm(Verifier):
    """`model`: a trained reward model's score (elastic/launch/reward_model_service.py). The pool
    never sees a model: this term is ok with reward 0 here, and the trainer adds weight x score
    from the reward-model service to the combined reward."""

    name = "model"

    def identity(self, task, completion, spec):
        return "model"  # the pool's part of the verdict does not depend on the text

    def empty(self, task, settings):
        return Result(task.id, "ok", 0.0, reason="")

    def evaluate(self, task, completion, env):
        return Result(task.id, "ok", 0.0, reason="")


def combine(task: Task, parts: List[Tuple[str, float, Result]]) -> Result:
    """One Result from each term's (kind, weight, Result); see the module docstring."""
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][2]
    # The verdict (status, reason, speed-up) is the first verifier's; the `model` term has none
    # (a weight of 0 keeps a verifier for its verdict alone: pass rate and pass@k, no reward).
    first = next((r for k, _, r in parts if k != "model"), parts[0][2])
    infra = [r for _, _, r in parts if r.status == "sandbox_error"]
    out = Result(task.id, "sandbox_error" if infra else first.status, sum(w * r.reward for _, w, r in parts),
                 reason=(infra[0].reason if infra else first.reason), speedup=first.speedup, language=first.language,
                 tests=first.tests, timing=first.timing, compile_output=first.compile_output, sandbox=first.sandbox)
    out.components = [{"kind": k, "weight": w, "status": r.status, "reward": r.reward, "reason": r.reason[:300]}
                      for k, w, r in parts]
    return out


def empty_result(task: Task, spec: RewardSpec, settings: EvalSettings) -> Result:
    """The verdict when no term has anything to evaluate (decided without an actor)."""
    return combine(task, [(k, w, VERIFIERS[k].empty(task, settings)) for k, w in spec.terms])


def batched(spec: RewardSpec) -> bool:
    """Whether some term of `spec` scores a batch cheaper than its items one by one."""
    return any(VERIFIERS[k].batched for k in spec.kinds)


def score_many(items: List[Tuple[Task, str]], spec: RewardSpec, env: Env) -> List[Result]:
    """:func:`score` of each (task, completion), in order, each term's verdicts computed for
    the whole batch at once (:meth:`Verifier.evaluate_many`)."""
    import time

    t0 = time.perf_counter()
    ids = [identities(task, completion, spec) for task, completion in items]
    parts: List[List[Tuple[str, float, Result]]] = [[] for _ in items]
    for j, (k, w) in enumerate(spec.terms):
        v = VERIFIERS[k]
        todo = [n for n in range(len(items)) if ids[n][j] is not None]
        got: Dict[int, Result] = {}
        if todo:
            try:
                rs = v.evaluate_many([items[n] for n in todo], env)
                if len(rs) != len(todo):
                    raise RuntimeError(f"{len(rs)} results for {len(todo)} items")
                got = dict(zip(todo, rs))
            except Exception as e:  # a verifier bug is infrastructure, never a verdict
                got = {n: Result(items[n][0].id, "sandbox_error", env.settings.failure_reward,
                                 reason=f"{k}: {type(e).__name__}: {e}") for n in todo}
        for n, (task, _) in enumerate(items):
            parts[n].append((k, w, got[n] if n in got else v.empty(task, env.settings)))
    share = (time.perf_counter() - t0) / max(1, len(items))
    out = []
    for (task, _), p in zip(items, parts):
        r = combine(task, p)
        if not r.duration_s:
            r.duration_s = share
        out.append(r)
    return out


def score(task: Task, completion: str, spec: RewardSpec, env: Env,
          ids: Optional[Tuple[Optional[str], ...]] = None) -> Result:
    """Score one completion with every term of `spec` (on a reward actor)."""
    import time

    t0 = time.perf_counter()
    ids = ids if ids is not None else identities(task, completion, spec)
    parts = []
    for (k, w), ident in zip(spec.terms, ids):
        v = VERIFIERS[k]
        if ident is None:
            r = v.empty(task, env.settings)
        else:
            try:
                r = v.evaluate(task, completion, env)
            except Exception as e:  # a verifier bug is infrastructure, never a verdict
                r = Result(task.id, "sandbox_error", env.settings.failure_reward, reason=f"{k}: {type(e).__name__}: {e}")
        parts.append((k, w, r))
    out = combine(task, parts)
    if not out.duration_s:
        out.duration_s = time.perf_counter() - t0
    return out
