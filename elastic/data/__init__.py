"""Ray Data pipeline: read → tokenize → pack, with a global, seekable data cursor."""

from elastic.data.cursor import Cursor
from elastic.data.pipeline import DataPlan, DatasetFactory, GlobalBatches, build_dataset, prepare_data_plan
from elastic.data.sources import DataError

__all__ = ["Cursor", "DataError", "DataPlan", "DatasetFactory", "GlobalBatches", "build_dataset", "prepare_data_plan"]
