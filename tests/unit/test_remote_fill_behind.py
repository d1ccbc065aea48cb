"""A fill from the remote tier is served from memory while its local write runs behind the request.

Real stores on disk over ``MemoryTier``.  The commit behind a look-up is
held where it really waits, on the prefix's manifest-file lock, so the
state between the look-up and the commit is observed, not guessed.
"""

import os
import threading

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens
from test_remote_store import open_node

from kvstore.contract.errors import NotFound
from kvstore.contract.layout import SegmentLayout
from kvstore.remote.memory import MemoryTier

GEO = GEOMETRIES[0]


def stored_on(tmp_path, tier, tokens, kv):
    """A prefix put on node a and replicated; its id."""
    a = open_node(tmp_path, "a", tier)
    try:
        res = a.put(tokens, kv, GEO)
        assert a.replicator.wait_idle(10)
        return res.prefix_id
    finally:
        a.close()


def listed(store) -> set[str]:
    return {m["prefix_id"] for m in store.list_prefixes()}


def segment_files(store) -> set[str]:
    return {n for n in os.listdir(store.segment_dir) if n.endswith(".kvs")}


def file_bytes(store) -> dict[str, bytes]:
    out = {}
    for name in segment_files(store):
        with open(os.path.join(store.segment_dir, name), "rb") as f:
            out[name] = f.read()
    return out


def test_a_fill_is_read_from_memory_before_its_commit_and_listed_only_after_it(tmp_path):
    tier = MemoryTier()
    tokens, kv = make_tokens(100, 1), make_kv(GEO, 100, 1)
    pid = stored_on(tmp_path, tier, tokens, kv)
    b = open_node(tmp_path, "b", tier)
    try:
        with b.manifest_files.locked(pid):  # the commit behind the look-up waits here
            hit = b.lookup(tokens, GEO)
            assert (hit.matched_chunks, hit.prefix_id) == (7, pid)
            assert pid not in listed(b)  # shown to reads, not listed: nothing uncommitted is listed
            assert np.array_equal(b.read(pid, range(7)).to_kv(), kv)  # from the image in memory
            assert b.read_summaries(pid).shape[0] == 7
            fills = b.remote_stats()["fill_prefixes"]
            assert b.lookup(tokens, GEO).matched_chunks == 7
            assert b.remote_stats()["fill_prefixes"] == fills  # the shown fill is a local hit: no second fetch
        b.remote_fill.settle()
        assert pid in listed(b)
        assert np.array_equal(b.read(pid, range(7)).to_kv(), kv)  # from its file now
        assert b.stats()["quarantined_segments"] == 0
    finally:
        b.close()


def test_close_waits_for_the_fills_behind_and_they_survive_a_restart(tmp_path):
    tier = MemoryTier()
    prefixes = [(make_tokens(64 + 16 * i, 10 + i), make_kv(GEO, 64 + 16 * i, 10 + i)) for i in range(4)]
    ids = [stored_on(tmp_path, tier, t, kv) for t, kv in prefixes]
    b = open_node(tmp_path, "b", tier)
    for tokens, _ in prefixes:
        assert b.lookup(tokens, GEO).matched_chunks > 0
    b.close()  # every commit behind a look-up finishes first
    tier.available = False  # what follows is served by b's own disk alone
    b = open_node(tmp_path, "b", tier)
    try:
        assert listed(b) == set(ids)
        for pid, (tokens, kv) in zip(ids, prefixes):
            assert b.lookup(tokens, GEO).prefix_id == pid
            assert np.array_equal(b.read(pid, range(GEO.num_chunks(tokens.size))).to_kv(), kv)
    finally:
        b.close()


