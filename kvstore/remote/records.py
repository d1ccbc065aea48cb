"""What the remote tier holds, as bytes: extent values, manifests and their keys (pure: no I/O).

Keys.  An extent's key is ``kvx:{<chunk hash>}:<group>:<xxh3>``: the chunk
hash already covers the namespace, the model fingerprint, the geometry's
digest (layout, dtype, quantization) and every token up to the chunk's end
(``hashing.chunk_hashes``), so two layouts or two models never share a key;
the extent's own checksum in the key makes it content-addressed, so two
nodes that computed the same bytes write one value, and two that computed
different bytes (another GPU, another batch) never overwrite each other.
The braces are a Redis Cluster hash tag: every group of one chunk lives in
one slot.

Values.  An extent value is a 16-byte header (``KVX1``, payload length,
xxh3-64 of the payload) and the payload; a manifest value is ``KVM1``, the
xxh3-64 of its JSON, and the JSON.  ``decode_extent`` checks a value
against its header, the length its geometry gives and the checksum its key
and its manifest name: a value truncated, overwritten or swapped behind the
daemon's back fails one of the three and is never served.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import xxhash

from ..contract.geometry import StoreGeometry
from ..contract.layout import SegmentLayout

EXTENT_MAGIC = b"KVX1"
MANIFEST_MAGIC = b"KVM1"
_EXTENT_HEADER = struct.Struct("<4sIQ")  # magic, payload bytes, xxh3-64 of the payload
EXTENT_HEAD = _EXTENT_HEADER.size  # bytes before an extent value's payload
_MANIFEST_HEADER = struct.Struct("<4sQ")  # magic, xxh3-64 of the JSON
MANIFEST_VERSION = 1
_HEX = frozenset("0123456789abcdef")


class RemoteChecksumError(Exception):
    """A remote value does not match its checksum, its length or its manifest: never served."""


def is_hash_hex(text) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


def extent_key(chunk_hash: str, group: int, xxh3: int) -> str:
    """The content-addressed key of one extent (see the module docstring)."""
    return f"kvx:{{{chunk_hash}}}:{group}:{xxh3:016x}"


def encode_extent(payload) -> tuple[int, bytes]:
    """``(xxh3, value)`` of an extent's bytes."""
    data = memoryview(payload).cast("B") if not isinstance(payload, np.ndarray) else memoryview(np.ascontiguousarray(payload)).cast("B")
    xxh3 = xxhash.xxh3_64_intdigest(data)
    return xxh3, _EXTENT_HEADER.pack(EXTENT_MAGIC, data.nbytes, xxh3) + bytes(data)


def decode_extent(value: bytes, *, length: int, xxh3: int) -> memoryview:
    """The payload of an extent value that must hold ``length`` bytes hashing to ``xxh3``; else RemoteChecksumError."""
    n = _EXTENT_HEADER.size
    if len(value) < n:
        raise RemoteChecksumError(f"value of {len(value)} bytes is shorter than its header")
    payload = memoryview(value)[n:]
    check_extent(value[:n], payload, length=length, xxh3=xxh3)
    return payload


def check_extent(head: bytes, payload: memoryview, *, length: int, xxh3: int) -> None:
    """RemoteChecksumError unless ``head`` (an extent value's ``EXTENT_HEAD`` bytes) and the ``payload`` after it
    hold ``length`` bytes hashing to ``xxh3`` (a fill receives the payload in place: ``get_extents_into``)."""
    magic, size, stored = _EXTENT_HEADER.unpack_from(head)
    if magic != EXTENT_MAGIC:
        raise RemoteChecksumError("value is not an extent (bad magic)")
    if size != length or payload.nbytes != length:
        raise RemoteChecksumError(f"value holds {payload.nbytes} bytes (header says {size}), the extent has {length}")
    if stored != xxh3:
        raise RemoteChecksumError(f"header checksum {stored:016x} is not the manifest's {xxh3:016x}")
    if xxhash.xxh3_64_intdigest(payload) != xxh3:
        raise RemoteChecksumError("payload does not match its checksum")


