"""Each failure the store must survive, on real files and a real LMDB."""

import errno
import os
import shutil
import subprocess

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.errors import DataLoss, InvalidArgument, NotFound, ReadOnly, StoreFull
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.io.posix import PosixBackend
from kvstore.segment_files import segment_file_name
from kvstore.store import ChunkStore

GEO = GEOMETRIES[2]  # 4 layers, 2 heads, dim 64, fp16, period 8


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:  # buffered on purpose: an outside corruption
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x40]))
        fh.flush()
        os.fsync(fh.fileno())


def snapshot(store: ChunkStore):
    return sorted(p["prefix_id"] for p in store.list_prefixes()), sorted(os.listdir(store.segment_dir))


def test_flipped_byte_is_a_checksum_error_never_wrong_bytes(store_config):
    kv = make_kv(GEO, 64, 1)
    other_kv = make_kv(GEO, 64, 2)
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(64, 1), kv, GEO).prefix_id
        other = store.put(make_tokens(64, 2), other_kv, GEO).prefix_id
        seg = store.inspect(pid)["segments"][0]
        lay = store.catalogue.segment_info(seg["segment_id"]).layout
        flip_byte(os.path.join(store.segment_dir, seg["file"]), int(lay.extent_offsets[0, 2]) + 100)
        # chunks not touching the bad extent still read (their own checksums pass)
        np.testing.assert_array_equal(store.read(pid, [0, 1]).to_kv(), kv[:, :, :, :32])
        with pytest.raises(DataLoss, match=r"chunk=2"):
            store.read(pid, [1, 2, 3])
        # quarantined now: every read of it fails, listing and verify say so
        with pytest.raises(DataLoss, match="quarantined"):
            store.read(pid, [0])
        listed = {p["prefix_id"]: p["quarantined"] for p in store.list_prefixes()}
        assert listed[pid] and "checksum" in listed[pid] and listed[other] is None
        report = {r["segment_id"]: r for r in store.verify()}
        assert not report[seg["segment_id"]]["ok"]
        assert report[seg["segment_id"]]["bad_regions"] == ["extent[group=0,chunk=2]"]
        np.testing.assert_array_equal(store.read(other, range(4)).to_kv(), other_kv)
        # a lookup no longer offers the damaged prefix for sharing
        assert store.lookup(make_tokens(64, 1), GEO).matched_chunks == 0
    with ChunkStore(store_config) as store:  # quarantine survives a restart
        with pytest.raises(DataLoss):
            store.read(pid, [0])
        store.delete(pid)
        pid2 = store.put(make_tokens(64, 1), kv, GEO).prefix_id
        np.testing.assert_array_equal(store.read(pid2, range(4)).to_kv(), kv)


def test_verify_finds_corruption_in_summaries_without_a_read(store_config):
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(40, 3), make_kv(GEO, 40, 3), GEO).prefix_id
        seg = store.inspect(pid)["segments"][0]
        lay = store.catalogue.segment_info(seg["segment_id"]).layout
        flip_byte(os.path.join(store.segment_dir, seg["file"]), lay.summaries_offset + 3)
        (rep,) = store.verify(pid)
        assert rep["bad_regions"] == ["summaries"] and rep["quarantined"]
        with pytest.raises(DataLoss):
            store.read_summaries(pid)


def test_corrupt_quantized_probe_keys_are_found_by_verify_and_refused_by_reads(store_config):
    from dataclasses import replace

    from kvstore.contract.probes import quantize_probe_rows

    geo = replace(GEO, group_layers=2, probe_bits=4)  # two groups, each with its 4-bit probe region
    kv = make_kv(geo, 40, 4)
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(40, 4), kv, geo).prefix_id
        seg = store.inspect(pid)["segments"][0]
        lay = store.catalogue.segment_info(seg["segment_id"]).layout
        rows = quantize_probe_rows(kv[2, 0].astype(np.float32), 4)  # group 1's first layer
        np.testing.assert_array_equal(store.read_probe_keys(pid, 1), rows)
        flip_byte(os.path.join(store.segment_dir, seg["file"]), lay.probe_offsets[1] + lay.probe_length - 2)  # a scale byte
        (rep,) = store.verify(pid)
        assert rep["bad_regions"] == ["probe[group=1]"] and rep["quarantined"]
        with pytest.raises(DataLoss, match="quarantined"):
            store.read_probe_keys(pid, 0)
    with ChunkStore(store_config) as store:  # reopened: the quarantine is kept; a fresh copy reads the flip
        store.delete(pid)
        pid = store.put(make_tokens(40, 4), kv, geo).prefix_id
        seg = store.inspect(pid)["segments"][0]
        flip_byte(os.path.join(store.segment_dir, seg["file"]), lay.probe_offsets[0] + 5)  # a code byte
        with pytest.raises(DataLoss, match=r"checksum mismatch in probe\[group=0\]"):
            store.read_probe_keys(pid, 0)


