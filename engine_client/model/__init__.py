"""Worker-side Llama/Qwen2 decoder that a Re-Prefill runner drives layer by layer."""

from .config import ConfigError, ModelConfig, UnsupportedModel, model_fingerprint
from .decoder import Decoder
from .loader import CheckpointError, MissingCheckpointFile, load_checkpoint

__all__ = [
    "CheckpointError",
    "ConfigError",
    "Decoder",
    "MissingCheckpointFile",
    "ModelConfig",
    "UnsupportedModel",
    "load_checkpoint",
    "model_fingerprint",
]
