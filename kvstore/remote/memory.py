"""``MemoryTier``: the remote tier in this process's memory (``memory://``), for tests and the in-process demo.

It keeps the contract of ``RemoteTier`` exactly (absent keys are written,
present ones kept; the chunk index after the manifest; ``None`` for a
missing value) and can be switched off (``available = False``) to act as an
unreachable engine.  Times to live are kept but not enforced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .base import PutOutcome, RemoteTier, RemoteUnavailable


class MemoryTier(RemoteTier):
    scheme = "memory"

    def __init__(self):
        self._lock = threading.Lock()
        self.values: dict[str, bytes] = {}
        self.ttls: dict[str, int] = {}
        self._directory: dict[str, set[str]] = {}
        self._nodes: dict[str, tuple[str, float]] = {}
        self.available = True

    def _check(self) -> None:
        if not self.available:
            raise RemoteUnavailable("memory tier switched off")

    def put_extents(self, items: Sequence[tuple[str, bytes]], *, ttl_s: int = 0) -> PutOutcome:
        self._check()
        written = nbytes = present = 0
        with self._lock:
            for key, value in items:
                if key in self.values:
                    present += 1
                else:
                    self.values[key] = bytes(value)
                    written += 1
                    nbytes += len(value)
                if ttl_s:
                    self.ttls[key] = max(self.ttls.get(key, 0), ttl_s)
        return PutOutcome(written, nbytes, present)

    def get_extents(self, keys: Sequence[str]) -> list[bytes | None]:
        self._check()
        with self._lock:
            return [self.values.get(k) for k in keys]

    def put_manifest(self, manifest_id: str, value: bytes, chunk_hashes: Sequence[str], *, ttl_s: int = 0) -> None:
        self._check()
        with self._lock:
            self.values[f"kvm:{manifest_id}"] = bytes(value)
            for h in chunk_hashes:
                self.values[f"kvc:{h}"] = manifest_id.encode()

    def get_manifest(self, manifest_id: str) -> bytes | None:
        self._check()
        with self._lock:
            return self.values.get(f"kvm:{manifest_id}")

    def holders(self, chunk_hashes: Sequence[str]) -> list[str | None]:
        self._check()
        with self._lock:
            found = [self.values.get(f"kvc:{h}") for h in chunk_hashes]
        return [v.decode() if v is not None else None for v in found]

    def exists(self, keys: Sequence[str]) -> list[bool]:
        self._check()
        with self._lock:
            return [k in self.values for k in keys]

    def touch(self, keys: Sequence[str], ttl_s: int) -> None:
        self._check()
        with self._lock:
            for k in keys:
                if k in self.values:
                    self.ttls[k] = max(self.ttls.get(k, 0), ttl_s)

    def directory_add(self, node_id: str, chunk_hashes: Sequence[str]) -> None:
        self._check()
        with self._lock:
            for h in chunk_hashes:
                self._directory.setdefault(h, set()).add(node_id)

    def directory_remove(self, node_id: str, chunk_hashes: Sequence[str]) -> None:
        self._check()
        with self._lock:
            for h in chunk_hashes:
                self._directory.get(h, set()).discard(node_id)

    def directory(self, chunk_hashes: Sequence[str]) -> list[frozenset[str]]:
        self._check()
        with self._lock:
            return [frozenset(self._directory.get(h, ())) for h in chunk_hashes]

    def announce(self, node_id: str, info: str, ttl_s: int) -> None:
        self._check()
        with self._lock:
            self._nodes[node_id] = (info, time.monotonic() + ttl_s)

    def nodes(self) -> dict[str, str]:
        self._check()
        now = time.monotonic()
        with self._lock:
            return {n: info for n, (info, until) in self._nodes.items() if until > now}

    def health(self) -> str | None:
        return None if self.available else "memory tier switched off"
