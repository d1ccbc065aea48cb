"""The remote tier's interface: what a distributed engine under the node-local NVMe tier must offer.

A ``RemoteTier`` stores opaque values under string keys that the store names
(``records.py``): extents (content-addressed: chunk hash, group and the
extent's own checksum), manifests, a chunk index (chunk hash -> a manifest
holding it) and the prefix directory (chunk hash -> nodes holding it on
their local tier).  It knows nothing of geometry, prefixes or the local
store; the store's parts (``store/remote_fill.py``, ``store/replication.py``)
decide what to move, a tier only moves it.

Acknowledgement: ``put_extents`` and ``put_manifest`` return only when the
engine says the values are replicated as configured (Redis: ``WAIT``);
otherwise they raise ``NotReplicated`` and the caller retries.  Every call
that cannot reach the engine raises ``RemoteUnavailable``: the caller
serves from its local tier and reports the remote tier degraded.  A value
the engine lost (evicted, expired) is ``None``: a remote miss, never an
error.

A new engine is a new file with a subclass registered in ``TIERS`` (by URL
scheme, ``make_tier``), and ``tests/unit/test_remote_tier.py`` runs the
same contract over every implementation.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass


class RemoteUnavailable(Exception):
    """The engine cannot be reached now (connection refused, timeout, cluster down)."""


class NotReplicated(RemoteUnavailable):
    """The values were written but fewer replicas than required acknowledged them in time."""


class RemoteFull(RemoteUnavailable):
    """The engine refuses writes for lack of memory (Redis: ``maxmemory`` with ``noeviction``); it still answers."""


class RemoteRefused(Exception):
    """The engine refuses this daemon for good (wrong password, TLS mismatch, unknown host): a configuration error."""


@dataclass(frozen=True)
class PutOutcome:
    """What a ``put_extents`` moved: values written (absent before) and their bytes; present ones are skipped."""

    written: int = 0
    written_bytes: int = 0
    present: int = 0


class RemoteTier(abc.ABC):
    """Storage primitives of a remote tier; every method may raise ``RemoteUnavailable``."""

    scheme = ""

    @abc.abstractmethod
    def put_extents(self, items: Sequence[tuple[str, bytes]], *, ttl_s: int = 0) -> PutOutcome:
        """Store each ``(key, value)`` whose key is absent (content-addressed keys: a present key holds the same
        bytes) and refresh the time to live of present ones (``ttl_s`` 0: none); acknowledged when replicated."""

    @abc.abstractmethod
    def get_extents(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), in order."""

    def get_extent(self, key: str) -> bytes | None:
        return self.get_extents([key])[0]

    def get_extents_into(self, keys: Sequence[str], outs: Sequence[memoryview], head: int) -> list[bytes | None]:
        """``get_extents`` that writes each value past its first ``head`` bytes into ``outs[i]``.

        Per key: None where absent; the leading ``head`` bytes where the value is
        ``head + len(outs[i])`` bytes long (the rest is in ``outs[i]``); the whole
        value, with nothing written, where its length is any other (the caller's
        check refuses it).  An engine that can receive into caller memory
        overrides this (a fill then skips one copy of every byte).
        """
        got = []
        for value, out in zip(self.get_extents(keys), outs):
            if value is not None and len(value) == head + len(out):
                out[:] = memoryview(value)[head:]
                value = bytes(value[:head])
            got.append(value)
        return got

    @abc.abstractmethod
    def put_manifest(self, manifest_id: str, value: bytes, chunk_hashes: Sequence[str], *, ttl_s: int = 0) -> None:
        """Store a manifest, then point the chunk index of each of ``chunk_hashes`` at it; acknowledged when replicated."""

    @abc.abstractmethod
    def get_manifest(self, manifest_id: str) -> bytes | None:
        """The manifest stored under ``manifest_id``, or None."""

    @abc.abstractmethod
    def holders(self, chunk_hashes: Sequence[str]) -> list[str | None]:
        """For each chunk hash, the id of a manifest that holds it (the chunk index), or None."""

    @abc.abstractmethod
    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key holds a value now."""

    @abc.abstractmethod
    def touch(self, keys: Sequence[str], ttl_s: int) -> None:
        """Extend the time to live of present keys to at least ``ttl_s`` seconds (a remote hit keeps a value longer)."""

    # ------------------------------------------------------------ prefix directory
    @abc.abstractmethod
    def directory_add(self, node_id: str, chunk_hashes: Sequence[str]) -> None:
        """Record that ``node_id`` holds these chunks on its local tier."""

    @abc.abstractmethod
    def directory_remove(self, node_id: str, chunk_hashes: Sequence[str]) -> None:
        """Record that ``node_id`` no longer holds these chunks."""

    @abc.abstractmethod
    def directory(self, chunk_hashes: Sequence[str]) -> list[frozenset[str]]:
        """For each chunk hash, the nodes that hold it locally."""

    @abc.abstractmethod
    def announce(self, node_id: str, info: str, ttl_s: int) -> None:
        """Say that ``node_id`` is alive (``info``: its address, free text) for ``ttl_s`` seconds."""

    @abc.abstractmethod
    def nodes(self) -> dict[str, str]:
        """Nodes that announced themselves and have not expired: ``{node_id: info}``."""

    # ------------------------------------------------------------ state
    def connect(self) -> None:
        """Reach the engine now: RemoteRefused for a configuration error, RemoteUnavailable when nobody answers."""

    @abc.abstractmethod
    def health(self) -> str | None:
        """None when every part of the engine answers; otherwise why not, in a few words."""

    def describe(self) -> str:
        """Where the tier is, for logs and ``kvstore-admin stats`` (no secrets)."""
        return self.scheme

    def close(self) -> None:
        """Let go of connections; a closed tier is not used again."""