def test_a_put_racing_a_fill_behind_leaves_one_copy_and_every_read_exact(tmp_path):
    tier = MemoryTier()
    tokens, kv = make_tokens(160, 3), make_kv(GEO, 160, 3)
    pid = stored_on(tmp_path, tier, tokens, kv)
    b = open_node(tmp_path, "b", tier)
    try:
        with b.manifest_files.locked(pid):
            assert b.lookup(tokens, GEO).matched_chunks == 10
            racer = threading.Thread(target=lambda: b.put(tokens, kv, GEO))  # its commit queues on the same lock
            racer.start()
            assert np.array_equal(b.read(pid, range(10)).to_kv(), kv)
        racer.join(10)
        b.remote_fill.settle()
        assert listed(b) == {pid}
        assert np.array_equal(b.read(pid, range(10)).to_kv(), kv)
        assert b.stats()["quarantined_segments"] == 0
        assert len(segment_files(b)) == 1  # the copy that lost was removed
    finally:
        b.close()


def test_a_fill_whose_commit_fails_is_no_longer_shown_and_nothing_is_quarantined(tmp_path):
    tier = MemoryTier()
    first, second = [(make_tokens(100, 4 + i), make_kv(GEO, 100, 4 + i)) for i in range(2)]
    ids = [stored_on(tmp_path, tier, t, kv) for t, kv in (first, second)]
    b = open_node(tmp_path, "b", tier)
    try:
        with b.manifest_files.locked(ids[0]):  # the first commit waits here; the second queues behind it
            assert b.lookup(first[0], GEO).matched_chunks == 7
            assert b.lookup(second[0], GEO).matched_chunks == 7
            assert np.array_equal(b.read(ids[1], range(7)).to_kv(), second[1])  # served, not yet written
            b.state.turn_read_only("the data disk failed")  # the second commit will find the store read-only
        b.remote_fill.settle()
        assert b.remote_stats()["fill_failures"] == 1
        assert listed(b) == {ids[0]}  # the first had passed its check; the second is not kept
        with pytest.raises(NotFound):
            b.read(ids[1], range(7))
        assert b.lookup(second[0], GEO).matched_chunks == 0  # read-only: no new fill, and no stale answer
        assert b.stats()["quarantined_segments"] == 0
    finally:
        b.close()
    b = open_node(tmp_path, "b", tier)  # restarted after the device was checked: the startup scan drops the unkept file
    try:
        assert listed(b) == {ids[0]} and len(segment_files(b)) == 1
        assert b.lookup(second[0], GEO).matched_chunks == 7  # and the next look-up fills it again
        b.remote_fill.settle()
        assert listed(b) == set(ids)
    finally:
        b.close()


def test_the_next_fill_of_the_same_size_reuses_a_committed_image_and_reads_exact(tmp_path):
    tier = MemoryTier()
    prefixes = [(make_tokens(100, 20 + i), make_kv(GEO, 100, 20 + i)) for i in range(3)]  # one segment size
    ids = [stored_on(tmp_path, tier, t, kv) for t, kv in prefixes]
    b = open_node(tmp_path, "b", tier)
    try:
        kept = b.remote_fill._behind.buffers
        assert b.lookup(prefixes[0][0], GEO).matched_chunks == 7
        b.remote_fill.settle()
        assert kept.kept_bytes > 0  # written, synced, no reader: kept for the next fill
        with b.manifest_files.locked(ids[1]):
            assert b.lookup(prefixes[1][0], GEO).matched_chunks == 7
            assert kept.kept_bytes == 0  # taken by this fill
            assert np.array_equal(b.read(ids[1], range(7)).to_kv(), prefixes[1][1])  # from the reused memory
        b.remote_fill.settle()
        assert b.lookup(prefixes[2][0], GEO).matched_chunks == 7
        b.remote_fill.settle()
        for pid, (tokens, kv) in zip(ids, prefixes):
            assert np.array_equal(b.read(pid, range(7)).to_kv(), kv)
        assert all(r["ok"] for r in b.verify())  # every region as its checksum says
        files_b = file_bytes(b)
    finally:
        b.close()
    a = open_node(tmp_path, "a", tier)  # the node that computed them: its own puts' files
    try:
        files_a = file_bytes(a)
    finally:
        a.close()
    image = SegmentLayout(GEO, 100).total_bytes  # the trailer follows (it names its store: not compared)
    assert sorted(blob[:image] for blob in files_b.values()) == sorted(blob[:image] for blob in files_a.values())
