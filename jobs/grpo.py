"""GRPO on Ray: `python jobs/grpo.py [--config FILE] [--set key.sub=value ...]`.

The policy writes C/C++ for the shipped code-optimisation problems, the sandboxed reward service
(a Ray actor pool on CPU workers) compiles, tests and times it, and the policy learns from the
group-normalised rewards. With no --config it runs the embedded default,
jobs/configs/grpo-code-opt.yaml, starting from the default SFT run's last checkpoint
(jobs/configs/sft-code-opt.yaml), which it trains first when it is not there yet. Works locally
and unchanged under `ray job submit`.
"""

from __future__ import annotations

import os
import sys
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jobs.post_training import main as post_training_main  # noqa: E402

DEFAULT = os.path.join(HERE, "configs", "grpo-code-opt.yaml")


def run(cfg):
    from elastic.launch.grpo import run_grpo

    return run_grpo(cfg)


def summary(res) -> List[str]:
    """Reward and pass rate, first against last steps; where every completion is."""
    lines = []
    r = res.summary.get("reward") or {}
    if r:
        lines.append(f"{res.done()}: mean reward {r['first']:.3f} -> {r['last']:.3f}, pass rate "
                     f"{r['first_pass']:.0%} -> {r['last_pass']:.0%} (means of the first and last {r['window']} steps)")
    for name, h in sorted((res.summary.get("heldout") or {}).items()):
        k = name[len("pass_at_"):]
        before = f"{h['initial']:.0%} (starting policy) -> " if "initial" in h else ""
        if "last" in h:
            lines.append(f"[elastic] held-out pass@{k}: {before}{h['last']:.0%} (step {h['step']}); "
                         "pass@k = mean over tasks of 1 - C(n-c,k)/C(n,k), n samples, c passing")
    lines.append(f"[elastic] rollouts:    {os.path.join(res.records_dir or res.local_dir, 'rollouts.jsonl')} (every completion and its verdict)")
    if res.summary.get("heldout"):
        lines.append(f"[elastic] held-out:    {os.path.join(res.records_dir or res.local_dir, 'eval_verdicts.jsonl')} (every evaluated completion and its verdict)")
    return lines


def main(argv=None) -> int:
    return post_training_main(argv, job="grpo", label="GRPO", default_config=DEFAULT, doc=__doc__,
                              example="rl.group_size=8", run=run, summary=summary)


if __name__ == "__main__":
    sys.exit(main())
