"""The console tools as a user runs them: ``kvstore-demo``, ``kvstore-admin``
(real subprocesses on a real data dir) and a smoke run of the chunked bench."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from helpers import assert_png

from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.layout import SegmentLayout
from kvstore.io import resolve_backend
from kvstore.store import ChunkStore
from kvstore_tools.bench.chunked import run_chunked
from kvstore_tools.bench.plots import plot_io
from kvstore_tools.synthetic import synthetic_kv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--tokens", "300", "--layers", "3", "--kv-heads", "1", "--head-dim", "8", "--group-layers", "2"]
GEO = StoreGeometry(ModelSpec(3, 1, 8, "bfloat16"), chunk_tokens=16, group_layers=2)  # groups of 2 and 1 layers
NUM_TOKENS = 100  # 7 chunks, the last one 4 tokens


def run_module(module: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", module, *argv]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def admin(data_dir, *argv: str) -> subprocess.CompletedProcess:
    return run_module("kvstore_tools.admin", "--data-dir", str(data_dir), *argv)


# ------------------------------------------------------------ kvstore-demo
def test_demo_through_a_daemon_stores_shares_reads_and_verifies(tmp_path):
    data_dir = str(tmp_path / "data")
    socket_path = os.path.join(tempfile.mkdtemp(prefix="kvdemo", dir="/tmp"), "kvstore.sock")  # short: sun_path limit
    args = ("kvstore_tools.demo", "--data-dir", data_dir, "--min-free-bytes", "0", "--socket-path", socket_path, *TINY)
    proc = run_module(*args)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "daemon: unix:" in out
    assert "put A: 300 tokens, 19 chunks, reused 0 chunks" in out
    assert "put B: 300 tokens, 19 chunks, reused 14 chunks" in out  # 3/4 of 300 tokens, whole chunks
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith(("5%", "25%", "100%"))]
    assert [r[:2] for r in rows] == [[b, p] for b in ("5%", "25%", "100%") for p in ("shm", "bytes")]
    assert [r[-1] for r in rows] == ["yes"] * 6  # bit-exact on both data paths
    assert "verify: 2 segments" in out and "all ok" in out
    assert f"I/O backend: {resolve_backend('auto')[0]} (" in proc.stderr and "stopped" in proc.stderr  # the daemon's log, then its drain

    again = run_module(*args)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already stored, nothing written") == 2


def test_demo_in_process(tmp_path):
    proc = run_module("kvstore_tools.demo", "--in-process", "--data-dir", str(tmp_path / "d"), "--min-free-bytes", "0", *TINY)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.lstrip().startswith(("5%", "25%", "100%"))]
    assert [r[1] for r in rows] == ["in-process"] * 3 and [r[-1] for r in rows] == ["yes"] * 3


def test_demo_bad_geometry_is_an_error(tmp_path):
    proc = run_module("kvstore_tools.demo", "--in-process", "--data-dir", str(tmp_path), *TINY, "--period-layers", "5000")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: group_layers")


def test_serve_rejects_an_invalid_configuration():
    proc = run_module("kvstore.cli", "serve", "--tcp-address", "127.0.0.1:0")
    assert proc.returncode == 2
    assert "tcp_address" in proc.stderr and "TLS" in proc.stderr


def test_health_finds_serve_on_its_default_socket(tmp_path):
    """``kvstore serve & kvstore health`` with no flags: one default socket (ServerConfig's), relative to the directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    env["PYTHONPATH"] = ROOT
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "kvstore.cli", "serve", "--ready-file", str(ready), "--min-free-bytes", "0", "--shm-arena-bytes", "4MiB"]
    daemon = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, daemon.stderr.read() if daemon.poll() is not None else ""
            time.sleep(0.05)
        health = subprocess.run(
            [sys.executable, "-m", "kvstore.cli", "health"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert health.returncode == 0 and health.stdout.strip() == "SERVING", health.stderr
        assert (tmp_path / ".kvstore" / "run" / "kvstore.sock").exists()
    finally:
        daemon.terminate()
        daemon.wait(60)
        daemon.stderr.close()
    gone = subprocess.run(
        [sys.executable, "-m", "kvstore.cli", "health"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 1 and ".kvstore/run/kvstore.sock" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------ kvstore-admin
@pytest.fixture
def populated(store_config):
    """A closed store with prefix A and prefix B sharing A's first 4 chunks."""
    rng = np.random.default_rng(7)
    shape = (3, 2, 1, NUM_TOKENS, 8)
    tokens_a = rng.integers(0, 50_000, NUM_TOKENS)
    tokens_b = np.concatenate([tokens_a[:64], rng.integers(0, 50_000, NUM_TOKENS - 64)])
    with ChunkStore(store_config) as store:
        a = store.put(tokens_a, synthetic_kv(rng, shape, "bfloat16"), GEO).prefix_id
        b = store.put(tokens_b, synthetic_kv(rng, shape, "bfloat16"), GEO).prefix_id
    return store_config.data_dir, a, b


def test_admin_ls_inspect_stats(populated):
    data_dir, a, b = populated
    proc = admin(data_dir, "ls")
    assert proc.returncode == 0, proc.stderr
    assert a[:16] in proc.stdout and b[:16] in proc.stdout and "2 prefixes" in proc.stdout

    listed = json.loads(admin(data_dir, "ls", "--json").stdout)
    assert {p["prefix_id"] for p in listed} == {a, b}
    assert json.loads(admin(data_dir, "--json", "ls").stdout) == listed

    human = admin(data_dir, "inspect", b[:12])
    assert human.returncode == 0, human.stderr
    assert b in human.stdout and "seg-" in human.stdout
    info = json.loads(admin(data_dir, "inspect", b[:12], "--json").stdout)
    assert info["prefix_id"] == b and info["num_chunks"] == 7
    assert [(s["first_chunk"], s["num_chunks"], s["refcount"]) for s in info["segments"]] == [(0, 4, 2), (4, 3, 1)]

    stats = json.loads(admin(data_dir, "stats", "--json").stdout)
    assert (stats["num_prefixes"], stats["num_segments"]) == (2, 2)
    assert "KiB" in admin(data_dir, "stats").stdout


def test_admin_inspect_and_verify_a_streaming_layout_prefix(store_config):
    geo = StoreGeometry(ModelSpec(3, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2, streaming_heads=((0,), (), (1,)))
    rng = np.random.default_rng(3)
    with ChunkStore(store_config) as store:
        pid = store.put(rng.integers(0, 50_000, NUM_TOKENS), synthetic_kv(rng, (3, 2, 2, NUM_TOKENS, 8), "bfloat16"), geo).prefix_id
    info = json.loads(admin(store_config.data_dir, "inspect", pid, "--json").stdout)
    assert info["streaming_heads"] == 2 and info["kv_bytes"] * 6 == info["kv_bytes_full_layout"] * 4
    human = admin(store_config.data_dir, "inspect", pid)
    assert "2 streaming (layer, KV head) pairs left out" in human.stdout and "1.50x smaller" in human.stdout
    proc = admin(store_config.data_dir, "verify", "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    os.remove(os.path.join(store_config.data_dir, "index", "data.mdb"))  # the layout reads back from trailer and manifest
    rebuilt = admin(store_config.data_dir, "rebuild-index", "--json")
    assert json.loads(rebuilt.stdout)["restored"] == [pid], rebuilt.stderr
    assert json.loads(admin(store_config.data_dir, "inspect", pid, "--json").stdout)["geometry"] == info["geometry"]


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:  # buffered, not O_DIRECT: any offset will do
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
        fh.flush()
        os.fsync(fh.fileno())


def test_admin_verify_finds_a_flipped_byte(populated):
    data_dir, a, b = populated
    ok = admin(data_dir, "verify", "--all")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 segments, 0 bad" in ok.stdout

    info = json.loads(admin(data_dir, "inspect", a, "--json").stdout)
    (seg,) = info["segments"]
    layout = SegmentLayout(GEO, NUM_TOKENS)
    seg_path = os.path.join(data_dir, "segments", seg["file"])
    _flip_byte(seg_path, int(layout.extent_offsets[1, 2]) + 3)

    bad = admin(data_dir, "verify", "--all")
    assert bad.returncode == 1
    assert "BAD" in bad.stdout and "extent[group=1,chunk=2]" in bad.stdout
    report = json.loads(admin(data_dir, "verify", a[:10], "--json").stdout)
    assert report["ok"] is False
    assert [r["ok"] for r in report["segments"]] == [False]
    assert "QUARANTINED" in admin(data_dir, "ls").stdout

    _flip_byte(seg_path, int(layout.extent_offsets[1, 2]) + 3)  # bytes good again, quarantine stays
    still = admin(data_dir, "verify", "--all")
    assert still.returncode == 1 and "QUARANTINED" in still.stdout


def test_admin_delete_and_unknown_prefix(populated):
    data_dir, a, b = populated
    proc = admin(data_dir, "delete", b[:10])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(admin(data_dir, "ls", "--json").stdout)[0]["prefix_id"] == a
    gone = admin(data_dir, "inspect", b[:10])
    assert gone.returncode == 1 and gone.stderr.startswith("error: ")
    assert admin(data_dir, "verify").returncode == 0
    assert admin(data_dir, "delete", a).returncode == 0
    assert os.listdir(os.path.join(data_dir, "segments")) == []


def test_admin_without_a_store(tmp_path):
    proc = admin(tmp_path / "nothing", "ls")
    assert proc.returncode == 1 and proc.stderr.startswith("error: no kvstore data directory")
    assert not (tmp_path / "nothing").exists()


# ------------------------------------------------------------ chunked bench
def bench_args(data_dir, **over) -> argparse.Namespace:
    base = dict(
        budget=[0.05, 0.25],
        layers=4,
        kv_heads=1,
        head_dim=8,
        dtype="bfloat16",
        tokens=512,
        chunk_tokens=16,
        group_layers=8,
        selection="both",
        data_dir=str(data_dir),
        runtime=0.2,
        seed=3,
        json=False,
        backend="posix",
        iodepth=4,
        direct=1,
    )
    return argparse.Namespace(**{**base, **over})


def test_chunked_bench_smoke(tmp_path, capsys):
    report = run_chunked(bench_args(tmp_path / "bench"))
    json.dumps(report)
    assert "extent padding" in capsys.readouterr().out
    # one group of 4 layers; an extent is 4 layers x 16 tokens x K,V x 1 head x 8 dims x 2 bytes
    extent_bytes = 4 * 16 * 2 * 1 * 8 * 2
    padded_bytes = -(-extent_bytes // 4096) * 4096
    assert [(p["extent_bytes"], p["padded_bytes"]) for p in report["padding"]] == [(extent_bytes, padded_bytes)]
    cases = report["cases"]
    assert len(cases) == 2 * 2 * 2  # selections x budgets x coalesce
    for c in cases:
        assert c["reads"] >= 1
        assert c["read_amplification"] == pytest.approx(padded_bytes / extent_bytes)
        assert c["padding_amplification"] == pytest.approx(c["read_amplification"])
    for on, off in zip(cases[0::2], cases[1::2]):
        assert (on["coalesce"], off["coalesce"]) == (True, False)
        assert off["io_requests_per_read"] == off["chunks_per_read"]  # one extent per chunk, one I/O each
        assert on["io_requests_per_read"] <= off["io_requests_per_read"]
        if on["selection"] == "runs" and on["budget"] == 0.25:
            assert on["io_requests_per_read"] < off["io_requests_per_read"]

    plot_io(report, str(tmp_path / "chunked.png"))  # useful bandwidth per case, no fio row
    assert_png(tmp_path / "chunked.png")

    again = run_chunked(bench_args(tmp_path / "bench", budget=[0.25], selection="random", json=True))
    assert capsys.readouterr().out == ""
    assert again["store"]["stored_now"] is False
    assert again["store"]["prefix_id"] == report["store"]["prefix_id"]