class FaultyBackend(PosixBackend):
    """Real O_DIRECT backend whose fdatasync or writes fail on demand."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.fail_fsync = False
        self.enospc_writes = False
        self.enospc_allocate = False

    def fdatasync(self, fh):
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fdatasync(fh)

    def allocate(self, fh, nbytes):
        if self.enospc_allocate:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().allocate(fh, nbytes)

    def pwrite(self, fh, buf, offset):
        if self.enospc_writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().pwrite(fh, buf, offset)


def test_failed_fsync_turns_store_read_only(store_config):
    backend = FaultyBackend()
    kv = make_kv(GEO, 48, 1)
    with ChunkStore(store_config, backend=backend) as store:
        kept = store.put(make_tokens(48, 1), kv, GEO).prefix_id
        backend.fail_fsync = True
        with pytest.raises(ReadOnly, match="not durable"):
            store.put(make_tokens(48, 2), make_kv(GEO, 48, 2), GEO)
        backend.fail_fsync = False  # no retry makes it writable again
        assert store.read_only and "fdatasync" in store.read_only
        with pytest.raises(ReadOnly):
            store.put(make_tokens(48, 3), make_kv(GEO, 48, 3), GEO)
        with pytest.raises(ReadOnly):
            store.delete(kept)
        assert [p["prefix_id"] for p in store.list_prefixes()] == [kept]
        np.testing.assert_array_equal(store.read(kept, range(3)).to_kv(), kv)
        assert len(os.listdir(store.segment_dir)) == 2  # the failed put's file stays until restart
    with ChunkStore(store_config) as store:
        assert store.read_only is None
        assert store.last_scan["reclaimed_files"] == 1
        assert len(os.listdir(store.segment_dir)) == 1


@pytest.mark.parametrize("where", ["allocate", "write"])
def test_injected_enospc_is_full_and_changes_nothing(store_config, where):
    backend = FaultyBackend()
    with ChunkStore(store_config, backend=backend) as store:
        kv = make_kv(GEO, 48, 1)
        kept = store.put(make_tokens(48, 1), kv, GEO).prefix_id
        before = snapshot(store)
        setattr(backend, f"enospc_{'allocate' if where == 'allocate' else 'writes'}", True)
        with pytest.raises(StoreFull, match="full"):
            store.put(make_tokens(48, 2), make_kv(GEO, 48, 2), GEO)
        assert snapshot(store) == before
        assert store.read_only is None
        np.testing.assert_array_equal(store.read(kept, range(3)).to_kv(), kv)


def test_min_free_bytes_reserve_refuses_before_writing(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    cfg = StoreConfig(data_dir=str(tmp_path / "d"), min_free_bytes=free)  # nothing may be written
    with ChunkStore(cfg) as store:
        with pytest.raises(StoreFull, match="min_free_bytes"):
            store.put(make_tokens(20, 1), make_kv(GEO, 20, 1), GEO)
        assert snapshot(store) == ([], [])


@pytest.fixture
def small_fs(tmp_path):
    """A real 8 MiB tmpfs (which supports O_DIRECT on this kernel)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a size-limited file system here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk(small_fs):
    cfg = StoreConfig(data_dir=str(small_fs / "data"), min_free_bytes=0, index_map_bytes=1 << 20)
    geo = StoreGeometry(ModelSpec(4, 2, 64, "float16"), chunk_tokens=16, group_layers=4)
    stored = {}
    with ChunkStore(cfg) as store:
        with pytest.raises(StoreFull, match="full"):
            for i in range(100):  # ~270 KiB a put: fills 8 MiB well before 100
                kv = make_kv(geo, 256, i)
                stored[store.put(make_tokens(256, i), kv, geo).prefix_id] = kv
        assert 5 < len(stored) < 100
        listed = {p["prefix_id"] for p in store.list_prefixes()}
        assert listed == set(stored)
        for pid, kv in stored.items():  # reads keep working on the full disk
            np.testing.assert_array_equal(store.read(pid, range(16)).to_kv(), kv)
        # deleting frees room for a new put
        store.delete(next(iter(stored)))
        store.put(make_tokens(256, 1000), make_kv(geo, 256, 1000), geo)
    with ChunkStore(cfg) as store:
        assert len(store.list_prefixes()) == len(stored)
        assert all(r["ok"] for r in store.verify())


