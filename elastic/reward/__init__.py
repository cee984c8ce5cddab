"""Reward service: sandboxed compile/test/benchmark of untrusted C/C++ programs.

Knows nothing of models or the trainer. Entry points: :func:`evaluate` (one program),
:class:`RewardPool` (a Ray actor pool), ``python -m elastic.reward`` (the CLI).
"""
