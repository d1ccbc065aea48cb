"""The Prefetch stream against a real daemon: tiers, speculation, leases, bad input."""

import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, make_kv, make_tokens, settled

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract import pb

GEO3 = GEOMETRIES[0]  # 5 layers in groups of 2: 3 groups, bf16, head dim 1
GEO24 = GEOMETRIES[3]  # 24 layers in groups of 8: 3 groups, bf16


def one_shot(client, pid, chunks, group, geo):
    layer = group * geo.group_layers
    with client.read_chunks(pid, chunks, layer_start=layer, layer_end=layer + 1, shm=False) as got:
        return got.group_kv(group)


def stream_all(
    client,
    pid,
    sets,
    *,
    period_layers,
    shm=True,
    speculate=True,
    push=None,
    await_push=False,
    group_out=None,
    group_out_chunks=None,
    wait_header=True,
):
    """Run one stream; returns ({group: kv}, stats).  ``await_push``: before
    each later period, wait for its pushed groups (as if computing meanwhile).
    ``group_out``: the stream's allocator of gathered groups."""
    got = {}
    with client.prefetch(pid, period_layers=period_layers, shm=shm, speculate=speculate, push=push, wait_header=wait_header) as st:
        st.group_out, st.group_out_chunks = group_out, group_out_chunks
        for p, chunks in enumerate(sets):
            if await_push and p:
                st.pushed(p, wait_s=30)
            st.send(p, chunks)
            for g, kv in st.groups(p):
                got[g] = kv
        assert st.num_periods == len(sets)
    return got, st.stats


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_a_stream_opened_without_waiting_for_its_header_serves_the_same_bytes(daemon_factory, shm):
    d = daemon_factory()
    geo, n = GEO24, 300
    kv, tokens = make_kv(geo, n, 4), make_tokens(n, 4)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        sets = [np.array([0, 3, 4]), np.array([1, 2, 18]), np.array([5])]
        eager, _ = stream_all(client, pid, sets, period_layers=geo.group_layers, shm=shm)
        lazy, stats = stream_all(client, pid, sets, period_layers=geo.group_layers, shm=shm, wait_header=False)
        assert eager.keys() == lazy.keys() == {0, 1, 2}
        for g in eager:
            np.testing.assert_array_equal(eager[g], lazy[g])
        assert stats.bytes_useful == sum(a.nbytes for a in lazy.values())
        st = client.prefetch(pid, period_layers=geo.group_layers, shm=shm, wait_header=False)
        assert st.close() is not None  # closed before its header was taken: the header is passed over
        st = client.prefetch(pid, period_layers=geo.group_layers, shm=shm, wait_header=False)
        assert (st.num_periods, st.groups_per_period, st.num_chunks) == (3, 1, geo.num_chunks(n))  # asked for: waited for
        st.close()


@pytest.mark.parametrize("geo", [GEO3, GEO24], ids=["L5g2", "L24g8"])
def test_extents_copied_as_stored_are_the_gathered_rows_after_reordering(daemon_factory, geo):
    """``group_out_chunks``: full chunks come back as stored, one copy per run of adjacent extents, and give the
    gathered rows once ``[chunks, layers, 2, heads, t, d]`` is put in row order; a set holding the short last
    chunk is gathered by rows as before."""
    d = daemon_factory()
    n = 300  # 19 chunks of 16, the last one short
    kv, tokens = make_kv(geo, n, 5), make_tokens(n, 5)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        m = geo.num_chunks(n)
        sets = [np.array([0, 1, 2, 5, 6, 11]), np.array([3, 4, 9, 10, 17]), np.array([0, 7, 8, m - 1])]
        shapes = []

        def as_stored(shape, dtype):
            shapes.append(shape)
            return np.full(shape, 7, dtype=dtype)  # every byte is written

        for attempt in range(2):  # cold (disk), then from the CPU tier
            shapes.clear()
            got, _ = stream_all(client, pid, sets, period_layers=geo.group_layers, group_out_chunks=as_stored)
            for p, chunks in enumerate(sets):
                want = one_shot(client, pid, chunks, p, geo)
                if p < 2:  # full chunks: as stored
                    c, layers, two, heads, t, dim = got[p].shape
                    assert (c, t) == (len(chunks), geo.chunk_tokens)
                    rows = got[p].transpose(1, 2, 3, 0, 4, 5).reshape(layers, two, heads, c * t, dim)
                    np.testing.assert_array_equal(rows, want)
                else:  # the short last chunk: gathered by rows
                    np.testing.assert_array_equal(got[p], want)
            assert len(shapes) == 2


