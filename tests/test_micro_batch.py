"""Micro-batch sizes are upper bounds (elastic/config/micro_batch.py): a setting larger than a
worker's share, or one that does not divide it, is fitted per world size instead of refused.
The real run that prints the fitted size once is in tests/test_step_breakdown.py."""

from __future__ import annotations

import pytest

from elastic.config import load_config
from elastic.config.micro_batch import fit_micro_batches, fitted_micro_batch


@pytest.mark.parametrize("share, setting, used", [
    (8, 16, 8),    # 4 prompts x 4 samples on 2 workers, rl.micro_batch_size 16: one micro-batch
    (8, 8, 8), (8, 3, 2), (12, 8, 6), (12, 5, 4), (7, 4, 1), (1, 16, 1), (48, 16, 16),
])
def test_the_largest_size_up_to_the_setting_that_divides_the_share(share, setting, used):
    assert fitted_micro_batch(share, setting) == used


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        fitted_micro_batch(0, 4)
    with pytest.raises(ValueError):
        fitted_micro_batch(4, 0)


def test_the_issues_example_is_accepted_and_fitted_per_world_size():
    """The shipped graded-python GRPO config (rl.micro_batch_size 16) with 4 prompts x 4 samples
    on the command line used to stop with 'cannot be split over 2 workers into micro-batches of
    16'; it runs one micro-batch of 8 per worker, and the config file keeps the user's 16."""
    ov = ["rl.prompts_per_step=4", "rl.group_size=4", "scaling.min_workers=1", "scaling.max_workers=2"]
    cfg = load_config("jobs/configs/grpo-graded-python.yaml", ov, job="grpo")
    assert cfg.rl.micro_batch_size == 16
    for world, used in ((2, 8), (1, 16)):
        c = load_config("jobs/configs/grpo-graded-python.yaml", ov, job="grpo")
        got = fit_micro_batches(c, world, ("rl.micro_batch_size",))
        assert [(f.key, f.setting, f.share, f.used) for f in got] == [("rl.micro_batch_size", 16, 16 // world, used)]
        assert c.rl.micro_batch_size == used
    # train.micro_batch_size the same way, for pretrain/SFT/DPO: 16 sequences over 2 workers
    c = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=64"])
    got = fit_micro_batches(c, 2, ("train.micro_batch_size",))
    assert [(f.setting, f.share, f.used) for f in got] == [(64, 8, 8)] and c.train.micro_batch_size == 8
    assert "is an upper bound: 8 rows per micro-batch" in got[0].describe("rows")


def test_only_the_jobs_own_keys_are_fitted():
    c = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=64", "rl.micro_batch_size=64"])
    got = fit_micro_batches(c, 2, ("train.micro_batch_size",))
    assert [f.key for f in got] == ["train.micro_batch_size"] and c.rl.micro_batch_size == 64
