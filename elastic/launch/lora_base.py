"""The frozen base of a LoRA run, referenced by path and content hash (driver side).

A LoRA checkpoint holds only the adapters and their optimizer state; the base weights are
`model.init_from` (or the seeded init, `seed:N`). Each checkpoint's train_state.json records
`lora: {base, base_sha256, rank, alpha, dropout, targets}`, so an export or a later
`model.init_from` finds the base, and a relaunch refuses, before Ray starts, to put the
adapters on a base that changed under them: they only mean something on the weights they
were trained on.

The hash is SHA-256 over the base's weight files in name order (a Hugging Face directory's
`*.safetensors`; our checkpoint's `.metadata` and `*.distcp`; for a LoRA checkpoint used as a
base, its files plus its own base's hash). It reads every byte once per launch (about 1 s per
GB); the result is memoised per process by file sizes and modification times.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from elastic.config import Config, ConfigError

_MEMO: Dict[Tuple, str] = {}


def _weight_files(path: str) -> List[str]:
    names = sorted(os.listdir(path))
    if os.path.isfile(os.path.join(path, "train_state.json")):
        return [n for n in names if n == ".metadata" or n.endswith(".distcp")]
    return [n for n in names if n.endswith(".safetensors")]


def _recorded_lora(path: str) -> Optional[Dict[str, Any]]:
    state = os.path.join(path, "train_state.json")
    if not os.path.isfile(state):
        return None
    with open(state) as f:
        return json.load(f).get("lora") or None


def base_sha256(path: str) -> str:
    """Content hash of a base (see the module docstring); `seed:N` hashes the string."""
    if path.startswith("seed:"):
        return hashlib.sha256(path.encode()).hexdigest()
    files = _weight_files(path)
    key = (os.path.abspath(path),) + tuple((n, os.stat(os.path.join(path, n)).st_size,
                                            os.stat(os.path.join(path, n)).st_mtime_ns) for n in files)
    if key in _MEMO:
        return _MEMO[key]
    h = hashlib.sha256()
    for n in files:
        h.update(n.encode() + b"\0")
        with open(os.path.join(path, n), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    rec = _recorded_lora(path)
    if rec:  # adapters on a base: the base is part of what these weights are
        h.update(str(rec.get("base_sha256", "")).encode())
    _MEMO[key] = h.hexdigest()
    return _MEMO[key]


def lora_base_record(cfg: Config) -> Dict[str, Any]:
    """The `lora` record every checkpoint of this run carries."""
    from elastic.train.loop import lora_reference

    rec = lora_reference(cfg)
    rec["base_sha256"] = base_sha256(rec["base"])
    return rec


def check_lora_base(cfg: Config, run_dir: str) -> Optional[Dict[str, Any]]:
    """Before Ray starts: the run's latest checkpoint and this config agree on LoRA (both or
    neither; same base content, rank and targets). Returns this run's record (None without
    LoRA). ConfigError, one line, otherwise."""
    from elastic.train.checkpoint_files import latest_complete

    lora = cfg.model.lora.rank > 0
    found = latest_complete(run_dir)
    rec = lora_base_record(cfg) if lora else None
    if not found:
        return rec
    step_dir, state = found
    old = state.get("lora")
    where = f"{os.path.basename(step_dir)}/train_state.json"
    if old and not lora:
        raise ConfigError(f"model.lora.rank: the run {run_dir} has LoRA checkpoints (rank {old.get('rank')}, {where}); "
                          f"resume it with model.lora.rank={old.get('rank')} or use a new run.name")
    if lora and not old:
        raise ConfigError(f"model.lora.rank: the run {run_dir} has full checkpoints ({where}); adapters cannot resume "
                          "from them: use a new run.name (and model.init_from=<that checkpoint>)")
    if not lora:
        return None
    for k in ("rank", "targets"):
        if old.get(k) != rec[k]:
            raise ConfigError(f"model.lora.{k}: {rec[k]!r} differs from {old.get(k)!r} in the run's checkpoint ({where})")
    if old.get("quantize_base", "none") != rec.get("quantize_base", "none"):
        raise ConfigError(f"model.quantize_base: {rec.get('quantize_base', 'none')!r} differs from "
                          f"{old.get('quantize_base', 'none')!r} in the run's checkpoint ({where})")
    if old.get("base_sha256") and old["base_sha256"] != rec["base_sha256"]:
        raise ConfigError(f"model.init_from: the base {rec['base']} (sha256 {rec['base_sha256'][:12]}...) is not the one "
                          f"the run's adapters were trained on ({old.get('base')}, sha256 {old['base_sha256'][:12]}... in {where})")
    return rec