@pytest.mark.parametrize("geo", [GEO3, GEO24], ids=["L5g2", "L24g8"])
@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_stream_bytes_equal_one_shot_reads_cold_and_cached(daemon_factory, geo, shm):
    d = daemon_factory()
    n = 300
    kv, tokens = make_kv(geo, n, 3), make_tokens(n, 3)
    pl = geo.group_layers  # one group per period: 3 periods
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        m = geo.num_chunks(n)
        rng = np.random.default_rng(1)
        sets = [np.sort(rng.choice(m, size=int(rng.integers(1, m + 1)), replace=False)) for _ in range(3)]
        for attempt in range(2):  # cold (disk), then from the CPU tier
            got, stats = stream_all(client, pid, sets, period_layers=pl, shm=shm)
            for p, chunks in enumerate(sets):
                np.testing.assert_array_equal(got[p], one_shot(client, pid, chunks, p, geo))
            units = sum(len(s) for s in sets)
            assert stats.units_disk + stats.units_cpu + stats.units_gpu == units
            assert stats.bytes_useful == sum(v.nbytes for v in got.values())
            if attempt == 0:
                assert stats.units_disk == units and stats.bytes_disk >= stats.bytes_useful
            else:
                assert stats.units_cpu == units and stats.units_disk == 0 and stats.bytes_cpu == stats.bytes_useful
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0
        assert s.tier_units == sum(len(x) for x in sets) and s.tier_hit_units == s.tier_miss_units


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_groups_gathered_into_the_callers_buffers_hold_the_same_rows(daemon_factory, shm):
    """``group_out`` (a CUDA runner's pinned buffers): every group lands in an array it gave, byte for byte."""
    d = daemon_factory()
    n, geo = 300, GEO3
    kv, tokens = make_kv(geo, n, 4), make_tokens(n, 4)
    given = []

    def group_out(shape, dtype):
        given.append(np.empty(shape, dtype=dtype))
        return given[-1]

    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        sets = [[0, 3, 5], [1, 2], list(range(geo.num_chunks(n)))]
        got, _ = stream_all(client, pid, sets, period_layers=geo.group_layers, shm=shm, group_out=group_out)
        for p, chunks in enumerate(sets):
            np.testing.assert_array_equal(got[p], one_shot(client, pid, chunks, p, geo))
    assert len(given) == len(sets) and all(any(a is b for b in given) for a in got.values())


def test_speculation_is_used_when_the_set_repeats_and_cancelled_or_wasted_when_not(daemon_factory):
    # room for speculation: it only takes buffers that leave half the reserve free
    d = daemon_factory("--shm-arena-bytes", str(128 << 20))
    geo, n = GEO24, 2048
    with KVStoreClient(d.target) as client:
        a = client.put_prefix(make_tokens(n, 1), make_kv(geo, n, 1), geo).prefix_id
        b = client.put_prefix(make_tokens(n, 2), make_kv(geo, n, 2), geo).prefix_id
        same = [np.arange(0, 128, 2)] * 3
        _, st = stream_all(client, a, same, period_layers=8)
        # periods 1 and 2 were read while period 0 was delivered: their set was known
        assert st.spec_bytes_used > 0 and st.spec_bytes_wasted == 0
        disjoint = [np.arange(0, 64), np.arange(64, 128), np.arange(0, 128, 3)]
        _, st = stream_all(client, b, disjoint, period_layers=8)
        assert st.spec_units_cancelled > 0 or st.spec_bytes_wasted > 0
        assert st.spec_bytes_used <= st.bytes_useful
        _, st = stream_all(client, b, disjoint, period_layers=8, speculate=False)
        assert st.spec_bytes_used == st.spec_bytes_wasted == st.spec_units_cancelled == 0
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0  # cancelled loads gave their slots back


def hinted(client, pid, sets, hints, *, period_layers=8, await_push=True):
    """A stream that hints ``hints[p + 1]`` right after sending ``sets[p]``; returns ({group: kv}, stats)."""
    got = {}
    with client.prefetch(pid, period_layers=period_layers, hints=True) as st:
        for p, chunks in enumerate(sets):
            if await_push and p:
                st.pushed(p, wait_s=30)
            st.send(p, chunks)
            if p + 1 < len(sets):
                st.hint(p + 1, hints[p + 1])
            for g, kv in st.groups(p):
                got[g] = kv
    assert st.covered == st.stats.groups_covered
    return got, st.stats


