"""Direct preference optimisation on Ray: `python jobs/dpo.py [--config FILE] [--set key.sub=value ...]`.

Rows `prompt`, `chosen`, `rejected` (text or message lists; JSONL or Parquet) train the policy
to prefer the chosen answers relative to a frozen reference (the starting policy), on the same
elastic FSDP2 trainer as pretraining, SFT and GRPO. With no --config it runs the embedded
default, jobs/configs/dpo-code-opt.yaml: pairs from the shipped code-optimisation problems
(chosen = the fast solution, rejected = the wrong one and the slow reference), starting from
the default SFT run's last checkpoint (jobs/configs/sft-code-opt.yaml), which it trains first
when it is not there yet. `--set model.lora.rank=8` trains LoRA adapters instead of all weights.
Works locally and unchanged under `ray job submit`.
"""

from __future__ import annotations

import os
import sys
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jobs.post_training import main as post_training_main  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "dpo-code-opt.yaml")


def run(cfg):
    from elastic.launch.dpo import run_dpo

    return run_dpo(cfg)


def summary(res) -> List[str]:
    """Loss and margin over the run; held-out preference accuracy first and last."""
    from elastic.records import METRICS, read_records

    recs = [r for r in read_records(os.path.join(res.records_dir or res.local_dir, METRICS)) if "step" in r]
    evals = [r for r in recs if "heldout_accuracy" in r]
    s = res.summary
    line = f"{res.done()}: loss {s.get('first_loss', float('nan')):.3f} -> {s.get('last_loss', float('nan')):.3f}"
    if recs and "reward_margin" in recs[-1]:
        line += f", margin {recs[0].get('reward_margin', 0):.3f} -> {recs[-1]['reward_margin']:.3f}"
    if evals:
        line += (f"; held-out accuracy {evals[0]['heldout_accuracy']:.2f} (step {evals[0]['step']}) -> "
                 f"{evals[-1]['heldout_accuracy']:.2f} (step {evals[-1]['step']}), margin {evals[-1]['heldout_reward_margin']:.3f} "
                 f"on {evals[-1]['heldout_pairs']} pairs")
    return [line]


def main(argv=None) -> int:
    return post_training_main(argv, job="dpo", label="DPO", default_config=DEFAULT, doc=__doc__,
                              example="dpo.beta=0.2", run=run, summary=summary)


if __name__ == "__main__":
    sys.exit(main())
