"""kvstore: a storage tier for LLM prefix KV caches."""

__version__ = "0.1.0"
