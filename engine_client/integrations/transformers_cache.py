"""kvstore as a persistent, shared prefix cache for a Hugging Face ``transformers`` model.

    cache = KVStorePrefixCache(client, model, tokenizer)      # a Llama or Qwen2 AutoModelForCausalLM
    out = cache.generate(prompt_ids, max_new_tokens=32)       # greedy unless generate's kwargs say otherwise
    out.loaded_tokens, out.computed_tokens                    # read from the store / run through the model

On a request the longest stored prefix of the prompt (whole 16-token chunks, ``Lookup``) is read
into a ``DynamicCache`` and only the rest of the prompt is computed; afterwards the prompt's KV is
put back (only the chunks the store lacks travel).  ``prepare`` / ``store`` are the two halves for
a caller that runs the model itself (``model.generate(ids, past_key_values=load.past_key_values)``
or ``model(load.remaining_ids, past_key_values=...)``).

The entries are the ones ``ModelRunner`` writes: the same geometry (1-layer groups, 4-bit probe
keys), the same model fingerprint (``hf_model``), and the same rows: transformers' cache holds
each layer's keys after RoPE, ``[batch, kv_heads, tokens, head_dim]``, as the project's decoder
stores them.  A prompt whose tokens are all stored still computes its last token (its logits start
the generation).  This is the one module of the product that imports ``transformers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from kvstore.contract import InvalidArgument, LookupResult, PutResult
from kvstore.contract.geometry import StoreGeometry

from ..client import KVStoreClient
from ..tensors import to_torch
from .hf_model import CHUNK_TOKENS, GROUP_LAYERS, PROBE_BITS, hf_fingerprint, hf_geometry, hf_model_config

READ_BYTES = 32 << 20  # rows one ReadChunks of a long prefix carries (layer_batches)
# generate() keywords the cache sets itself
_OWN_KWARGS = ("past_key_values", "attention_mask", "use_cache")


def rows_to_load(matched_tokens: int, num_tokens: int) -> int:
    """Prompt rows read from the store: the matched ones, but never the last token, whose logits start the answer."""
    return max(0, min(matched_tokens, num_tokens - 1))


@dataclass
class PrefixLoad:
    """A prompt's stored prefix, in a transformers cache (``KVStorePrefixCache.prepare``)."""

    past_key_values: DynamicCache  # loaded_tokens rows per layer, [1, kv_heads, loaded_tokens, head_dim]
    input_ids: torch.Tensor  # [1, num_tokens] on the model's device: what model.generate takes with the cache
    loaded_tokens: int  # rows read from the store
    lookup: LookupResult  # the store's answer: matched chunks and tokens, the holding prefix ("" on a miss)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def remaining_ids(self) -> torch.Tensor:
        """``[1, num_tokens - loaded_tokens]``: the prompt tokens left to compute (``model(remaining_ids, past_key_values=...)``)."""
        return self.input_ids[:, self.loaded_tokens :]

    @property
    def fully_stored(self) -> bool:
        """Every chunk of the prompt is stored already: nothing to put back."""
        return self.lookup.matched_chunks == self.lookup.num_chunks


@dataclass
class CachedGeneration:
    """``KVStorePrefixCache.generate``'s answer."""

    sequences: torch.Tensor  # [1, prompt + new tokens], as model.generate returns them
    new_tokens: list[int]
    loaded_tokens: int  # prompt rows read from the store
    computed_tokens: int  # prompt tokens the model ran (the rest of the prompt)
    prefix_id: str  # the stored prefix holding the prompt after the call
    stored: PutResult | None  # the put of the prompt's KV; None when it was stored already
    text: str | None = None  # the new tokens decoded, with a tokenizer


