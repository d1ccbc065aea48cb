"""A segment file truncated or removed under a running daemon is DATA_LOSS and quarantined."""

import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError

GEO = GEOMETRIES[2]  # 4 layers, 2 heads, dim 64, fp16, one period group


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage", [_truncate, os.unlink], ids=["truncated", "removed"])
def test_lost_segment_file_is_data_loss_and_quarantined(daemon, damage):
    with KVStoreClient(daemon.target) as client:
        victim = client.put_prefix(make_tokens(64, 1), make_kv(GEO, 64, 1), GEO).prefix_id
        other_kv = make_kv(GEO, 64, 2)
        other = client.put_prefix(make_tokens(64, 2), other_kv, GEO).prefix_id
        (seg,) = client.inspect(victim)["segments"]
        damage(os.path.join(daemon.data_dir, "segments", seg["file"]))

        with pytest.raises(KVStoreRpcError) as err:
            client.read_chunks(victim, [2, 3], shm=False)
        assert err.value.code == grpc.StatusCode.DATA_LOSS
        # quarantined at once: every later read is refused, on both data paths
        assert "unreadable" in client.describe(victim).quarantined
        for shm in (False, True):
            with pytest.raises(KVStoreRpcError) as err:
                client.read_chunks(victim, [0], shm=shm)
            assert err.value.code == grpc.StatusCode.DATA_LOSS
        with client.read_chunks(other, range(4), shm=False) as got:
            np.testing.assert_array_equal(got.to_kv(), other_kv)

    ls = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", "--socket", daemon.socket, "ls", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": data_root()},
        cwd=data_root(),
        timeout=60,
    )
    rows = {r["prefix_id"]: r for r in json.loads(ls.stdout)}
    assert "unreadable" in rows[victim]["quarantined"] and rows[other]["quarantined"] is None
    assert "Traceback" not in daemon.log()


def test_lost_segment_summaries_are_data_loss(daemon):
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(make_tokens(40, 3), make_kv(GEO, 40, 3), GEO).prefix_id
        (seg,) = client.inspect(pid)["segments"]
        os.unlink(os.path.join(daemon.data_dir, "segments", seg["file"]))
        with pytest.raises((KVStoreRpcError, grpc.RpcError)) as err:
            client.get_summaries(pid)
        code = err.value.code
        assert (code() if callable(code) else code) == grpc.StatusCode.DATA_LOSS
        assert client.describe(pid).quarantined