def test_hints_steer_speculation_and_pushed_groups_skip_the_round_trip(daemon_factory):
    d = daemon_factory("--shm-arena-bytes", str(64 << 20))
    geo, n = GEO24, 2048
    kv = make_kv(geo, n, 4)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(n, 4), kv, geo).prefix_id
        sets = [np.arange(0, 40, 3), np.arange(50, 70), np.arange(1, 128, 9)]

        def check(got, chunks_of):
            for g in range(3):
                rows = np.concatenate([np.arange(j * 16, j * 16 + 16) for j in chunks_of[g]])
                np.testing.assert_array_equal(got[g], kv[g * 8 : (g + 1) * 8][:, :, :, rows])

        # exact guesses (cold, then mostly CPU-tier hits the second time):
        # periods 1 and 2 are computed on what was pushed
        for _ in range(2):
            got, st = hinted(client, pid, sets, sets)
            check(got, sets)
            assert st.groups_pushed == st.groups_covered == 2
            assert st.spec_bytes_wasted == 0
        # a wider guess still covers the set; the rest was read for nothing
        wide = [None, np.arange(40, 80), np.arange(0, 128)]
        got, st = hinted(client, pid, sets, wide)
        check(got, sets)
        assert st.groups_covered == 2
        # a wrong guess: no group covered, the set is read on demand, same bytes
        wrong = [None, np.arange(100, 110), np.arange(0, 4)]
        got, st = hinted(client, pid, sets, wrong)
        check(got, sets)
        assert st.groups_covered == 0
        # without speculation a hint is accepted and does nothing
        with client.prefetch(pid, period_layers=8, hints=True, speculate=False) as st:
            st.send(0, sets[0])
            st.hint(1, sets[1])
            list(st.groups(0))
        assert st.stats.groups_pushed == 0 and st.stats.spec_bytes_used == 0
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


def test_a_small_tier_evicts_within_capacity_and_streams_never_see_each_others_data(daemon_factory):
    # 8 MiB: a 4 MiB CPU tier for 18 MiB of extents, two clients in parallel
    d = daemon_factory("--shm-arena-bytes", str(8 << 20), "--prefetch-reserve-fraction", "0.5", "--cache-policy", "lru")
    geo, n = GEO24, 512
    with KVStoreClient(d.target) as client:
        kvs = {}
        for seed in (1, 2, 3):
            kv = make_kv(geo, n, seed)
            kvs[client.put_prefix(make_tokens(n, seed), kv, geo).prefix_id] = kv
        errors = []

        def worker(seed):
            rng = np.random.default_rng(seed)
            try:
                with KVStoreClient(d.target) as c:
                    for _ in range(12):
                        pid = list(kvs)[int(rng.integers(len(kvs)))]
                        sets = [np.sort(rng.choice(32, size=int(rng.integers(4, 17)), replace=False)) for _ in range(3)]
                        got, _ = stream_all(c, pid, sets, period_layers=8)
                        for p, chunks in enumerate(sets):
                            rows = np.concatenate([np.arange(j * 16, (j + 1) * 16) for j in chunks])
                            want = kvs[pid][p * 8 : (p + 1) * 8][:, :, :, rows]
                            np.testing.assert_array_equal(got[p], want)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in (10, 11)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        s = settled(client)
        assert s.cache_policy == "lru" and s.cpu_tier_bytes == 4 << 20
        assert 0 < s.cpu_tier_used_bytes <= s.cpu_tier_bytes
        assert s.prefetch_reserve_bytes == 4 << 20 and s.tier_miss_units > 0
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


def test_gpu_tier_stand_in_serves_hits_and_demotes(daemon_factory):
    d = daemon_factory("--gpu-tier-bytes", str(1 << 20), "--gpu-tier-device", "host", "--shm-arena-bytes", str(8 << 20))
    geo, n = GEO24, 512
    kv = make_kv(geo, n, 5)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(n, 5), kv, geo).prefix_id
        sets = [np.arange(8)] * 3  # 24 extents of 64 KiB: more than the 1 MiB GPU tier holds
        _, cold = stream_all(client, pid, sets, period_layers=8)
        # group 2 drew the attention: S = I x F keeps it on the GPU while the
        # unscored groups rotate through the CPU tier (no push: a pushed
        # group stays pinned, and so in place, from its push to its period)
        client.report_attention(pid, 2, np.arange(8), np.ones(8))
        got, warm = stream_all(client, pid, sets, period_layers=8, push=False)
        for p in range(3):
            np.testing.assert_array_equal(got[p], kv[p * 8 : (p + 1) * 8, :, :, :128])
        assert cold.units_disk == 24
        assert warm.units_gpu == 8 and warm.units_cpu == 16 and warm.units_disk == 0
        assert warm.bytes_gpu == 8 * 64 * 1024
        # pushed speculation stages GPU hits in host memory like the stream does
        got, pushed = stream_all(client, pid, sets, period_layers=8, await_push=True)
        for p in range(3):
            np.testing.assert_array_equal(got[p], kv[p * 8 : (p + 1) * 8, :, :, :128])
        assert pushed.groups_covered == 2 and pushed.units_disk == 0
        assert pushed.units_gpu >= 8 and pushed.bytes_gpu == pushed.units_gpu * 64 * 1024
        s = settled(client)
        assert 0 < s.gpu_tier_used_bytes <= s.gpu_tier_bytes == 1 << 20
        assert "gpu 1048576 bytes (host)" in d.log()


