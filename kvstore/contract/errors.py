"""Domain errors of the chunk store.

Each maps to exactly one gRPC status code in the service layer; nothing else
in the store raises for a caller's mistake or a storage failure.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base class of every error the store reports to a caller."""

    code = "INTERNAL"


class InvalidArgument(KVStoreError, ValueError):
    """A request field is malformed or inconsistent with the stored geometry."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class NotFound(KVStoreError, KeyError):
    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError quotes its argument; we do not
        return str(self.args[0]) if self.args else ""


class StoreFull(KVStoreError):
    """The data file system (or the index map) has no room for a write."""

    code = "RESOURCE_EXHAUSTED"


class ReadOnly(KVStoreError):
    """The store refuses writes: a durability failure made it read-only."""

    code = "FAILED_PRECONDITION"


class DataLoss(KVStoreError):
    """Stored bytes do not match their checksum, or a segment file is missing."""

    code = "DATA_LOSS"


class Conflict(KVStoreError):
    """A concurrent change invalidated this request; retrying it is safe."""

    code = "ABORTED"


class StoreLocked(KVStoreError):
    """Another process has the data directory open."""

    code = "FAILED_PRECONDITION"


class BackendUnavailable(KVStoreError):
    """The configured I/O backend cannot run on this machine."""

    code = "FAILED_PRECONDITION"


class FailedPrecondition(KVStoreError):
    """The request refers to state that no longer allows it (e.g. a released lease)."""

    code = "FAILED_PRECONDITION"


class PermissionDenied(KVStoreError):
    """The caller's credentials do not allow this namespace."""

    code = "PERMISSION_DENIED"


class IndexDamaged(KVStoreError):
    """The index is missing, damaged, or not this store's: the store refuses to open."""

    code = "FAILED_PRECONDITION"


class StartupError(KVStoreError):
    """The daemon cannot start: what a configuration key names cannot be used (its directory, its memory)."""

    code = "FAILED_PRECONDITION"

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
