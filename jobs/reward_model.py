"""Train a reward model on preference pairs, on Ray: `python jobs/reward_model.py [--config FILE] [--set key.sub=value ...]`.

Rows `prompt`, `chosen`, `rejected` (text or message lists; JSONL or Parquet; the `dpo` section's
field names, and `reward_model.margin_field` for a per-pair margin) train the starting policy's
backbone with a new scalar score head (`model.num_labels: 1`) to score chosen above rejected
(Bradley-Terry), on the same elastic FSDP2 trainer as every other job. With no --config it runs
jobs/configs/rm-math-tasks.yaml: the shipped arithmetic preference pairs (datasets/math-tasks),
from the math SFT policy (jobs/configs/sft-math-tasks.yaml, trained first when missing). Export with `jobs/export_hf.py` (a Hugging Face
*ForSequenceClassification directory); serve it to GRPO/PPO with `reward.kind: model`.
"""

from __future__ import annotations

import os
import sys
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jobs.post_training import main as post_training_main  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "rm-math-tasks.yaml")


def run(cfg):
    from elastic.launch.reward_model import run_reward_model

    return run_reward_model(cfg)


def summary(res) -> List[str]:
    """Loss and pairwise accuracy over the run; held-out accuracy first and last."""
    from elastic.records import METRICS, read_records

    recs = [r for r in read_records(os.path.join(res.records_dir or res.local_dir, METRICS)) if "step" in r]
    evals = [r for r in recs if "heldout_accuracy" in r]
    s = res.summary
    line = f"{res.done()}: loss {s.get('first_loss', float('nan')):.3f} -> {s.get('last_loss', float('nan')):.3f}"
    if recs and "accuracy" in recs[-1]:
        line += f", train accuracy {recs[0].get('accuracy', 0):.2f} -> {recs[-1]['accuracy']:.2f}"
    if evals:
        line += (f"; held-out accuracy {evals[0]['heldout_accuracy']:.2f} (step {evals[0]['step']}) -> "
                 f"{evals[-1]['heldout_accuracy']:.2f} (step {evals[-1]['step']}), score margin "
                 f"{evals[-1]['heldout_score_margin']:.3f} on {evals[-1]['heldout_pairs']} pairs")
    return [line]


def main(argv=None) -> int:
    return post_training_main(argv, job="reward_model", label="reward-model training", default_config=DEFAULT, doc=__doc__,
                              example="reward_model.center_rewards_coefficient=0.01", run=run, summary=summary)


if __name__ == "__main__":
    sys.exit(main())
