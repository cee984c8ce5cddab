"""Issue 58 item 4: the asynchronous rollout buffer is a Parquet table beside the DCP shards,
not JSON inside train_state.json; it round-trips value for value and is read lazily."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic.rl.rollout.buffer_table import from_table, rows_in, to_table
from elastic.train.checkpoint import split_tables, write_tables
from elastic.train.checkpoint_files import TABLE_KEY, TableRef, TableState, resolve_tables


def _buffer():
    lp = np.asarray([-0.1, -2.5, -3.25, -1e-8], np.float32)
    return {
        "2": [{"k": 0, "tokens": [1, 2, 3, 4], "logprobs": lp.tolist(), "truncated": False, "version": 1},
              {"k": 1, "tokens": [5], "logprobs": [lp[1].item()], "truncated": True, "version": 1}],
        "3": [{"k": 0, "tokens": [7, 8], "logprobs": lp[:2].tolist(), "spans": [[0, 1], [1, 2]], "version": 1,
               "turns": [{"turn": 1, "reward": 0.5, "feedback": "x"}], "episode_end": "pass", "prompt": [9, 9],
               "first_message": "hi"}],
        "4": [],
    }


def test_round_trip_is_exact():
    buf = _buffer()
    t = to_table(buf)
    assert t.num_rows == rows_in(buf) == 3
    assert str(t.schema.field("tokens").type) == "list<item: int32>"
    assert str(t.schema.field("logprobs").type) == "list<item: float>"
    assert from_table(t) == buf  # value for value, the step without rows and the row order too


def test_checkpoint_writes_a_table_beside_the_state_and_reads_it_lazily(tmp_path):
    buf = _buffer()
    state = {"step": 2, "prompt_cursor": 32, "rollout_buffer": TableState(buf, to_table, rows_in(buf))}
    js, tables = split_tables(state)
    assert js["rollout_buffer"] == {TABLE_KEY: "rollout_buffer.parquet", "rows": 3} and js["prompt_cursor"] == 32
    json.dumps(js)  # the state file holds no tensors or tables
    write_tables(str(tmp_path), tables)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollout_buffer.parquet"]
    back = resolve_tables(js, str(tmp_path))
    ref = back["rollout_buffer"]
    assert isinstance(ref, TableRef) and ref.rows == 3 and back["prompt_cursor"] == 32
    assert from_table(ref.read()) == buf


def test_stall_does_not_grow_with_the_buffer():
    """What the saving step does with the buffer: split_tables hands a reference over (the
    table is made and written on the writer thread), however big the buffer."""
    import time

    big = {str(s): [{"k": k, "tokens": list(range(1024)), "logprobs": [0.0] * 1024, "version": 1} for k in range(256)]
           for s in range(2)}
    t0 = time.perf_counter()
    js, tables = split_tables({"rollout_buffer": TableState(big, to_table, rows_in(big))})
    took = time.perf_counter() - t0
    assert took < 0.01 and len(json.dumps(js)) < 100, took


@pytest.mark.parametrize("old", [{"2": [{"k": 0, "tokens": [1], "logprobs": [0.0], "version": 1}]}, None])
def test_a_checkpoint_from_before_keeps_its_json_buffer(old):
    assert resolve_tables({"rollout_buffer": old}, "/nowhere")["rollout_buffer"] == old
