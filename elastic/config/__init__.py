"""Typed configuration: declared in schema.py, loaded and validated in load.py."""

from elastic.config.load import ConfigError, from_dict, load_config, resolved_model_dims, resolved_tokenizer, run_dir, to_dict
from elastic.config.presets import PRESETS
from elastic.config.schema import Config

__all__ = ["Config", "ConfigError", "PRESETS", "from_dict", "load_config", "resolved_model_dims", "resolved_tokenizer", "run_dir", "to_dict"]
