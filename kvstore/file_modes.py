"""The modes of everything the daemon creates: directories 0750, files 0640.

The daemon's user reads and writes, its group (an operator's tools, a
backup) reads, others nothing.  Every directory and file is created with
these modes, so the process umask can narrow them but never widen them:
the data directory and its ``segments/``, ``manifests/``, ``conversations/``
and ``index/`` (created here before LMDB opens it, which would otherwise
make it 0755 and its files 0644), segment files (every I/O backend, a
compaction's copies too), manifest and record files and their temp files,
``STORE_ID``, ``LOCK``, the ready file, and the socket directory.  Sockets
are 0660 (``server/app.py``, ``server/shm_sessions.py``): a client in the
group must connect, which takes write permission.
"""

from __future__ import annotations

import os

DIR_MODE = 0o750
FILE_MODE = 0o640


def make_dirs(path: str) -> None:
    """Create ``path`` and every missing parent with ``DIR_MODE`` (``os.makedirs`` gives parents the default 0777)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent != path:
        make_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