def test_index_map_growth_loses_no_put(tmp_path):
    cfg = StoreConfig(data_dir=str(tmp_path / "d"), min_free_bytes=0, index_map_bytes=64 * 1024)
    geo = StoreGeometry(ModelSpec(1, 1, 1, "float32"), chunk_tokens=1, group_layers=1, probe_keys=False)
    ids = []
    with ChunkStore(cfg) as store:
        for i in range(30):  # 200 one-token chunks each: manifests + refs outgrow 64 KiB
            ids.append(store.put(make_tokens(200, i), make_kv(geo, 200, i), geo).prefix_id)
        assert store.index.resizes >= 1
    with ChunkStore(cfg) as store:
        assert sorted(p["prefix_id"] for p in store.list_prefixes()) == sorted(ids)
        np.testing.assert_array_equal(store.read(ids[-1], range(200)).to_kv(), make_kv(geo, 200, 29))


def test_startup_reclaims_orphans_and_quarantines_missing_files(store_config):
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(40, 1), make_kv(GEO, 40, 1), GEO).prefix_id
        seg_file = store.inspect(pid)["segments"][0]["file"]
        seg_dir = store.segment_dir
    orphan = os.path.join(seg_dir, segment_file_name(99))
    with open(orphan, "wb") as fh:
        fh.write(b"\0" * 8192)
    with ChunkStore(store_config) as store:
        assert not os.path.exists(orphan) and store.last_scan["reclaimed_files"] == 1
        assert store.read(pid, [0]).bytes_read > 0
        os.unlink(os.path.join(seg_dir, seg_file))
    with ChunkStore(store_config) as store:
        (p,) = store.list_prefixes()
        assert "missing" in p["quarantined"]
        with pytest.raises(DataLoss):
            store.read(pid, [0])
        # new segments never reuse an id seen on disk or in the index
        new = store.put(make_tokens(40, 2), make_kv(GEO, 40, 2), GEO).prefix_id
        assert store.inspect(new)["segments"][0]["segment_id"] > 1


def test_invalid_input_names_the_field_and_changes_nothing(store_config):
    kv = make_kv(GEO, 40, 1)
    tokens = make_tokens(40, 1)
    with ChunkStore(store_config) as store:
        pid = store.put(tokens, kv, GEO).prefix_id
        before = snapshot(store)
        cases = [
            (lambda: store.read(pid, [3]), "chunks", "out of range"),
            (lambda: store.read(pid, [-1]), "chunks", "out of range"),
            (lambda: store.read(pid, [0, 0]), "chunks", "duplicate"),
            (lambda: store.read(pid, []), "chunks", "empty"),
            (lambda: store.read(pid, [0], groups=[1]), "groups", "out of range"),
            (lambda: store.read("zz", [0]), "prefix_id", "hex"),
            (lambda: store.put(tokens[:39], kv, GEO), "kv", "shape"),
            (lambda: store.put(tokens, kv.astype(np.float32), GEO), "kv", "dtype"),
            (lambda: store.put(-tokens - 1, kv, GEO), "tokens", "[0,"),
            (lambda: store.put(tokens, kv, GEO, namespace="a\0b"), "namespace", "NUL"),
            (lambda: store.read_probe_keys(pid, 5), "groups", "out of range"),
        ]
        for call, field, text in cases:
            with pytest.raises(InvalidArgument) as err:
                call()
            assert err.value.field == field and text in str(err.value), str(err.value)
        with pytest.raises(NotFound):
            store.read("ab" * 32, [0])
        with pytest.raises(InvalidArgument, match="num_kv_heads"):
            StoreGeometry(ModelSpec(4, 0, 64, "float16"))
        assert snapshot(store) == before


def test_two_phase_put_validates_each_extent(store_config):
    tokens = make_tokens(40, 7)
    kv = make_kv(GEO, 40, 7)
    with ChunkStore(store_config) as store:
        before = snapshot(store)
        pending = store.begin_put(tokens, GEO)
        assert list(pending.needed_chunks) == [0, 1, 2]
        ext = np.ascontiguousarray(kv[:, :, :, 0:16])
        for args, field, text in [
            ((0, 3, ext), "extent.chunk", "must be in [0, 3)"),
            ((1, 0, ext), "extent.group", "must be in [0, 1)"),
            ((0, 0, ext[:, :, :, :15]), "extent.payload", "must be 32768 bytes"),
            ((0, 2, ext), "extent.payload", "must be 16384 bytes"),  # last chunk has 8 tokens
        ]:
            with pytest.raises(InvalidArgument) as err:
                pending.put_extent(*args)
            assert err.value.field == field and text in str(err.value)
        pending.put_extent(0, 0, ext)
        with pytest.raises(InvalidArgument, match="already sent"):
            pending.put_extent(0, 0, ext)
        with pytest.raises(InvalidArgument, match="2 extents missing, first: group 0 chunk 1"):
            pending.commit()
        assert snapshot(store) == before  # the aborted put left no file and no listing
