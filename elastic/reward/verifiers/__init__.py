"""Verifiers: how a completion of a task is scored, one module or subpackage per verifier.

    registry.py       the door: `reward.kind` names -> Verifier classes, weighted sums of terms,
                      `score(task, completion, spec, env)`
    programs.py       compile and run a program in the sandbox, classify the outcome (shared by
                      the code verifiers), the process's default sandbox
    code_opt/         C/C++ optimisation problems: compile, test, time, speedup reward
    python_tests/     Python programs against a task's unit tests (verifier.py; harness.py runs
                      inside the sandbox)
    math_answer.py    final-answer extraction and equivalence for math
    text_match.py     exact match and regular expressions
    user_function.py  a user's `module:function`, called in a child process

A new verifier: a module (or subpackage) here with the checking function, and a `Verifier`
subclass registered in registry.py under its `reward.kind` name. Verifiers run untrusted code only
through elastic/sandbox, and know nothing of models or Ray.
"""
