"""Per-conversation record files: the conversation records, kept outside the index.

Every conversation record is also ``conversations/conv-<sha256 of its key>.json``
in the data directory (the key is the namespace, NUL, the conversation id;
the record names both).  A change writes the file durably (temp file,
fsync, rename, directory fsync) before its index commit, a delete removes
it (directory fsynced) after the index commit, so ``kvstore-admin
rebuild-index`` restores exactly the records the daemon acknowledged.  When
the store opens with a clean index, the files are made to match it: a file
left by a change killed before its commit is rewritten or removed.
"""

from __future__ import annotations

import hashlib
import json
import os

from .file_modes import make_dirs
from .identity import fsync_dir, write_atomic

PREFIX, SUFFIX, TMP = "conv-", ".json", ".tmp"
DIRECTORY = "conversations"


def file_name(key: bytes) -> str:
    return f"{PREFIX}{hashlib.sha256(key).hexdigest()}{SUFFIX}"


def is_conversation_file(name: str) -> bool:
    return name.startswith(PREFIX) and (name.endswith(SUFFIX) or name.endswith(SUFFIX + TMP))


class ConversationFiles:
    def __init__(self, directory: str):
        self.directory = directory
        make_dirs(directory)

    def path(self, key: bytes) -> str:
        return os.path.join(self.directory, file_name(key))

    def write(self, key: bytes, record: dict) -> None:
        """Write the file durably: temp file, fsync, rename, directory fsync."""
        write_atomic(self.path(key), encode(record))

    def remove(self, key: bytes) -> None:
        """Unlink the file durably (a rebuild must not find it again)."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            return
        fsync_dir(self.directory)

    def names(self) -> list[str]:
        """Every file of this directory that is or was being written as a record file."""
        return sorted(n for n in os.listdir(self.directory) if is_conversation_file(n))

    def read(self, name: str) -> dict:
        with open(os.path.join(self.directory, name), "rb") as fh:
            return json.loads(fh.read())


def encode(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
