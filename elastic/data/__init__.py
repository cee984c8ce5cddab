"""Data: plan shards → tokenize + pack each shard once into a shared cache (builder.py,
store.py) → each worker reads its own samples of each global batch (reader.py), by a global,
seekable data cursor. Ray is imported only by the modules that use it."""

from elastic.data.cursor import Cursor
from elastic.data.pipeline import DataPlan, prepare_data_plan
from elastic.data.sources import DataError

__all__ = ["Cursor", "DataError", "DataPlan", "prepare_data_plan"]
