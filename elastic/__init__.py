"""elastic: an elastic, distributed LLM trainer orchestrated by Ray."""

__version__ = "0.1.0"
