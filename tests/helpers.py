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


def start_job(script: str, overrides: List[str], log: Path):
    """`jobs/<script>` with these overrides in a subprocess that starts its own private Ray
    instance (RAY_ADDRESS=local), on the schema's defaults (an empty --config: exactly what
    `load_config(None, overrides)` gives in-process). A run launched this way can train beside
    one that runs in the test process on the session's cluster: two independent runs overlap
    instead of queueing for the same 4 logical CPUs."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    empty = log.with_suffix(".defaults.yaml")
    empty.write_text("{}\n")
    args = [sys.executable, str(repo / "jobs" / script), "--config", str(empty)]
    for o in overrides:
        args += ["--set", o]
    env = {**os.environ, "RAY_ADDRESS": "local", "WANDB_MODE": "disabled"}
    with open(log, "w") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=repo, start_new_session=True)


def finish_job(proc, log: Path, timeout: float = 600) -> None:
    """Wait for a job from start_job to succeed; kill its whole process tree if it is still
    running when the test leaves (its private Ray instance with it)."""
    import os
    import signal

    import psutil

    try:
        assert proc.wait(timeout=timeout) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            for pid in [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
