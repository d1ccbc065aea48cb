"""The Zipf bench's prefixes: held-out examples or random tokens, their KV and accumulated attention
(one prefill each, cached under ``--directory``), and the references a request is compared with
(first-token logits over the full KV; whether the full KV answers the question)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from .io_jobs import BenchError


@dataclass
class Prefix:
    tokens: torch.Tensor
    kv: torch.Tensor  # [L, 2, Hkv, n, d] in the model dtype
    scores: torch.Tensor  # [periods, n] accumulated attention at each Period's first layer (H2O's)
    stored: dict = field(default_factory=dict)  # period_layers -> (kv in storage_order, orders [periods, n])


def task_examples(args, checkpoint: str) -> tuple:
    """``--task``: ``(tokenizer, one held-out real-text example per prefix)``; ``(None, None)`` for random tokens."""
    if not args.task:
        return None, None
    from engine_client.model.tokenizer import Tokenizer
    from kvstore_tools.tasks import text

    tokenizer = Tokenizer.load(checkpoint)
    try:
        return tokenizer, text.examples(args.task, tokenizer, args.prefixes, args.prefix_tokens, start=args.task_start)
    except ValueError as exc:
        raise BenchError(f"--task: {exc}") from None


def request_examples(args, tokenizer, examples, requests) -> tuple[list[list], list[int]]:
    """``(per prefix: the examples its requests may ask, per request: the index of the one it asks)``: the
    prefix's own question (``--ask prefix``), or one of its keys drawn per request from ``--seed``
    (``--ask any-key``: the same prefix asked about each needle)."""
    if getattr(args, "ask", "prefix") == "prefix":
        return [[ex] for ex in examples], [0] * len(requests)
    import numpy as np

    from kvstore_tools.tasks import text

    try:
        table = text.key_variants(args.task, tokenizer, args.prefixes, args.prefix_tokens, start=args.task_start)
    except ValueError as exc:
        raise BenchError(f"--ask {args.ask}: {exc}") from None
    rng = np.random.default_rng([args.seed, 0xA5])  # its own stream: the request order and suffixes are --seed's
    return table, [int(k) for k in rng.integers(0, len(table[0]), len(requests))]


def max_new_tokens(ex) -> int:
    return int(ex.meta.get("max_new_tokens", 16))


def full_kv_answers(model, prefixes, table, tokenizer) -> list[list[bool]]:
    """Per prefix and question it may be asked (``request_examples``): whether greedy decoding over its full
    KV answers it (the accuracy to keep)."""
    from engine_client.generation import dense_generate

    out = []
    for p, asked in zip(prefixes, table):
        row = []
        for ex in asked:
            gen = dense_generate(model, ex.prefix_tokens, ex.suffix_tokens, max_new_tokens(ex), tokenizer=tokenizer, prefix_kv=p.kv)
            row.append(bool(ex.is_correct(gen.text)))
        out.append(row)
    return out


def prefill_all(model, args, examples=None) -> list[Prefix]:
    """Each prefix's KV and accumulated attention, computed in one prefill and
    cached under --directory (same seed, model and Period)."""
    from engine_client.prefill import prefill_with_attention
    from kvstore.progress import progress

    out = []
    gen = torch.Generator().manual_seed(args.seed)
    cache = os.path.join(args.directory, "zipf-kv")
    os.makedirs(cache, exist_ok=True)
    first_layers = list(range(0, model.num_layers, args.period_layers))
    for i in range(args.prefixes):
        tokens = torch.randint(0, model.config.vocab_size, (args.prefix_tokens,), generator=gen)
        if examples:
            tokens = torch.from_numpy(examples[i].prefix_tokens)
        ident = f"{model.fingerprint}/{args.dtype}/{first_layers}/{tokens.numpy().tobytes().hex()}"
        path = os.path.join(cache, hashlib.sha256(ident.encode()).hexdigest()[:24] + ".pt")
        if os.path.exists(path):
            kv, scores = torch.load(path)
        else:
            t0 = time.perf_counter()
            _, kv, scores = prefill_with_attention(model, tokens, first_layers, progress=progress)
            torch.save((kv, scores), path + ".tmp")
            os.replace(path + ".tmp", path)
            print(f"prefilled prefix {i} ({tokens.numel()} tokens) in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        out.append(Prefix(tokens, kv, scores))
    return out


@torch.inference_mode()
def dense_logits(model, kv: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
    """First-token logits with full attention over the prefix KV (the fidelity reference)."""
    n = kv.shape[3]
    positions = torch.arange(n, n + suffix.numel())
    hidden = model.embed(suffix)
    for layer in range(model.num_layers):
        hidden, _ = model.layer_forward(layer, hidden, positions, kv[layer])
    return model.final_logits(hidden)