class KVStorePrefixCache:
    """A transformers Llama/Qwen2 model's prompts, prefix-cached in kvstore (module docstring)."""

    def __init__(
        self,
        client: KVStoreClient,
        model,
        tokenizer=None,
        *,
        namespace: str = "",
        model_fingerprint: str | None = None,
        chunk_tokens: int = CHUNK_TOKENS,
        group_layers: int = GROUP_LAYERS,
        probe_bits: int = PROBE_BITS,
    ):
        """``model``: a transformers ``AutoModelForCausalLM`` of model_type llama or qwen2 (float32, bfloat16 or
        float16), batch 1.  ``tokenizer`` (optional: a transformers tokenizer or the project's): lets prompts be
        text and answers be decoded; one of another vocabulary is refused.  ``model_fingerprint``: overrides
        ``hf_model.hf_fingerprint`` (for a model whose runner-side checkpoint holds its weights in another dtype).
        ``chunk_tokens``, ``group_layers``, ``probe_bits``: the geometry, ``ModelRunner``'s by default."""
        self.client, self.model, self.namespace = client, model, namespace
        self.config = hf_model_config(model)
        self.tokenizer = tokenizer
        if tokenizer is not None:
            check_tokenizer(tokenizer, self.config.vocab_size, model)
        self.dtype = model.dtype
        self.geometry = hf_geometry(self.config, self.dtype, chunk_tokens=chunk_tokens, group_layers=group_layers, probe_bits=probe_bits)
        self.model_fingerprint = hf_fingerprint(model, self.config) if model_fingerprint is None else model_fingerprint

    # ------------------------------------------------------------ the two halves
    def lookup(self, input_ids) -> LookupResult:
        """The longest stored prefix of the prompt, in whole chunks."""
        ids = self.token_ids(input_ids)
        return self.client.lookup(ids.numpy(), self.geometry, namespace=self.namespace, model_fingerprint=self.model_fingerprint)

    def prepare(self, input_ids) -> PrefixLoad:
        """Read the prompt's longest stored prefix into a fresh ``DynamicCache`` (empty on a miss)."""
        ids = self.token_ids(input_ids)
        hit = self.client.lookup(ids.numpy(), self.geometry, namespace=self.namespace, model_fingerprint=self.model_fingerprint)
        n = rows_to_load(hit.matched_tokens, ids.numel())
        rows = self.read_rows(hit.prefix_id, n) if n else None
        cache = DynamicCache(ddp_cache_data=rows, config=self.model.config)
        return PrefixLoad(cache, ids[None].to(self.model.device), n, hit)

    def read_rows(self, prefix_id: str, num_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``num_tokens`` rows of a stored prefix, per layer ``(keys, values)`` ``[1, kv_heads, num_tokens, head_dim]``."""
        chunks = np.arange(self.geometry.num_chunks(num_tokens))
        rows = []
        for start, end in layer_batches(self.geometry, num_tokens, 0, self.config.num_hidden_layers):
            kv = read_kv(self.client, prefix_id, chunks, start, end, self.dtype)[:, :, :, :num_tokens].to(self.model.device)
            rows += [(kv[i, 0][None], kv[i, 1][None]) for i in range(end - start)]
        return rows

    def store(self, input_ids, past_key_values) -> PutResult:
        """Put the prompt's KV (the first rows of ``past_key_values``, which may hold generated tokens after them)."""
        ids = self.token_ids(input_ids)
        kv = cache_kv(past_key_values, ids.numel(), self.config, self.dtype)
        return self.client.put_prefix(ids.numpy(), kv, self.geometry, namespace=self.namespace, model_fingerprint=self.model_fingerprint)

    # ------------------------------------------------------------ both
    def generate(self, input_ids, max_new_tokens: int = 32, **generate_kwargs) -> CachedGeneration:
        """``model.generate`` over the prompt's stored prefix, then its KV stored; greedy unless ``do_sample=True``."""
        for name in _OWN_KWARGS:
            if name in generate_kwargs:
                raise InvalidArgument(name, "is set by the prefix cache (one unpadded prompt, its stored prefix in the cache)")
        for name in ("num_beams", "num_return_sequences"):
            if generate_kwargs.get(name, 1) != 1:
                raise InvalidArgument(name, "must be 1: the cache holds one sequence's rows (transformers does not expand a given cache)")
        generate_kwargs.setdefault("do_sample", False)
        load = self.prepare(input_ids)
        ids = load.input_ids
        with torch.no_grad():
            sequences = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                past_key_values=load.past_key_values,
                use_cache=True,
                max_new_tokens=max_new_tokens,
                **generate_kwargs,
            )
        if not isinstance(sequences, torch.Tensor):  # return_dict_in_generate=True
            sequences = sequences.sequences
        stored = None if load.fully_stored else self.store(ids[0], load.past_key_values)
        new = sequences[0, ids.shape[1] :].tolist()
        return CachedGeneration(
            sequences=sequences,
            new_tokens=new,
            loaded_tokens=load.loaded_tokens,
            computed_tokens=load.num_tokens - load.loaded_tokens,
            prefix_id=load.lookup.prefix_id if stored is None else stored.prefix_id,
            stored=stored,
            text=None if self.tokenizer is None else self.tokenizer.decode(new),
        )

    # ------------------------------------------------------------ inputs
    def token_ids(self, input_ids, field_name: str = "input_ids") -> torch.Tensor:
        """One prompt as a 1-D int64 CPU tensor: text (with a tokenizer), ids, ``[tokens]`` or ``[1, tokens]``, or a
        tokenizer's output (its ``input_ids``, unpadded);
        ``InvalidArgument`` naming ``field_name`` for anything else."""
        if isinstance(input_ids, str):
            if self.tokenizer is None:
                raise InvalidArgument(field_name, "is text and the cache has no tokenizer (KVStorePrefixCache(..., tokenizer))")
            input_ids = self.tokenizer.encode(input_ids)
        if isinstance(input_ids, Mapping):  # a tokenizer's output (BatchEncoding)
            mask = input_ids.get("attention_mask")
            if mask is not None and not bool(torch.as_tensor(mask).all()):
                raise InvalidArgument(field_name, "has padding (zeros in its attention_mask): one unpadded prompt at a time")
            if "input_ids" not in input_ids:
                raise InvalidArgument(field_name, f"is a mapping without input_ids (keys {sorted(input_ids)})")
            input_ids = input_ids["input_ids"]
        try:
            ids = torch.as_tensor(input_ids).detach().cpu()
        except (TypeError, ValueError, RuntimeError):
            raise InvalidArgument(
                field_name, f"must be token ids (a list, a tensor, a tokenizer's output), got {type(input_ids).__name__}"
            ) from None
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1:
            raise InvalidArgument(field_name, f"must be one prompt, [tokens] or [1, tokens], got shape {list(ids.shape)}")
        if ids.numel() == 0:
            raise InvalidArgument(field_name, "must not be empty")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise InvalidArgument(field_name, f"must be integer token ids, got {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise InvalidArgument(field_name, f"token id {bad} is outside the model's vocabulary [0, {self.config.vocab_size})")
        return ids.long()


def layer_batches(geometry: StoreGeometry, num_tokens: int, layer_start: int, layer_end: int, max_bytes: int = READ_BYTES):
    """``[layer_start, layer_end)`` cut into ranges of whole stored groups of about ``max_bytes`` of ``num_tokens`` rows each
    (one group at least): what one ``ReadChunks`` of a long prefix carries."""
    per_group = geometry.group_layers * num_tokens * geometry.model.token_layer_bytes
    step = geometry.group_layers * max(1, max_bytes // max(1, per_group))
    first = layer_start - layer_start % geometry.group_layers
    return [(max(a, layer_start), min(a + step, layer_end)) for a in range(first, layer_end, step)]


def read_kv(client: KVStoreClient, prefix_id: str, chunks, layer_start: int, layer_end: int, dtype: torch.dtype) -> torch.Tensor:
    """The rows of ``chunks`` for layers ``[layer_start, layer_end)``: ``[layers, 2, kv_heads, rows, head_dim]`` on the host.

    Read with the bytes in the stream (``shm=False``): a whole prefix's rows are copied into the caller's
    cache anyway, and a daemon's shared-memory lease space (a fraction of ``shm_arena_bytes``) may be
    smaller than one long read."""
    with client.read_chunks(prefix_id, np.asarray(chunks), layer_start=layer_start, layer_end=layer_end, shm=False) as read:
        return to_torch(read.to_kv(), dtype)  # a copy


def check_tokenizer(tokenizer, vocab_size: int, model) -> None:
    """Refuse, in one line, a tokenizer that is not the model's: more tokens than its vocabulary, or another EOS."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
    if not all(callable(getattr(tokenizer, f, None)) for f in ("encode", "decode")) or not isinstance(size, int):
        raise InvalidArgument("tokenizer", f"must be a tokenizer (encode, decode and a vocabulary size), got {type(tokenizer).__name__}")
    if size > vocab_size:
        raise InvalidArgument("tokenizer", f"has {size} tokens, more than the model's vocabulary of {vocab_size}: it is another model's")
    eos = getattr(tokenizer, "eos_token_id", None)
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    model_eos = [model_eos] if isinstance(model_eos, int) else list(model_eos or [])
    if eos is not None and model_eos and eos not in model_eos:
        raise InvalidArgument("tokenizer", f"ends text with token {eos}, the model with {model_eos}: it is another model's")


def cache_kv(cache, num_tokens: int, config, dtype: torch.dtype) -> torch.Tensor:
    """The first ``num_tokens`` rows of a transformers layered cache: ``[layers, 2, kv_heads, num_tokens, head_dim]``."""
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) != config.num_hidden_layers:
        got = "no layers" if layers is None else f"{len(layers)} layers"
        raise InvalidArgument(
            "past_key_values", f"must be a transformers cache of the model's {config.num_hidden_layers} layers, got {got}"
        )
    want = (1, config.num_key_value_heads, config.head_dim)
    out = []
    for i, layer in enumerate(layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if k is None or k.ndim != 4 or (k.shape[0], k.shape[1], k.shape[3]) != want or k.shape[2] < num_tokens or k.dtype != dtype:
            shape = None if k is None else f"{k.dtype} {list(k.shape)}"
            raise InvalidArgument("past_key_values", f"layer {i} holds {shape}, not {dtype} [1, {want[1]}, >= {num_tokens}, {want[2]}]")
        out.append(torch.stack([k[0, :, :num_tokens], v[0, :, :num_tokens]]))
    return torch.stack(out)
