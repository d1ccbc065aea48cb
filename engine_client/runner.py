"""The Re-Prefill runner's first import path, kept for its callers: the runner is the package ``engine_client.reprefill``."""

from .reprefill import Budget, ModelRunner, PrefixHandle, ReprefillConfig, ReprefillResult, model_geometry, parse_system

__all__ = ["Budget", "ModelRunner", "PrefixHandle", "ReprefillConfig", "ReprefillResult", "model_geometry", "parse_system"]
