"""Write a seeded random checkpoint in Hugging Face Qwen2 format.

    python -m kvstore_tools.make_checkpoint --size tiny|small|qwen2.5-0.5b-shape --out DIR \
        [--seed N] [--dtype bfloat16|float32] [--shards K]

The output is what ``engine_client.model.load_checkpoint`` reads from a real
model: ``config.json`` (``Qwen2ForCausalLM``), ``model.safetensors`` or
``model-0000i-of-0000K.safetensors`` shards plus ``model.safetensors.index.json``.

Every tensor has its own ``torch.Generator`` seeded from ``(seed, name)``, so
the weights do not depend on generation order or on the number of shards
(they do depend on the dtype: a bfloat16 checkpoint is drawn in bfloat16, it
is not the rounding of the float32 one).
Projections are normal with std 0.02 and norms 1.0, except q/k weights, whose
std is chosen so pre-softmax attention logits have a std of about
``QK_LOGIT_STD``: attention is peaked, and a sparse choice of prefix rows
changes the outputs measurably (uniform attention would hide selection bugs).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_client.model.config import ModelConfig
from engine_client.model.loader import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, expected_tensors

SIZES: dict[str, dict] = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
    "small": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b-shape": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
}  # head_dim = hidden_size / num_attention_heads: 16, 32 and 64

INIT_STD = 0.02
QK_LOGIT_STD = 2.5
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def config_dict(size: str, dtype: str = "bfloat16", overrides: dict | None = None) -> dict:
    """The ``config.json`` content of ``size``, with ``overrides`` applied on top."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    raw = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "initializer_range": INIT_STD,
        "rope_scaling": None,
        "use_sliding_window": False,
        "use_cache": True,
        "torch_dtype": dtype,
        **SIZES[size],
    }
    raw.update(overrides or {})
    raw["sliding_window"] = raw["max_position_embeddings"]
    return raw


def random_tensor(name: str, shape: tuple[int, ...], config: ModelConfig, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The seeded random value of tensor ``name`` (independent of all other tensors)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little"))
    std = INIT_STD
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        # q_i, k_i ~ N(0, std^2 * hidden) on a unit-RMS input, so q.k/sqrt(d) has std std^2 * hidden.
        std = math.sqrt(QK_LOGIT_STD / config.hidden_size)
    # Drawn directly in the target dtype (one pass, no float32 copy of the embedding).
    return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=gen)


def make_checkpoint(
    out_dir,
    size: str = "tiny",
    seed: int = 0,
    dtype: str | torch.dtype = "bfloat16",
    shards: int = 1,
    overrides: dict | None = None,
) -> Path:
    """Write the checkpoint into ``out_dir`` (created if needed); returns its path.

    ``overrides`` replaces ``config.json`` fields (e.g. ``{"num_attention_heads": 14}``)
    so tests can vary the geometry while still going through the loader.
    """
    dtype_name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if dtype_name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be a positive integer, got {shards!r}")
    raw = config_dict(size, dtype_name, overrides)
    config = ModelConfig.from_dict(raw)
    shapes = expected_tensors(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")

    groups = _split_by_size(list(shapes.items()), shards)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for i, group in enumerate(groups):
        file = SINGLE_FILE if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {name: random_tensor(name, shape, config, seed, DTYPES[dtype_name]) for name, shape in group}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({name: file for name in tensors})
        del tensors
    if shards > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out


def checkpoint_path(args) -> str:
    """``args.checkpoint``; a pretrained model (``engine_client.model.zoo``) exported once into the model cache;
    or a seeded checkpoint made once under ``args.directory`` (the benchmarks' default)."""
    if args.checkpoint:
        return args.checkpoint
    from engine_client.model import zoo

    if args.model in zoo.MODELS:
        return str(zoo.cached_checkpoint(args.model, args.dtype))
    path = os.path.join(args.directory, "models", f"{args.model}-seed{args.seed}-{args.dtype}")
    if not os.path.exists(os.path.join(path, "config.json")):
        t0 = time.perf_counter()
        make_checkpoint(path, args.model, args.seed, args.dtype, 1)
        print(f"made checkpoint {path} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return path


def _split_by_size(items: list[tuple[str, tuple[int, ...]]], parts: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Cut ``items`` (in order) into ``parts`` non-empty runs of roughly equal element counts."""
    if parts > len(items):
        raise ValueError(f"shards={parts} is more than the {len(items)} tensors of this model")
    before = list(itertools.accumulate((math.prod(shape) for _, shape in items), initial=0))  # elements before item k
    cuts = [0]
    for j in range(1, parts):
        k = bisect.bisect_left(before, before[-1] * j / parts, hi=len(items))
        cuts.append(min(max(k, cuts[-1] + 1), len(items) - (parts - j)))
    cuts.append(len(items))
    return [items[a:b] for a, b in zip(cuts, cuts[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.make_checkpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", required=True, choices=sorted(SIZES))
    parser.add_argument("--out", required=True, help="output directory (created if needed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype on disk")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors files (index json when > 1)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = make_checkpoint(args.out, args.size, args.seed, args.dtype, args.shards)
    except (ValueError, OSError) as exc:
        print(f"make_checkpoint: {exc}", file=sys.stderr)
        return 1
    nbytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"wrote {args.size} checkpoint to {out}: {nbytes / 2**20:.1f} MiB in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
