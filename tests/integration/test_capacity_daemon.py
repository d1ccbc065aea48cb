"""Disk capacity through a real daemon: an open stream keeps its prefix, admin evict/compact/stats."""

import json
import os
import subprocess
import sys

import numpy as np
from helpers import data_root, make_kv, make_tokens

from engine_client.client import KVStoreClient
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.layout import SegmentLayout

GEO = StoreGeometry(ModelSpec(4, 1, 16, "float16"), chunk_tokens=16, group_layers=2)
TOKENS = 256
SEG_BYTES = SegmentLayout(GEO, TOKENS).total_bytes


def admin(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": data_root()}
    cmd = [sys.executable, "-m", "kvstore_tools.admin", *argv]
    return subprocess.run(cmd, cwd=data_root(), env=env, capture_output=True, text=True, timeout=120)


def test_an_open_prefetch_stream_keeps_its_prefix_through_an_eviction(daemon_factory):
    d = daemon_factory("--max-disk-bytes", str(4 * SEG_BYTES))
    with KVStoreClient(d.target) as client:
        pids = [client.put_prefix(make_tokens(TOKENS, s), make_kv(GEO, TOKENS, s), GEO).prefix_id for s in range(3)]
        # unscored: the oldest (pids[0]) is the victim unless it is in use
        with client.prefetch(pids[0], period_layers=2) as st:
            new = client.put_prefix(make_tokens(TOKENS, 3), make_kv(GEO, TOKENS, 3), GEO).prefix_id
            st.send(0, list(range(16)))
            got = dict(st.groups(0))
        np.testing.assert_array_equal(got[0], make_kv(GEO, TOKENS, 0)[0:2])
        listed = {p.prefix_id for p in client.list_prefixes()}
        assert listed == {pids[0], pids[2], new}
        stats = client.stats()
        assert stats.evictions == 1 and stats.disk_used_bytes == 3 * SEG_BYTES
        assert stats.max_disk_bytes == 4 * SEG_BYTES

    sock = ["--socket", d.socket]
    text = admin(*sock, "stats").stdout
    assert "of max_disk_bytes" in text and "evictions" in text
    res = admin(*sock, "--json", "evict", "--to-bytes", str(SEG_BYTES))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["evicted"] == [pids[0], pids[2]]
    assert json.loads(admin(*sock, "--json", "compact").stdout)["segments_compacted"] == 0
    bad = admin(*sock, "evict", "--to-bytes", "-5")
    assert bad.returncode == 2 and "--to-bytes: must not be negative" in bad.stderr
    assert admin(*sock, "--json", "stats").returncode == 0
    d.stop()

    offline = admin("--data-dir", d.data_dir, "--json", "evict", "--to-bytes", "0")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["evicted"] == [new]
    assert json.loads(admin("--data-dir", d.data_dir, "--json", "ls").stdout) == []
