"""What fits: per-GPU memory of a training layout and the layouts that fit a machine.

    python -m elastic.plan --preset 8b --gpus 8 --gpu-gib 80

memory.py holds the memory model (plain arithmetic on a model shape, checked against what the
model saves for backward on CPU: tests/test_plan.py); __main__.py lists layouts.
"""

from elastic.plan.memory import SHAPES, Footprint, LayoutSpec, footprint, layouts_for  # noqa: F401
