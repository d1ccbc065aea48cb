"""The self-describing trailer of a segment file (pure: bytes in, bytes out).

A segment file is its layout (``total_bytes``, unchanged) followed by a
trailer that starts at ``total_bytes`` (4 KiB aligned, so no data offset
moves) and is written before the file's fdatasync::

    head   magic "KVSTRAIL", body length (u32), xxh3-64 of the body (u64)
    body   JSON: store id, the segment record (geometry, num_tokens,
           first_chunk, every region's xxh3) and the manifest of the put
           that wrote the segment
    pad    zeros up to a multiple of 4 KiB, ending in the footer
    footer trailer offset (u64), magic "KVSTREND"

``kvstore-admin rebuild-index`` finds the trailer from the footer, checks its
own checksum, then the segment's regions against the record.
"""

from __future__ import annotations

import json
import struct

import xxhash

from .contract.geometry import ALIGN_BYTES, align_up

_HEAD = struct.Struct("<8sIQ")
_FOOT = struct.Struct("<Q8s")
HEAD_MAGIC = b"KVSTRAIL"
FOOT_MAGIC = b"KVSTREND"


def encode_trailer(offset: int, store_id: str, segment_record: dict, manifest: dict) -> bytes:
    """The trailer of a segment whose layout ends at ``offset``."""
    if offset % ALIGN_BYTES:
        raise ValueError(f"trailer offset {offset} is not {ALIGN_BYTES}-byte aligned")
    body = json.dumps({"store_id": store_id, "segment": segment_record, "manifest": manifest}, separators=(",", ":")).encode()
    head = _HEAD.pack(HEAD_MAGIC, len(body), xxhash.xxh3_64_intdigest(body))
    size = align_up(len(head) + len(body) + _FOOT.size)
    pad = bytes(size - len(head) - len(body) - _FOOT.size)
    return head + body + pad + _FOOT.pack(offset, FOOT_MAGIC)


def trailer_offset(footer: bytes) -> int:
    """Where the trailer starts, from the file's last 16 bytes; ValueError if absent."""
    if len(footer) != _FOOT.size:
        raise ValueError("file too short for a trailer")
    offset, magic = _FOOT.unpack(footer)
    if magic != FOOT_MAGIC or offset % ALIGN_BYTES:
        raise ValueError("no trailer footer")
    return offset


def decode_trailer(raw: bytes) -> dict:
    """``{"store_id", "segment", "manifest"}`` from the bytes at the trailer offset."""
    if len(raw) < _HEAD.size:
        raise ValueError("trailer truncated")
    magic, length, xxh3 = _HEAD.unpack_from(raw)
    body = raw[_HEAD.size : _HEAD.size + length]
    if magic != HEAD_MAGIC or len(body) != length:
        raise ValueError("trailer head damaged")
    if xxhash.xxh3_64_intdigest(body) != xxh3:
        raise ValueError("trailer checksum mismatch")
    return json.loads(body)