def test_bad_input_on_the_stream_gets_a_clear_status(daemon_factory):
    d = daemon_factory("--max-periods-ahead", "1")
    geo, n = GEO24, 1024
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(n, 1), make_kv(geo, n, 1), geo).prefix_id

        def fails(sends, code, text, **kw):
            with pytest.raises(KVStoreRpcError) as err:
                with client.prefetch(pid, period_layers=kw.pop("period_layers", 8), **kw) as st:
                    for p, chunks in sends:
                        st.send(p, chunks)
                    for p, _ in sends:
                        list(st.groups(p))
            assert err.value.code == code, err.value
            assert text in err.value.message, err.value.message

        inv = grpc.StatusCode.INVALID_ARGUMENT
        fails([(3, [0])], inv, "period.period: period 3 out of range [0, 3)")
        fails([(1, [0])], inv, "period.period: periods are sent in order: expected 0, got 1")
        fails([(0, [0, 64])], inv, "period.chunks: index 64 out of range [0, 64)")
        fails([(0, [1, 1])], inv, "period.chunks: duplicate index 1")
        fails([(0, [])], inv, "period.chunks: must not be empty")
        fails([(0, [0])], inv, "open.period_layers", period_layers=4)
        with pytest.raises(KVStoreRpcError) as err:
            with client.prefetch(pid, period_layers=8) as st:
                st.send(0, [0])
                list(st.groups(0))
                st.send(0, [1])
                list(st.groups(1))
        assert err.value.code == inv and "period 0 already passed; the next is 1" in err.value.message
        # all three periods at once, nothing read yet: more than one outstanding
        big = np.arange(64)
        fails([(0, big), (1, big), (2, big)], grpc.StatusCode.RESOURCE_EXHAUSTED, "at most 1 may be outstanding")
        with pytest.raises(KVStoreRpcError) as err:
            client.prefetch("0" * 64, period_layers=8)
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        # opened without waiting for its header: the same error, from the first call that needs the header
        for first_use in (lambda st: st.send(0, [0]), lambda st: st.num_periods, lambda st: list(st.groups(0))):
            st = client.prefetch("0" * 64, period_layers=8, wait_header=False)
            with pytest.raises(KVStoreRpcError) as err:
                first_use(st)
            assert err.value.code == grpc.StatusCode.NOT_FOUND
            st.cancel()
        # a stream on a session whose leases were released
        gone = KVStoreClient(d.target)
        sid = gone.session_id
        gone.close()
        deadline = time.monotonic() + 10
        refused = None
        while refused is None and time.monotonic() < deadline:  # the close reaches the daemon a moment later
            req = iter([pb.PrefetchRequest(open=pb.PrefetchOpen(prefix_id=pid, shm_session=sid, period_layers=8))])
            try:
                list(client.stub.Prefetch(req, timeout=10))
                time.sleep(0.05)
            except grpc.RpcError as exc:
                refused = exc
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "leases were released" in refused.details()
        # a first message that is not an open
        req = iter([pb.PrefetchRequest(period=pb.PeriodSet(period=0, chunks=[0]))])
        with pytest.raises(grpc.RpcError) as raw:
            list(client.stub.Prefetch(req, timeout=10))
        assert raw.value.code() == inv and "open:" in raw.value.details()
        # hints and pushed groups
        fails([(0, [0])], inv, "open.push_speculation: needs a shared-memory session", shm=False, push=True)
        with pytest.raises(KVStoreRpcError) as err:
            with client.prefetch(pid, period_layers=8) as st:
                st.hint(0, [1])
                st.send(0, [1])
                list(st.groups(0))
        assert err.value.code == inv and "hint: the stream was not opened with open.hints" in err.value.message
        for hints, text in [
            ([(2, [1])], "hint.period: a hint is for the next period not yet sent (1), got 2"),
            ([(1, [1]), (1, [2])], "hint.period: period 1 was already hinted"),
            ([(1, [64])], "hint.chunks: index 64 out of range [0, 64)"),
        ]:
            with pytest.raises(KVStoreRpcError) as err:
                with client.prefetch(pid, period_layers=8, hints=True) as st:
                    st.send(0, [1])
                    for p, chunks in hints:
                        st.hint(p, chunks)
                    list(st.groups(0))
                    st.send(1, [1])
                    list(st.groups(1))
            assert err.value.code == inv and text in err.value.message, err.value
        for covered, text in [([0], "group 0 was not pushed"), ([1], "group 1 is not one of period 0's ([0])"), ([0, 0], "repeated group")]:
            req = iter(
                [
                    pb.PrefetchRequest(open=pb.PrefetchOpen(prefix_id=pid, shm_session=client.session_id, period_layers=8)),
                    pb.PrefetchRequest(period=pb.PeriodSet(period=0, chunks=[0], covered_groups=covered)),
                ]
            )
            with pytest.raises(grpc.RpcError) as raw:
                list(client.stub.Prefetch(req, timeout=10))
            assert raw.value.code() == inv and f"period.covered_groups: {text}" in raw.value.details(), raw.value
        # a client claiming more than was pushed (its push said [3, 4]; it asks for [3, 5])
        with pytest.raises(KVStoreRpcError) as err:
            with client.prefetch(pid, period_layers=8, hints=True) as st:
                st.send(0, [1])
                st.hint(1, [3, 4])
                list(st.groups(0))
                assert st.pushed(1, wait_s=30) == [1]
                period, chunks, refs = st._pushed[1]
                st._pushed[1] = (period, [3, 5], refs)
                st.send(1, [3, 5])
                list(st.groups(1))
        assert err.value.code == inv and "period.covered_groups: group 1: chunks [5] were not pushed" in err.value.message
        # none of this disturbed a good stream, and nothing is left leased
        got, _ = stream_all(client, pid, [[0, 5]] * 3, period_layers=8)
        assert got[0].shape[3] == 32
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


