"""The `python_tests` verifier: a Python program run against a task's unit tests in the sandbox.

    verifier.py  the door: PythonTests (a task's tests), evaluate_python, extract_program
    harness.py   the trusted harness run inside the sandbox as `python3 -I -S -B harness.py`
"""
