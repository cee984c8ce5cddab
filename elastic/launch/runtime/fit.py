"""Fit a GPU job to the cluster it finds: ask for no more GPU workers than there are GPUs.

The defaults ask for 2 workers (the CPU development setup: two gloo workers on one machine).
On a one-GPU machine that asked for 2 x {GPU: 1}, waited `scaling.resource_wait_s` and
stopped with "GPU 2 needed, the cluster has 1" (first H100 run). With `scaling.fit: auto`
(the default) a GPU run instead takes what the cluster has, min(GPUs, configured):

* a fixed-size run (min = max) becomes a fixed-size run at the largest world size W <= the
  GPU count that the config can split its batch over (the same checks as the config's own
  validation, so the global batch and data order are unchanged: only the per-worker share
  and gradient-accumulation count change, as in any elastic resize);
* an elastic run (min < max) keeps its max and lowers its min to such a W, so it starts now
  and grows when GPU nodes join.

`scaling.fit: strict` keeps the configured sizes (an autoscaling cluster that adds GPU nodes on
demand: the job waits for them). CPU runs are not changed: a private instance on the machine
already holds every worker (oversubscribed cores cost time, not correctness).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple

from elastic.config import Config, ConfigError
from elastic.config.load import validate


def _fits(cfg: Config, job: str, lo: int, hi: int) -> Optional[Config]:
    cand = replace(cfg, scaling=replace(cfg.scaling, min_workers=lo, max_workers=hi))
    try:
        validate(cand, job)
    except ConfigError:
        return None
    return cand


def fit_to_gpus(cfg: Config, gpus: float, job: str = "pretrain") -> Tuple[Config, Optional[str]]:
    """(the config to run, a console line saying what changed, or None when nothing did).

    `gpus`: the GPUs the cluster has in total (Ray's `cluster_resources()["GPU"]`)."""
    s = cfg.scaling
    have = int(gpus + 1e-9)
    if s.fit != "auto" or have < 1 or have >= s.min_workers:
        return cfg, None
    elastic = s.min_workers < s.max_workers
    for w in range(have, 0, -1):
        fitted = _fits(cfg, job, w, s.max_workers if elastic else w)
        if fitted is not None:
            sizes = f"{w}..{s.max_workers} workers (elastic: grows as GPUs join)" if elastic else f"{w} worker{'s' if w > 1 else ''}"
            return fitted, (f"[elastic] scaling: the cluster has {have} GPU{'s' if have > 1 else ''}; running {sizes} "
                            f"instead of scaling.min_workers={s.min_workers}, max_workers={s.max_workers} "
                            f"(global batch unchanged; scaling.fit=strict waits for {s.min_workers} GPUs)")
    return cfg, None
