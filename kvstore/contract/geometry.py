"""Geometry and on-disk layout of stored prefixes (pure functions, no I/O).

Terms:

* ``ModelSpec``: layers ``L``, KV heads ``H``, head dim ``d``, dtype.
* A prefix of ``n`` tokens is ``m = ceil(n / c)`` ContiguousChunks of
  ``c = chunk_tokens`` tokens; only the last chunk may be shorter.
* A stored group (the SubPeriod) is ``p = group_layers`` consecutive layers;
  the last group has ``L - (G-1)*p`` layers when ``p`` does not divide ``L``.
  A selection Period (``ReprefillConfig.period_layers``) is a multiple of it.
* An **extent** is the KV of one chunk for all layers of one group, laid out
  ``[layer-in-group][K|V][head][token][dim]``.

The byte layout of a segment file is ``kvstore.contract.layout``.

With ``kv_quant`` (``"kv8"``, ``"kv4"``, ``"kv8t"``, ``"kv4t"``, ``"kv8h"``, ``"kv4h"``) an extent holds each layer's
K and V as quantized codes with float16 scales and zero points (``kvstore.contract.kvquant``), still one chunk of
one group: ``extent_bytes``, ``extent_payload`` (what a put stores) and ``extent_array`` (what a read returns,
dequantized to the KV dtype) are the only places that know.

With ``streaming_heads`` (per layer, the KV heads that attend only to a sink
and a recent window: LServe's streaming heads) an extent holds the other
heads only, ``[layer-in-group][K|V][stored head][token][dim]``; a read gives
the streaming heads' slots as zeros.  Their sink and recent rows are not a
property of one chunk (a chunk recent in one prefix is in the middle of a
longer one), so the client keeps them per prefix as pages
(``engine_client.stream_tail``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import kvquant
from .errors import InvalidArgument
from .kv_values import float32_as_kv, keys_as_float32
from .kvquant import check_name as check_quant_name

ALIGN_BYTES = 4096

# itemsize of each supported KV dtype; bfloat16 travels as raw uint16 in numpy.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
SUMMARY_DTYPE = np.float32

MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_CHUNK_TOKENS = 65536

PROBE_BITS = (0, 4, 8)  # 0: probe keys in the KV dtype; 4 or 8: quantized (kvstore.contract.probes)
PROBE_SCALE_BYTES = 4  # the float32 scale closing each quantized probe row


def align_up(nbytes: int, align: int = ALIGN_BYTES) -> int:
    return (nbytes + align - 1) // align * align


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def quantized_row_bytes(head_dim: int, bits: int) -> int:
    """Bytes of one packed row of ``bits``-bit probe keys: ``head_dim * bits / 8`` codes and a float32 scale."""
    return head_dim * bits // 8 + PROBE_SCALE_BYTES


def dtype_name(dtype, field: str = "dtype") -> str:
    """A KV dtype's name (``"bfloat16"``, ``"float16"``, ``"float32"``) from that string, a torch dtype
    (``torch.bfloat16``) or a numpy one (``np.float16``); InvalidArgument naming ``field`` for anything else.

    torch is not imported: its dtypes are known by their ``str`` (``"torch.bfloat16"``).
    """
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__ == "torch" and str(dtype).startswith("torch."):
        name = str(dtype)[len("torch.") :]
    else:
        try:
            name = np.dtype(dtype).name if dtype is not None else ""
        except TypeError:
            name = ""
    if name not in DTYPE_BYTES:
        raise InvalidArgument(field, f"must be one of {sorted(DTYPE_BYTES)} (a string, torch or numpy dtype), got {dtype!r}")
    return name


def check_int(field: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(field, f"must be an integer, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise InvalidArgument(field, f"must be in [{lo}, {hi}], got {value}")
    return int(value)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a model's KV cache."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"  # a torch or numpy dtype is taken by its name (dtype_name)

    def __post_init__(self) -> None:
        check_int("num_layers", self.num_layers, 1, MAX_LAYERS)
        check_int("num_kv_heads", self.num_kv_heads, 1, MAX_KV_HEADS)
        check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))  # torch.bfloat16 is "bfloat16"

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def token_layer_bytes(self) -> int:
        """Bytes of K and V of one token in one layer: ``2*H*d*itemsize``."""
        return 2 * self.num_kv_heads * self.head_dim * self.itemsize

    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype that holds this KV dtype bit-exactly."""
        return np.dtype(np.uint16) if self.dtype == "bfloat16" else np.dtype(self.dtype)


