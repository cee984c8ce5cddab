"""The `code_opt` verifier: a C/C++ program for a problem of datasets/code-opt is compiled, run on
the problem's tests and timed against the reference solution; the reward grows with the speedup.

    evaluator.py  evaluate(problem, source) -> Result: compile, test, time, score (the door)
    problems.py   a problem directory (datasets/README.md's format) read and checked
    timing.py     benchmark inputs, wall/instruction timing, the per-machine reference cache
    checkers.py   output comparison (the problem's `checker`)
    scoring.py    speedup -> reward
    extract.py    the program out of a model completion
"""
