"""Per-prefix manifest files: which prefixes are live, kept outside the index.

Every committed prefix has ``manifests/man-<prefix id>.json`` in the data
directory, written and fsynced (file and directory) before its index commit
and removed (directory fsynced) after the index commit of its delete.  ``kvstore-admin rebuild-index`` restores exactly the
prefixes that have a manifest file (and whose pieces verify), so a deleted
prefix is never resurrected from a segment that another prefix still shares.

One writer per prefix: a put's check-write-commit and a delete's
commit-remove hold the prefix's lock, so a put never overwrites the file of
the prefix's committed manifest and a delete never removes a new one.
"""

from __future__ import annotations

import json
import os

from .file_modes import FILE_MODE, make_dirs
from .identity import fsync_dir
from .keyed_locks import KeyedLocks

PREFIX, SUFFIX, TMP = "man-", ".json", ".tmp"


def parse_manifest_file_name(name: str) -> str | None:
    """The prefix id of a manifest file name, else None."""
    if name.startswith(PREFIX) and name.endswith(SUFFIX) and len(name) == len(PREFIX) + 64 + len(SUFFIX):
        pid = name[len(PREFIX) : -len(SUFFIX)]
        if all(c in "0123456789abcdef" for c in pid):
            return pid
    return None


def is_manifest_file(name: str) -> bool:
    return name.startswith(PREFIX) and (name.endswith(SUFFIX) or name.endswith(SUFFIX + TMP))


class ManifestFiles:
    def __init__(self, directory: str):
        self.directory = directory
        make_dirs(directory)
        self._locks = KeyedLocks()

    def path(self, prefix_id: str) -> str:
        return os.path.join(self.directory, f"{PREFIX}{prefix_id}{SUFFIX}")

    def locked(self, prefix_id: str):
        """Hold the prefix's manifest lock for the block."""
        return self._locks.locked(prefix_id)

    def write(self, manifest: dict) -> None:
        """Write the file durably: temp file, fsync, rename, directory fsync."""
        path = self.path(manifest["prefix_id"])
        fd = os.open(path + TMP, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, json.dumps(manifest, separators=(",", ":")).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path + TMP, path)
        fsync_dir(self.directory)

    def remove(self, prefix_id: str) -> None:
        """Unlink the file durably (a rebuild must not find it again)."""
        try:
            os.unlink(self.path(prefix_id))
        except FileNotFoundError:
            return
        fsync_dir(self.directory)

    def scan(self) -> dict[str, str]:
        """Manifest files present: prefix id -> path."""
        out = {}
        for name in os.listdir(self.directory):
            pid = parse_manifest_file_name(name)
            if pid is not None:
                out[pid] = os.path.join(self.directory, name)
        return out

    @staticmethod
    def read(path: str) -> dict:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