def _check_streaming_heads(value, model: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """``streaming_heads`` as sorted tuples, one per layer, or InvalidArgument naming the field."""
    if value is None or (isinstance(value, (tuple, list)) and len(value) == 0):
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise InvalidArgument("streaming_heads", f"must be one list of KV heads per layer, got {type(value).__name__}")
    if len(value) != model.num_layers:
        raise InvalidArgument("streaming_heads", f"must have one entry per layer ({model.num_layers}), got {len(value)}")
    out = []
    for layer, heads in enumerate(value):
        if isinstance(heads, (str, bytes)) or not isinstance(heads, (tuple, list)):
            raise InvalidArgument(f"streaming_heads[{layer}]", f"must be a list of KV heads, got {type(heads).__name__}")
        checked = [check_int(f"streaming_heads[{layer}]", h, 0, model.num_kv_heads - 1) for h in heads]
        if len(set(checked)) != len(checked):
            raise InvalidArgument(f"streaming_heads[{layer}]", f"names a head twice: {list(heads)}")
        if len(checked) == model.num_kv_heads:
            raise InvalidArgument(f"streaming_heads[{layer}]", f"leaves none of the layer's {model.num_kv_heads} KV heads stored")
        out.append(tuple(sorted(checked)))
    if not any(out):
        return ()  # no streaming head: the full layout, the same digest
    return tuple(out)


# The stored group's name in persisted records (see ``StoreGeometry.to_record``).
RECORD_GROUP_KEY = "period_layers"


@dataclass(frozen=True)
class StoreGeometry:
    """How one model's prefixes are cut into chunks and period groups on disk."""

    model: ModelSpec
    chunk_tokens: int = 16
    group_layers: int = 8
    probe_keys: bool = True
    # 4 or 8: probe keys stored quantized to that many bits (module docstring); 0: in the KV dtype
    probe_bits: int = 0
    # "kv8", "kv4", "kv8t", "kv4t", "kv8h", "kv4h": extents hold the KV quantized (``kvstore.contract.kvquant``); "": in the KV dtype
    kv_quant: str = ""
    # per layer, the KV heads whose rows extents leave out (module docstring); (): every head stored
    streaming_heads: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        check_int("chunk_tokens", self.chunk_tokens, 1, MAX_CHUNK_TOKENS)
        object.__setattr__(self, "streaming_heads", _check_streaming_heads(self.streaming_heads, self.model))
        if check_quant_name(self.kv_quant).startswith("kv4") and self.model.head_dim % 2:
            raise InvalidArgument("kv_quant", f"4-bit codes pack two channels to a byte; head_dim {self.model.head_dim} is odd")
        check_int("group_layers", self.group_layers, 1, MAX_LAYERS)
        bits = self.probe_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits not in PROBE_BITS:
            raise InvalidArgument("probe_bits", f"must be one of {', '.join(map(str, PROBE_BITS))}, got {bits!r}")
        if bits and not self.probe_keys:
            raise InvalidArgument("probe_bits", f"quantizes the stored probe keys; {bits} needs probe_keys on")
        if bits == 4 and self.model.head_dim % 2:
            raise InvalidArgument("probe_bits", f"4-bit codes pack two channels to a byte; head_dim {self.model.head_dim} is odd")

    # -- counts -----------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return ceil_div(self.model.num_layers, self.group_layers)

    def layers_in_group(self, group: int) -> int:
        """Layers in stored period group ``group`` (the last may be short)."""
        return min(self.group_layers, self.model.num_layers - group * self.group_layers)

    def group_layer_range(self, group: int) -> range:
        start = group * self.group_layers
        return range(start, start + self.layers_in_group(group))

    def num_chunks(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.chunk_tokens)

    def chunk_token_counts(self, num_tokens: int) -> np.ndarray:
        """Tokens in each chunk of an ``num_tokens``-token sequence."""
        m = self.num_chunks(num_tokens)
        counts = np.full(m, self.chunk_tokens, dtype=np.int64)
        if m:
            counts[-1] = num_tokens - (m - 1) * self.chunk_tokens
        return counts

    def stored_heads(self, layer: int) -> tuple[int, ...]:
        """The KV heads of ``layer`` whose rows extents hold (all but its streaming heads)."""
        if not self.streaming_heads:
            return tuple(range(self.model.num_kv_heads))
        gone = set(self.streaming_heads[layer])
        return tuple(h for h in range(self.model.num_kv_heads) if h not in gone)

    def streaming_fraction(self) -> float:
        """Share of (layer, KV head) pairs whose rows extents leave out."""
        return sum(map(len, self.streaming_heads)) / (self.model.num_layers * self.model.num_kv_heads)

    # -- sizes ------------------------------------------------------------
    def _layer_bytes(self, layer: int, tokens: int) -> int:
        m = self.model
        heads = len(self.stored_heads(layer)) if self.streaming_heads else m.num_kv_heads
        if self.kv_quant:
            return kvquant.layer_bytes(self.kv_quant, heads, tokens, m.head_dim)
        return tokens * 2 * heads * m.head_dim * m.itemsize

    def extent_bytes(self, group: int, tokens: int) -> int:
        """Unpadded bytes of one extent of ``tokens`` tokens in ``group`` (quantized when ``kv_quant``)."""
        return sum(self._layer_bytes(layer, tokens) for layer in self.group_layer_range(group))

    def extent_padded_bytes(self, group: int) -> int:
        """Bytes one full extent of ``group`` takes in a read buffer (padded to ALIGN_BYTES): the most any extent needs."""
        return align_up(self.extent_bytes(group, self.chunk_tokens))

    def kv_bytes(self, num_tokens: int) -> int:
        """Extent bytes (unpadded) of a whole ``num_tokens``-token prefix as stored."""
        m, c = self.num_chunks(num_tokens), self.chunk_tokens  # m - 1 whole chunks and the last, per group (a request prices it)
        return sum((m - 1) * self.extent_bytes(g, c) + self.extent_bytes(g, num_tokens - (m - 1) * c) for g in range(self.num_groups) if m)

    def extent_array(self, raw: np.ndarray, group: int, tokens: int) -> np.ndarray:
        """A stored extent's bytes (uint8) as ``[layers_in_group, 2, heads, tokens, dim]`` in the numpy KV dtype:
        a view of ``raw``, or its dequantized copy when ``kv_quant``, a zero-filled copy when ``streaming_heads``."""
        m = self.model
        if self.streaming_heads:
            return self._spread_extent(raw, group, tokens)
        if not self.kv_quant:
            return raw.view(m.numpy_dtype()).reshape(self.extent_shape(group, tokens))
        values = kvquant.decode(self.kv_quant, raw, self.layers_in_group(group), m.num_kv_heads, tokens, m.head_dim)
        return float32_as_kv(values, m.dtype)

    def _spread_extent(self, raw: np.ndarray, group: int, tokens: int) -> np.ndarray:
        """A streaming-heads extent as ``[layers_in_group, 2, heads, tokens, dim]``, the left-out heads zero."""
        m = self.model
        out = np.zeros(self.extent_shape(group, tokens), dtype=m.numpy_dtype())
        raw = np.asarray(raw).reshape(-1).view(np.uint8)
        at = 0
        for i, layer in enumerate(self.group_layer_range(group)):
            heads, size = list(self.stored_heads(layer)), self._layer_bytes(layer, tokens)
            part = raw[at : at + size]
            if self.kv_quant:
                values = kvquant.decode(self.kv_quant, part, 1, len(heads), tokens, m.head_dim)[0]
                out[i][:, heads] = float32_as_kv(values, m.dtype)
            else:
                out[i][:, heads] = part.view(m.numpy_dtype()).reshape(2, len(heads), tokens, m.head_dim)
            at += size
        return out

    def group_array(self, raws, group: int, token_counts, out=None) -> np.ndarray:
        """Several extents of one group (uint8 each, ``token_counts[i]`` tokens) as one
        ``[layers_in_group, 2, heads, sum(tokens), dim]`` array in the numpy KV dtype, in the given
        order; quantized extents of equal size are dequantized together, one numpy pass each size.
        ``out(shape, dtype)``: the array plain extents are gathered into and returned (a pinned buffer)."""
        m = self.model
        if not self.kv_quant or not raws or self.streaming_heads:
            parts = [self.extent_array(r, group, int(t)) for r, t in zip(raws, token_counts)]
            if out is None or self.streaming_heads or not parts:
                return np.concatenate(parts, axis=3)
            shape = (*parts[0].shape[:3], sum(a.shape[3] for a in parts), parts[0].shape[4])
            return np.concatenate(parts, axis=3, out=out(shape, parts[0].dtype))
        layers, counts = self.layers_in_group(group), [int(t) for t in token_counts]
        out = np.empty((layers, 2, m.num_kv_heads, sum(counts), m.head_dim), dtype=np.float32)
        i = row = 0
        while i < len(counts):  # runs of equal-size extents (all full chunks, then a short last one)
            j = i
            while j < len(counts) and counts[j] == counts[i]:
                j += 1
            t, k = counts[i], j - i
            batch = np.stack([np.asarray(r).reshape(-1) for r in raws[i:j]])
            region = out[:, :, :, row : row + k * t].reshape(layers, 2, m.num_kv_heads, k, t, m.head_dim)
            assert np.may_share_memory(region, out), "splitting the token axis is a view"
            kvquant.decode_many(self.kv_quant, batch, layers, m.num_kv_heads, t, m.head_dim, out=region)
            i, row = j, row + k * t
        return float32_as_kv(out, m.dtype)

    def check_storable(self, kv: np.ndarray) -> None:
        """InvalidArgument naming ``kv`` when ``kv_quant`` cannot hold these values (checked before a put streams)."""
        if self.kv_quant:
            kvquant.check_values(self.kv_quant, keys_as_float32(kv, self.model.dtype))

    def extent_payload(self, extent: np.ndarray, group: int | None = None) -> np.ndarray:
        """What is stored for one extent given in the numpy KV dtype: the array, or its quantized bytes;
        with ``streaming_heads``, each layer's stored heads only (uint8 bytes; ``group``, the extent's, required)."""
        if self.streaming_heads:
            if group is None or extent.shape[0] != self.layers_in_group(group):
                raise InvalidArgument("group", f"a streaming-heads extent needs its group; got {group} for {extent.shape[0]} layers")
            parts = []
            for i, layer in enumerate(self.group_layer_range(group)):
                kept = np.ascontiguousarray(extent[i][:, list(self.stored_heads(layer))])
                if self.kv_quant:
                    parts.append(kvquant.encode(self.kv_quant, keys_as_float32(kept[None], self.model.dtype)))
                else:
                    parts.append(kept.reshape(-1).view(np.uint8))
            return np.concatenate(parts)
        if not self.kv_quant:
            return extent
        return kvquant.encode(self.kv_quant, keys_as_float32(extent, self.model.dtype))

    def extent_shape(self, group: int, tokens: int) -> tuple[int, int, int, int, int]:
        m = self.model
        return (self.layers_in_group(group), 2, m.num_kv_heads, tokens, m.head_dim)

    def summary_chunk_bytes(self) -> int:
        """Key summary bytes of one chunk: ``[L][H][2][d]`` float32."""
        m = self.model
        return m.num_layers * m.num_kv_heads * 2 * m.head_dim * SUMMARY_DTYPE().itemsize

    def probe_row_bytes(self) -> int:
        """Bytes of one (head, token) row of probe keys: ``d`` keys in the KV dtype, or packed codes and scale."""
        m = self.model
        return quantized_row_bytes(m.head_dim, self.probe_bits) if self.probe_bits else m.head_dim * m.itemsize

    def probe_bytes(self, tokens: int) -> int:
        """Probe-key bytes of one group over ``tokens`` tokens: ``[H][tokens][row]``."""
        return self.model.num_kv_heads * tokens * self.probe_row_bytes()

    def probe_array(self, region: np.ndarray, tokens: int) -> np.ndarray:
        """A probe region's bytes (uint8, ``probe_bytes(tokens)`` of them) as its array, a view:
        keys ``[H, tokens, d]`` in the KV dtype, or packed rows ``[H, tokens, row_bytes]`` uint8."""
        m = self.model
        if self.probe_bits:
            return region.reshape(m.num_kv_heads, tokens, self.probe_row_bytes())
        return region.view(m.numpy_dtype()).reshape(m.num_kv_heads, tokens, m.head_dim)

    # -- identity ---------------------------------------------------------
    def to_dict(self) -> dict:
        """The geometry as reports and listings show it."""
        return dataclasses.asdict(self)

    def to_record(self) -> dict:
        """The geometry as index records, segment trailers and manifest files hold it.

        The stored group is ``period_layers`` there, its name when the format
        was fixed: records written by any version read back, and the digest
        (hence every chunk hash and prefix id) does not change.  For the same
        reason ``probe_bits`` appears only when it is not 0, ``kv_quant``
        only when it is not "", and ``streaming_heads`` only when not empty.
        """
        d = self.to_dict()
        d[RECORD_GROUP_KEY] = d.pop("group_layers")
        if not d["probe_bits"]:
            del d["probe_bits"]
        if not d["kv_quant"]:
            del d["kv_quant"]
        if d["streaming_heads"]:
            d["streaming_heads"] = [list(heads) for heads in self.streaming_heads]
        else:
            del d["streaming_heads"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StoreGeometry:
        if not isinstance(d, dict) or "model" not in d:
            raise InvalidArgument("geometry", "must be a mapping with a 'model' entry")
        model = d["model"]
        if not isinstance(model, dict):
            raise InvalidArgument("geometry.model", "must be a mapping")
        unknown = set(model) - {f.name for f in dataclasses.fields(ModelSpec)}
        if unknown:
            raise InvalidArgument("geometry.model", f"unknown fields {sorted(unknown)}")
        rest = {k: v for k, v in d.items() if k != "model"}
        if RECORD_GROUP_KEY in rest:
            if "group_layers" in rest:
                raise InvalidArgument("geometry", f"names the stored group twice ('group_layers' and {RECORD_GROUP_KEY!r})")
            rest["group_layers"] = rest.pop(RECORD_GROUP_KEY)
        unknown = set(rest) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidArgument("geometry", f"unknown fields {sorted(unknown)}")
        if "streaming_heads" in rest and isinstance(rest["streaming_heads"], list):
            heads = rest["streaming_heads"]
            rest["streaming_heads"] = tuple(tuple(h) if isinstance(h, list) else h for h in heads)
        return cls(model=ModelSpec(**model), **rest)

    @cached_property
    def digest(self) -> bytes:
        """Stable digest of everything that decides the stored bytes' layout."""
        blob = json.dumps(self.to_record(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(b"kvstore.geometry.v1\0" + blob).digest()
