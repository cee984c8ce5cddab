"""Small shared helpers for tests (corpus generation, reading run outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np

from elastic.report.recovery import read_jsonl  # noqa: F401  (re-exported for tests)

WORDS = ["alpha", "beta", "gamma", "delta", "elastic", "ray", "torch", "shard", "\n", "def", "(", ")", "return", "x", "=", "1"]


def make_text_corpus(d: Path, n_docs: int = 60, seed: int = 0, max_words: int = 300) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n_docs):
        n = int(rng.integers(5, max_words))
        (d / f"doc{i:04d}.txt").write_text(" ".join(rng.choice(WORDS, size=n)))
    return d


def ledger_by_step(path) -> dict:
    """step -> the global batch's sample ids (ranks in order), from a run's ledger.jsonl."""
    by: dict = {}
    for r in read_jsonl(path):
        by.setdefault(r["step"], {})[r["rank"]] = r["sample_ids"]
    return {s: sum((v[k] for k in sorted(v)), []) for s, v in by.items()}


def small_run_overrides(storage: Path, name: str, corpus: Path, steps: int, **extra) -> List[str]:
    """A run small enough for a 2-core CI machine: 2 workers, tiny model, seq 64, batch 8."""
    o = {
        "run.storage_path": str(storage), "run.name": name, "data.source": str(corpus), "data.glob": "**/*.txt",
        "data.vocab_size": 300, "data.seq_len": 64, "data.shard_mb": 0.004, "data.ledger": "true",
        "model.dim": 64, "model.n_layers": 2, "model.n_heads": 4, "model.n_kv_heads": 2, "model.ffn_hidden": 128,
        "train.steps": steps, "train.global_batch_size": 8, "train.micro_batch_size": 2, "train.warmup_steps": 2,
        "train.lr": 0.01, "train.log_every": 1, "checkpoint.every_steps": 2, "wandb.mode": "disabled",
        "scaling.min_workers": 2, "scaling.max_workers": 2,
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def open_store(plan, cache_root, name: str = "train", build_ahead: int = 2, task_env=None, plans=None):
    """A store builder actor for `plan` (on the running Ray cluster) and a stream over it."""
    from elastic.data.builder import start_builder
    from elastic.data.reader import SampleStream

    builder = start_builder(plans or {name: plan}, str(cache_root), build_ahead, task_env=task_env)
    return builder, SampleStream(plan, name, builder, str(cache_root))


def whole_epoch(stream):
    """Every sample of epoch 0, in stream order."""
    from elastic.data.reader import first_samples

    return first_samples(stream, 1 << 40)
