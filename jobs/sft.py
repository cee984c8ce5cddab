"""Supervised fine-tuning on Ray: `python jobs/sft.py [--config FILE] [--set key.sub=value ...]`.

The same trainer as pretraining (Ray Data → Ray Train, FSDP2, elastic, exact resume), on
conversation rows (`prompt`/`completion` or `messages`, JSONL or Parquet) with the loss on the
assistant's tokens only. With no --config it runs the embedded default,
jobs/configs/sft-code-opt.yaml: the `tiny` model learns the shipped code-optimisation problems'
solutions (statement → reference and fast program), the starting point of jobs/grpo.py.
Start from a pretrained model with `--set model.init_from=<HF dir or run/step_N>`.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jobs.pretrain import main as lm_main  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "sft-code-opt.yaml")


def main(argv=None) -> int:
    return lm_main(argv, kind="sft", default_config=DEFAULT, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
