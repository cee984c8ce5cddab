"""`dpo.reference: precomputed`: the reference log-probabilities of every pair, computed once
before training with Ray Data and stored with the run (`<run>/dpo/reference_logps.parquet`).

The reference is frozen, so Σ log π_ref(answer | prompt) of each pair never changes: computing
it once saves the workers a second model (or, under LoRA, a second forward) on every step. A
pool of Ray Data actors each loads the starting policy (`model.init_from`) in one process
(elastic/model/hf.py `from_pretrained`) and scores batches of pairs; the table keeps each
pair's split, index, chosen and rejected log-probability. Its Parquet metadata records the pairs'
token digest and the base's content hash; a relaunch reuses the table when both match, and
recomputes it otherwise (e.g. the data or the starting policy changed).

Values match the in-loop reference to float32 rounding (same model, same dtype on CPU; the
padding of a batch differs, which changes the order of a few reductions).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import numpy as np

from elastic.config import Config
from elastic.data.preference import PairSet

TABLE = os.path.join("dpo", "reference_logps.parquet")
META_KEY = b"elastic_dpo_reference"


class PairScorer:
    """Ray Data actor: Σ log π_ref over each answer of a batch of (split, index) pairs."""

    def __init__(self, model_path: str, seq_len: int, attention: str, pairs, micro: int, num_threads: int = 1):
        import ray
        import torch

        from elastic.model import choose_backend
        from elastic.model.hf import from_pretrained

        torch.set_num_threads(max(1, num_threads))
        self.device = torch.device("cpu")
        self.model = from_pretrained(model_path, device=self.device, attention_backend=choose_backend(attention, self.device)).eval()
        self.model.rope_table(self.device, seq_len)
        self.pairs = ray.get(pairs) if isinstance(pairs, ray.ObjectRef) else pairs
        self.micro = micro

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        import torch

        from elastic.model.attention import build_attention_metadata
        from elastic.rl.dpo import pair_batch
        from elastic.rl.algorithms.dpo_loss import answer_logprobs
        from elastic.train.step import to_device

        splits, index = batch["split"], batch["index"]
        chosen = np.zeros(len(index), np.float64)
        rejected = np.zeros(len(index), np.float64)
        for s in range(0, len(index), self.micro):
            rows = range(s, min(len(index), s + self.micro))
            for split in sorted({str(splits[r]) for r in rows}):
                sel = [r for r in rows if str(splits[r]) == split]
                b = to_device(pair_batch(self.pairs[split], [int(index[r]) for r in sel]), self.device)
                with torch.no_grad():
                    logits = self.model(b["tokens"], b["positions"], b["doc_ids"],
                                        build_attention_metadata(b["doc_ids"], self.model.attention_backend))
                    lp = answer_logprobs(logits, b["tokens"], b["amask"]).double().numpy().reshape(-1, 2)
                chosen[sel], rejected[sel] = lp[:, 0], lp[:, 1]
        return {"split": splits, "index": index, "chosen": chosen, "rejected": rejected}


def _meta(pairs: Dict[str, Optional[PairSet]], base_hash: str) -> dict:
    return {"digests": {k: v.digest() for k, v in pairs.items() if v is not None}, "base_sha256": base_hash}


def _read(path: str, meta: dict, pairs: Dict[str, Optional[PairSet]]) -> Optional[Dict[str, np.ndarray]]:
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        return None
    try:
        t = pq.read_table(path)
        stored = json.loads((t.schema.metadata or {}).get(META_KEY, b"{}"))
    except Exception:
        return None
    if stored != meta:
        return None
    return _tables(t.to_pydict(), pairs)


def _tables(cols: dict, pairs: Dict[str, Optional[PairSet]]) -> Dict[str, np.ndarray]:
    out = {k: np.full((len(v), 2), np.nan) for k, v in pairs.items() if v is not None}
    for s, i, c, r in zip(cols["split"], cols["index"], cols["chosen"], cols["rejected"]):
        out[str(s)][int(i)] = (c, r)
    for k, t in out.items():
        if np.isnan(t).any():
            raise RuntimeError(f"dpo reference table: {int(np.isnan(t).any(1).sum())} {k} pairs have no log-probabilities")
    return out


def reference_table(cfg: Config, local_dir: str, pairs: Dict[str, Optional[PairSet]], say=print) -> Dict[str, np.ndarray]:
    """Load the run's table when it matches these pairs and this base, else compute and store it.
    Returns {"train": [n, 2], "heldout": [m, 2]} of (chosen, rejected) Σ log π_ref."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from elastic.launch.lora_base import base_sha256

    path = os.path.join(local_dir, TABLE)
    meta = _meta(pairs, base_sha256(os.path.abspath(cfg.model.init_from)))
    found = _read(path, meta, pairs)
    if found is not None:
        say(f"[elastic] DPO reference log-probs: reusing {path}")
        return found
    items = [(k, i) for k, v in pairs.items() if v is not None for i in range(len(v))]
    ref = ray.put(pairs)
    actors = max(1, min(int(cfg.scaling.max_workers), int(ray.cluster_resources().get("CPU", 1))))
    ds = ray.data.from_items([{"split": k, "index": i} for k, i in items], override_num_blocks=actors)
    ds = ds.map_batches(PairScorer, batch_size=max(8, cfg.train.micro_batch_size * 4), concurrency=actors,
                        num_cpus=max(1.0, float(cfg.scaling.cpus_per_worker)),
                        fn_constructor_kwargs={"model_path": os.path.abspath(cfg.model.init_from), "seq_len": cfg.data.seq_len,
                                               "attention": cfg.model.attention, "pairs": ref,
                                               "micro": cfg.train.micro_batch_size,
                                               "num_threads": int(max(1, cfg.scaling.cpus_per_worker))})
    rows = ds.to_pandas()
    cols = {c: rows[c].tolist() for c in ("split", "index", "chosen", "rejected")}
    tables = _tables(cols, pairs)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    t = pa.table({"split": pa.array([str(s) for s in cols["split"]]), "index": pa.array(cols["index"], pa.int64()),
                  "chosen": pa.array(cols["chosen"], pa.float64()), "rejected": pa.array(cols["rejected"], pa.float64())})
    t = t.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    tmp = path + ".tmp"
    pq.write_table(t, tmp)
    os.replace(tmp, path)
    say(f"[elastic] DPO reference log-probs: {len(items)} pairs scored with Ray Data -> {path}")
    return tables
