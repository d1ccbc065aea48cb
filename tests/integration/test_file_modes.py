"""What the daemon writes is 0750 (directories) and 0640 (files), whatever LMDB or a permissive umask would give."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from helpers import data_root, make_kv, make_tokens

from engine_client.client import KVStoreClient
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.file_modes import DIR_MODE, FILE_MODE

GEO = StoreGeometry(ModelSpec(4, 2, 8, "float16"), chunk_tokens=16, group_layers=2)


def modes_under(root: str) -> dict[str, str]:
    """Every directory and file under ``root`` (itself too) -> its mode in octal; sockets left out (0660 by design)."""
    out = {".": oct(stat.S_IMODE(os.stat(root).st_mode))}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                out[os.path.relpath(path, root)] = oct(stat.S_IMODE(st.st_mode))
    return out


def test_every_directory_is_0750_and_every_file_0640_under_a_permissive_umask(daemon_factory, tmp_path):
    root = tmp_path / "kv"  # the daemon creates it and the data directory inside
    data = str(root / "data")
    old_umask = os.umask(0o022)  # inherited by the daemon and the admin process
    try:
        d = daemon_factory(data_dir=data)
        with KVStoreClient(d.target) as client:
            tokens, kv = make_tokens(256, 0), make_kv(GEO, 256, 0)
            a = client.put_prefix(tokens, kv, GEO, model_fingerprint="m")
            b_tokens = tokens[:96].copy()
            b_tokens[64:] = make_tokens(32, 1)
            b = client.put_prefix(b_tokens, kv[:, :, :, :96], GEO, model_fingerprint="m")
            assert b.reused_chunks == 4
            client.delete(a.prefix_id)  # 4 of the segment's 16 chunks live: compacted into a new segment
            assert client.stats().compactions == 1
            client.append_turn("chat", 0, b.prefix_id)
        assert d.stop() == 0
        env = {**{k: v for k, v in os.environ.items() if k != "KVSTORE_SOCKET"}, "PYTHONPATH": data_root()}
        rebuilt = subprocess.run(
            [sys.executable, "-m", "kvstore_tools.admin", "--data-dir", data, "rebuild-index"],
            cwd=data_root(),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        d.start()
        with KVStoreClient(d.target) as client:
            assert client.get_conversation("chat").turns[0].prefix_id == b.prefix_id
        assert d.stop() == 0
    finally:
        os.umask(old_umask)

    found = modes_under(str(root))
    names = {os.path.basename(p) for p in found}
    assert {"segments", "manifests", "conversations", "index", "data.mdb", "lock.mdb", "STORE_ID", "LOCK"} <= names
    assert any(n.startswith("index.damaged-") for n in names)  # the rebuild's index set aside
    assert {p: m for p, m in found.items() if m != oct(DIR_MODE if os.path.isdir(os.path.join(root, p)) else FILE_MODE)} == {}
    # outside the data directory: the socket's directory and the ready file (the socket itself is 0660)
    assert oct(stat.S_IMODE(os.stat(os.path.dirname(d.socket)).st_mode)) == oct(DIR_MODE)
    assert oct(stat.S_IMODE(os.stat(d.ready).st_mode)) == oct(FILE_MODE)