CLIENT_THAT_DIES = """
import sys, time
import numpy as np
from engine_client.client import KVStoreClient
c = KVStoreClient(sys.argv[1])
st = c.prefetch(sys.argv[2], period_layers=8)
st.send(0, np.arange(32))
st.group_kv(0)
print("streaming", c.stats().pinned_units, flush=True)
time.sleep(60)
"""


def test_aborted_and_vanished_clients_release_every_lease(daemon_factory):
    d = daemon_factory()
    geo, n = GEO24, 512
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(n, 1), make_kv(geo, n, 1), geo).prefix_id
        rng = np.random.default_rng(0)
        for i in range(100):  # cancelled at every stage of a request, pushes in flight
            st = client.prefetch(pid, period_layers=8, hints=i % 2 == 1)
            st.send(0, np.sort(rng.choice(32, size=8, replace=False)))
            if i % 2:
                st.hint(1, np.arange(4, 20))
            if i % 3 >= 1:
                st.group_kv(0)
            if i % 3 == 2:
                if i % 2:
                    st.pushed(1, wait_s=5)
                st.send(1, np.arange(16))
            st.cancel()
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0, s
        env = {**os.environ, "PYTHONPATH": data_root()}
        proc = subprocess.Popen([sys.executable, "-c", CLIENT_THAT_DIES, d.target, pid], stdout=subprocess.PIPE, text=True, env=env)
        line = proc.stdout.readline()
        assert line.startswith("streaming") and int(line.split()[1]) > 0
        proc.kill()
        proc.wait()
        proc.stdout.close()
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0, s


def test_prefetch_accesses_and_reports_survive_restart(daemon_factory):
    d = daemon_factory()
    geo, n = GEO24, 256
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(n, 1), make_kv(geo, n, 1), geo).prefix_id
        for _ in range(2):
            stream_all(client, pid, [[0, 3]] * 3, period_layers=8)
        client.report_attention(pid, 1, [0, 3], [0.5, 2.0])
        before = client.get_scores(pid, 1)
        assert before.frequency[[0, 3]].tolist() == [2, 2]
    d.stop()
    again = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(again.target) as client:
        after = client.get_scores(pid, 1)
        np.testing.assert_allclose(after.score, before.score)
        assert after.score[3] == 4.0
