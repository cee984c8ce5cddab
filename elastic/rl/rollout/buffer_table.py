"""The asynchronous rollout buffer as an Arrow table (issue 58 item 4).

A checkpoint of an off-policy run carries the generated steps whose policy versions it no
longer has (elastic/rl/rollout/coordinator.py `buffer`): {str(step): [row, ...]}, each row a
completion (k, tokens, logprobs, truncated, version) or an episode (and spans, turns, ...). At
real sizes (staleness x prompts x group x tokens) that was hundreds of MB of JSON text in
`train_state.json`, written by the training thread at every save. Here it is one Parquet table
(elastic/train/checkpoint_files.py TableState), one row per completion: `step`, `k`, the big
numeric lists as Arrow lists (`tokens`, `prompt` int32, `logprobs` float32, exact: the engine's
log-probs are float32) and the rest of the row as a small JSON string (`meta`). `from_table`
gives back the same dict, value for value, so a resume stays exact.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pyarrow as pa

LISTS = {"tokens": pa.int32(), "prompt": pa.int32(), "logprobs": pa.float32()}
SCHEMA = pa.schema([("step", pa.int64()), ("k", pa.int64()), ("meta", pa.string())]
                   + [(name, pa.list_(t)) for name, t in LISTS.items()])


def rows_in(buffer: Dict[str, List[Dict[str, Any]]]) -> int:
    return sum(len(v) for v in buffer.values())


def to_table(buffer: Dict[str, List[Dict[str, Any]]]) -> pa.Table:
    """{str(step): [row]} -> the table (one row per completion; a list field a row lacks is null)."""
    cols: Dict[str, list] = {name: [] for name in SCHEMA.names}
    for step, rows in buffer.items():
        for r in rows:
            cols["step"].append(int(step))
            cols["k"].append(int(r["k"]))
            cols["meta"].append(json.dumps({k: v for k, v in r.items() if k not in LISTS and k != "k"}))
            for name in LISTS:
                cols[name].append(r.get(name))
    steps = json.dumps(list(buffer))  # every step, also one without rows, in its order
    return pa.table(cols, schema=SCHEMA).replace_schema_metadata({"steps": steps})


def from_table(table: pa.Table) -> Dict[str, List[Dict[str, Any]]]:
    """The table -> {str(step): [row]} as it was written (rows in their order per step)."""
    d = table.to_pydict()
    meta = table.schema.metadata or {}
    out: Dict[str, List[Dict[str, Any]]] = {str(t): [] for t in json.loads(meta.get(b"steps", b"[]"))}
    for i in range(table.num_rows):
        row: Dict[str, Any] = {"k": d["k"][i]}
        row.update(json.loads(d["meta"][i]))
        for name in LISTS:
            if d[name][i] is not None:
                row[name] = d[name][i]
        out.setdefault(str(d["step"][i]), []).append(row)
    return out