@dataclass(frozen=True)
class RemoteManifest:
    """A prefix (or page batch) as the remote tier holds it: what a node needs to rebuild it locally."""

    prefix_id: str
    namespace: str
    model_fingerprint: str
    geometry: StoreGeometry
    num_tokens: int
    chunk_hashes: tuple[str, ...]
    kind: str
    extent_xxh3: np.ndarray  # [chunks, groups] uint64: the checksum (and key part) of every extent

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_hashes)

    def extent_key(self, chunk: int, group: int) -> str:
        return extent_key(self.chunk_hashes[chunk], group, int(self.extent_xxh3[chunk, group]))

    def extent_length(self, chunk: int, group: int) -> int:
        """Bytes of the extent of ``chunk`` in ``group`` (the last chunk of a prefix may be short)."""
        return int(self._extent_lengths[chunk, group])

    @cached_property
    def _extent_lengths(self) -> np.ndarray:
        """``[chunks, groups]`` extent bytes (a fill asks for each of them)."""
        return SegmentLayout(self.geometry, self.num_tokens).extent_lengths.T

    def tokens_upto(self, num_chunks: int) -> int:
        """Tokens of the sub-prefix of the first ``num_chunks`` chunks."""
        return self.num_tokens if num_chunks >= self.num_chunks else num_chunks * self.geometry.chunk_tokens


def encode_manifest(m: RemoteManifest) -> bytes:
    doc = {
        "version": MANIFEST_VERSION,
        "prefix_id": m.prefix_id,
        "namespace": m.namespace,
        "model_fingerprint": m.model_fingerprint,
        "geometry": m.geometry.to_record(),
        "num_tokens": m.num_tokens,
        "chunk_hashes": list(m.chunk_hashes),
        "kind": m.kind,
        "extent_xxh3": [[f"{x:016x}" for x in row] for row in m.extent_xxh3.tolist()],
    }
    blob = json.dumps(doc, separators=(",", ":")).encode()
    return _MANIFEST_HEADER.pack(MANIFEST_MAGIC, xxhash.xxh3_64_intdigest(blob)) + blob


def decode_manifest(value: bytes, manifest_id: str) -> RemoteManifest:
    """The manifest in ``value``, checked whole (checksum, fields, shapes); RemoteChecksumError otherwise."""
    n = _MANIFEST_HEADER.size
    if len(value) < n:
        raise RemoteChecksumError(f"manifest {manifest_id}: {len(value)} bytes, shorter than its header")
    magic, xxh3 = _MANIFEST_HEADER.unpack_from(value)
    blob = memoryview(value)[n:]
    if magic != MANIFEST_MAGIC or xxhash.xxh3_64_intdigest(blob) != xxh3:
        raise RemoteChecksumError(f"manifest {manifest_id}: bad magic or checksum")
    try:
        doc = json.loads(bytes(blob))
        geometry = StoreGeometry.from_dict(doc["geometry"])
        hashes = tuple(doc["chunk_hashes"])
        xx = np.array([[int(x, 16) for x in row] for row in doc["extent_xxh3"]], dtype=np.uint64)
        m = RemoteManifest(
            prefix_id=doc["prefix_id"],
            namespace=doc["namespace"],
            model_fingerprint=doc["model_fingerprint"],
            geometry=geometry,
            num_tokens=int(doc["num_tokens"]),
            chunk_hashes=hashes,
            kind=doc["kind"],
            extent_xxh3=xx.reshape(len(hashes), geometry.num_groups),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteChecksumError(f"manifest {manifest_id}: undecodable ({exc})") from None
    if doc.get("version") != MANIFEST_VERSION or m.prefix_id != manifest_id or not all(is_hash_hex(h) for h in hashes):
        raise RemoteChecksumError(f"manifest {manifest_id}: wrong version, id or chunk hashes")
    if geometry.num_chunks(m.num_tokens) != len(hashes):
        raise RemoteChecksumError(f"manifest {manifest_id}: {m.num_tokens} tokens do not make {len(hashes)} chunks")
    return m
