"""A missing, truncated or foreign index is refused, deletes nothing, and is rebuilt from the segments."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.errors import IndexDamaged
from kvstore.store import ChunkStore

GEO = GEOMETRIES[2]  # 4 layers, 2 heads, dim 64, fp16, chunks of 16 tokens


def populate(data: str) -> tuple[dict[str, np.ndarray], str]:
    """Stored prefixes (id -> kv) and one prefix deleted whose segment another still shares."""
    tokens_a, kv_a = make_tokens(100, 1), make_kv(GEO, 100, 1)
    tokens_b = np.concatenate([tokens_a[:80], make_tokens(50, 2)])  # shares A's 5 leading chunks
    kv_b = make_kv(GEO, 130, 2)
    kv_b[:, :, :, :80] = kv_a[:, :, :, :80]
    tokens_d, kv_d = make_tokens(90, 4), make_kv(GEO, 90, 4)
    tokens_e = np.concatenate([tokens_d[:48], make_tokens(30, 5)])  # keeps D's segment alive
    kv_e = make_kv(GEO, 78, 5)
    kv_e[:, :, :, :48] = kv_d[:, :, :, :48]
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        stored = {}
        for tokens, kv in [
            (tokens_a, kv_a),
            (tokens_b, kv_b),
            (tokens_a[:64], kv_a[:, :, :, :64]),
            (make_tokens(40, 3), make_kv(GEO, 40, 3)),
            (tokens_d, kv_d),
            (tokens_e, kv_e),
        ]:
            res = store.put(tokens, kv, GEO)
            stored[res.prefix_id] = kv
        assert store.put(tokens_a[:64], kv_a[:, :, :, :64], GEO).bytes_written == 0  # fully reused: no segment
        deleted = store.put(tokens_d, kv_d, GEO).prefix_id
        store.delete(deleted)
        del stored[deleted]
    return stored, deleted


def admin(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": data_root()},
        cwd=data_root(),
        timeout=120,
    )


def files(data: str) -> list[str]:
    return sorted(os.listdir(os.path.join(data, "segments")) + os.listdir(os.path.join(data, "manifests")))


def _remove(path):
    os.unlink(path)


def _empty(path):
    os.truncate(path, 0)


def _half(path):
    os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage", [_remove, _empty, _half], ids=["removed", "empty", "half"])
def test_damaged_index_is_refused_then_rebuilt(tmp_path, damage):
    data = str(tmp_path / "data")
    stored, deleted = populate(data)
    before = files(data)
    damage(os.path.join(data, "index", "data.mdb"))

    ls = admin("--data-dir", data, "ls")
    assert ls.returncode == 1 and ls.stdout == ""
    (line,) = ls.stderr.splitlines()  # one line, no traceback
    assert "data.mdb" in line and f"kvstore-admin rebuild-index --data-dir {data}" in line
    with pytest.raises(IndexDamaged):
        ChunkStore(StoreConfig(data_dir=data))
    assert files(data) == before  # nothing deleted

    rebuilt = admin("--data-dir", data, "rebuild-index", "--json")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    report = json.loads(rebuilt.stdout)
    assert sorted(report["restored"]) == sorted(stored) and report["skipped"] == {}
    assert os.path.isdir(report["moved_aside"])  # the damaged index is kept
    with ChunkStore(StoreConfig(data_dir=data)) as store:
        assert sorted(p["prefix_id"] for p in store.list_prefixes()) == sorted(stored)
        assert deleted not in {p["prefix_id"] for p in store.list_prefixes()}
        for pid, kv in stored.items():
            n = store.describe(pid).num_chunks
            np.testing.assert_array_equal(store.read(pid, range(n)).to_kv(), kv)
        assert all(r["ok"] and not r["quarantined"] for r in store.verify())


def test_daemon_refuses_a_missing_index_in_one_line(tmp_path, daemon_factory):
    data = str(tmp_path / "data")
    populate(data)
    before = files(data)
    os.unlink(os.path.join(data, "index", "data.mdb"))
    d = daemon_factory(data_dir=data, start=False)
    proc = subprocess.run(d.args, env=d.env, cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "data.mdb" in ln]
    assert "is missing" in line and "rebuild-index" in line
    assert files(data) == before


def test_foreign_or_garbage_index_is_refused(tmp_path):
    data, other = str(tmp_path / "data"), str(tmp_path / "other")
    populate(data)
    ChunkStore(StoreConfig(data_dir=other)).close()
    before = files(data)
    index = os.path.join(data, "index", "data.mdb")
    saved = index + ".saved"
    shutil.copy(index, saved)
    shutil.copy(os.path.join(other, "index", "data.mdb"), index)  # another store's (empty) index
    with pytest.raises(IndexDamaged, match="belongs to store"):
        ChunkStore(StoreConfig(data_dir=data))
    with open(index, "r+b") as fh:  # garbage over the meta pages
        fh.write(os.urandom(8192))
    with pytest.raises(IndexDamaged, match="no valid LMDB meta page"):
        ChunkStore(StoreConfig(data_dir=data))
    assert files(data) == before
    shutil.copy(saved, index)
    with ChunkStore(StoreConfig(data_dir=data)) as store:
        assert len(store.list_prefixes()) == 5
