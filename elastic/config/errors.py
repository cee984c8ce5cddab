"""The config's one error type (imported by load.py, init_from.py and every caller)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config: the message is a single line that names the offending key."""
