"""The asyncio client on real daemons: the synchronous client's answers, errors, deadlines and retries."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import grpc
import numpy as np
import pytest
import torch
from helpers import GEOMETRIES, make_kv, make_tokens, settled
from test_client_errors import UNKNOWN, _Flaky, _FlakyStream, serve  # noqa: F401 - the serve fixture
from test_client_recovery import SLACK_S, stalled_socket  # noqa: F401 - the stalled_socket fixture
from test_pages import make_pages, page_keys

from engine_client.aio import AsyncKVStoreClient
from engine_client.aio_rpc import CORE_WRITE_ERROR, DaemonStatus
from engine_client.client import KVStoreClient, KVStoreRpcError, to_torch
from engine_client.prefetch import PrefetchStream, hint_request, open_request
from kvstore.contract.geometry import ModelSpec, StoreGeometry

GEO = GEOMETRIES[0]  # 5 layers in groups of 2, one head, head dim 1, bf16
GEO24 = GEOMETRIES[3]  # 24 layers in groups of 8, bf16


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_prefixes_reads_and_pages_answer_as_the_synchronous_client(daemon, shm):
    kv, tokens = make_kv(GEO24, 70, 1), make_tokens(70, 1)
    pages, keys = make_pages(GEO24, 9, 2), page_keys(9, 2)

    async def main():
        async with AsyncKVStoreClient(daemon.target, shm=shm) as client:
            assert client.shm == shm
            put = await client.put_prefix(tokens, kv, GEO24, model_fingerprint="m")
            assert (await client.lookup(tokens, GEO24, model_fingerprint="m")).matched_chunks == put.num_chunks == 5
            assert (await client.put_prefix(tokens, kv, GEO24, model_fingerprint="m")).already_stored
            with await client.read_chunks(put.prefix_id, [0, 2, 4], layer_start=3, layer_end=10) as read:
                assert read.zero_copy == shm
                np.testing.assert_array_equal(read.to_kv(), kv[3:10, :, :, np.r_[0:16, 32:48, 64:70]])
            seen = []
            groups = client.iter_groups(put.prefix_id, [1], shm=shm)
            async with contextlib.aclosing(groups):
                async for read, group in groups:
                    seen.append(group)
                    break  # stops after the first group: its leases go back
            assert seen == [0]
            desc = await client.describe(put.prefix_id[:16])
            assert desc.prefix_id == put.prefix_id and desc.num_tokens == 70
            assert (await client.get_summaries(put.prefix_id)).shape == (5, 24, 2, 2, 64)
            assert (await client.report_attention(put.prefix_id, 0, [0, 1], [0.5, 0.25])) > 0
            assert (await client.get_scores(put.prefix_id, 0)).importance[:2].tolist() == [0.5, 0.25]
            # pages
            assert (await client.put_pages(keys[:4], pages[:4], GEO24, namespace="n")).pages_written == 4
            present = await client.pages_exist(keys, GEO24, namespace="n")
            assert present.num_leading == 4 and present.exists.tolist() == [True] * 4 + [False] * 5
            assert (await client.put_pages(keys, to_torch(pages, torch.bfloat16), GEO24, namespace="n")).pages_written == 5
            got = await client.get_pages(keys, GEO24, namespace="n", layer_start=8, layer_end=12)
            np.testing.assert_array_equal(got, pages[:, 8:12])
            out = torch.zeros((9, 24, 2, 2, 16, 64), dtype=torch.bfloat16)
            assert await client.get_pages_into(keys, out, GEO24, namespace="n") is out
            assert torch.equal(out, to_torch(pages, torch.bfloat16))
            # many calls at once on one client, as an engine's event loop makes them
            many = await asyncio.gather(*(client.get_pages(keys[i : i + 3], GEO24, namespace="n") for i in range(6)))
            for i, arr in enumerate(many):
                np.testing.assert_array_equal(arr, pages[i : i + 3])
            listed = {p.prefix_id: p.kind for p in await client.list_prefixes()}
            assert listed[put.prefix_id] == "prefix" and sorted(listed.values()).count("pages") >= 1
            assert (await client.stats()).num_prefixes == len(listed)
            assert (await client.inspect(put.prefix_id))["prefix_id"] == put.prefix_id
            assert all(r.ok for r in await client.verify(put.prefix_id))
            assert await client.delete(put.prefix_id) == put.prefix_id
            return (await client.stats()).shm_leased_bytes

    leased = run(main())
    with KVStoreClient(daemon.target, shm=False) as sync:
        assert sync.list_prefixes()[0].kind == "pages"
        deadline = time.monotonic() + 10
        while leased and time.monotonic() < deadline:  # releases travel on the shm connection
            time.sleep(0.02)
            leased = sync.stats().shm_leased_bytes
        assert leased == 0


def test_errors_are_the_synchronous_clients(daemon):
    pages, keys = make_pages(GEO, 2, 3), page_keys(2, 3)

    async def main():
        async with AsyncKVStoreClient(daemon.target) as client:
            await client.put_pages(keys, pages, GEO)
            cases = {
                "read_chunks": lambda: client.read_chunks(UNKNOWN, [0]),
                "describe": lambda: client.describe(UNKNOWN),
                "get_summaries": lambda: client.get_summaries(UNKNOWN),
                "get_pages": lambda: client.get_pages([keys[0], b"missing"], GEO),
                "get_pages layers": lambda: client.get_pages(keys, GEO, layer_start=3, layer_end=3),
                "pages_exist": lambda: client.pages_exist([b"a", b"a"], GEO),
            }
            out = {}
            for name, call in cases.items():
                with pytest.raises(KVStoreRpcError) as err:
                    await call()
                out[name] = (err.value.code, err.value.message)
            with pytest.raises(ValueError, match=r"^out: shape must be"):
                await client.get_pages_into(keys, np.zeros((1, 5, 2, 1, 16, 1), np.uint16), GEO)
            with pytest.raises(ValueError, match="one page per key|shape must be"):
                await client.put_pages(keys, pages[:1], GEO)
            return out

    got = run(main())
    with KVStoreClient(daemon.target) as sync:
        for name, call in {
            "read_chunks": lambda: sync.read_chunks(UNKNOWN, [0]),
            "describe": lambda: sync.describe(UNKNOWN),
            "get_summaries": lambda: sync.get_summaries(UNKNOWN),
            "get_pages": lambda: sync.get_pages([keys[0], b"missing"], GEO),
            "get_pages layers": lambda: sync.get_pages(keys, GEO, layer_start=3, layer_end=3),
            "pages_exist": lambda: sync.pages_exist([b"a", b"a"], GEO),
        }.items():
            with pytest.raises(KVStoreRpcError) as err:
                call()
            assert got[name] == (err.value.code, err.value.message), name
    assert got["get_pages"] == (grpc.StatusCode.NOT_FOUND, "keys[1]: page is not stored")
    assert got["get_pages layers"][0] == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.timeout(30)
def test_calls_on_a_stalled_socket_end_by_their_deadline(stalled_socket):  # noqa: F811
    async def main():
        client = AsyncKVStoreClient(stalled_socket, shm=False)
        try:
            for name, call in (
                ("stats", lambda: client.stats(timeout=1.0)),
                ("read_chunks", lambda: client.read_chunks(UNKNOWN, [0], timeout=1.0)),
                ("get_pages", lambda: client.get_pages([b"k"], GEO, timeout=1.0)),
                ("put_pages", lambda: client.put_pages([b"k"], make_pages(GEO, 1, 1), GEO, timeout=1.0)),
                ("get_conversation", lambda: client.get_conversation("c", timeout=1.0)),
                ("prefetch", lambda: client.prefetch(UNKNOWN, period_layers=2, timeout=1.0).open()),
            ):
                t0 = time.monotonic()
                with pytest.raises(KVStoreRpcError) as err:
                    await call()
                took = time.monotonic() - t0
                assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, name
                assert took <= 1.0 + SLACK_S, (name, took)
        finally:
            await client.close()

    run(main())


def test_retries_follow_the_synchronous_rules(serve):  # noqa: F811
    flaky, stream_flaky, after_frame = _Flaky(), _FlakyStream(failures=2, fail_after_frame=False), _FlakyStream(0, True)
    targets = serve(flaky), serve(stream_flaky), serve(after_frame)

    async def main():
        clients = [AsyncKVStoreClient(t, shm=False) for t in targets]
        try:
            assert (await clients[0].stats(timeout=10)).num_prefixes == 7  # UNAVAILABLE twice, then OK
            assert (await clients[1].get_summaries(UNKNOWN, timeout=10)).tolist() == [0.0, 1.0]  # until its first message
            with pytest.raises(KVStoreRpcError) as err:
                await clients[2].get_summaries(UNKNOWN, timeout=10)  # a message came: not replayed
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            t0 = time.monotonic()
            with pytest.raises(KVStoreRpcError):
                await clients[2].stats(timeout=0.05)  # retries stop at the deadline
            assert time.monotonic() - t0 < 0.05 + 0.5
        finally:
            for c in clients:
                await c.close()

    run(main())
    assert (flaky.attempts, stream_flaky.attempts, after_frame.attempts >= 2) == (3, 3, True)


@pytest.mark.timeout(60)
def test_a_read_on_a_session_the_daemon_closed_opens_a_new_session(daemon):
    pages, keys = make_pages(GEO, 3, 4), page_keys(3, 4)

    async def main():
        async with AsyncKVStoreClient(daemon.target) as client:
            await client.put_pages(keys, pages, GEO)
            closed = client.session_id
            client.session.close()
            deadline = time.monotonic() + 10
            while (await client.stats()).shm_sessions and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            np.testing.assert_array_equal(await client.get_pages(keys, GEO, timeout=5), pages)
            assert client.session_id not in (0, closed)

    run(main())


def error_of(call):
    """``(code, message)`` of the KVStoreRpcError ``call()`` raises."""
    with pytest.raises(KVStoreRpcError) as err:
        call()
    return err.value.code, err.value.message


async def async_error_of(call):
    with pytest.raises(KVStoreRpcError) as err:
        await call()
    return err.value.code, err.value.message


def test_conversation_calls_answer_as_the_synchronous_client(daemon):
    kv, tokens = make_kv(GEO, 60, 5), make_tokens(60, 5)

    def unnamed(info):  # the same record under another name, made at another time
        turns = tuple(dataclasses.replace(t, created=0.0) for t in info.turns)
        return dataclasses.replace(info, conversation_id="", created=0.0, updated=0.0, turns=turns)

    with KVStoreClient(daemon.target) as sync:
        turns = [sync.put_prefix(tokens[:n], kv[:, :, :, :n], GEO, namespace="t").prefix_id for n in (32, 60)]
        merged = StoreGeometry(ModelSpec(3, 1, 1, "bfloat16"), chunk_tokens=16, group_layers=2)  # the compressed form
        packed = sync.put_prefix(tokens, kv[:3], merged, namespace="t")

        async def main():
            async with AsyncKVStoreClient(daemon.target) as client:
                out = {}
                for i, pid in enumerate(turns):
                    out[f"turn {i}"] = await client.append_turn("async", i, pid, namespace="t")
                    assert out[f"turn {i}"] == sync.get_conversation("async", namespace="t")
                out["inactive"] = await client.mark_inactive(
                    "async", compressed_prefix_id=packed.prefix_id, format="kv8", strategy={"bits": 8}, namespace="t"
                )
                out["get"] = await client.get_conversation("async", namespace="t")
                out["list"] = await client.list_conversations("t")
                out["errors"] = [
                    await async_error_of(lambda: client.get_conversation("nobody", namespace="t")),
                    await async_error_of(lambda: client.append_turn("async", 5, turns[0], namespace="t")),
                    await async_error_of(lambda: client.append_turn("", 0, turns[0])),
                    await async_error_of(lambda: client.mark_inactive("async", strategy="{not json", namespace="t")),
                ]
                out["deleted"] = await client.delete_conversation("async", namespace="t")
                out["gone"] = await async_error_of(lambda: client.get_conversation("async", namespace="t"))
                return out

        got = run(main())
        for i, pid in enumerate(turns):
            assert unnamed(sync.append_turn("sync", i, pid, namespace="t")) == unnamed(got[f"turn {i}"])
        inactive = sync.mark_inactive("sync", compressed_prefix_id=packed.prefix_id, format="kv8", strategy={"bits": 8}, namespace="t")
        assert unnamed(inactive) == unnamed(got["inactive"]) and got["inactive"].compressed.strategy == {"bits": 8}
        assert got["get"] == got["inactive"] and [t.prefix_id for t in got["get"].turns] == turns
        assert [c.conversation_id for c in got["list"]] == ["async"] and got["list"][0].turns == ()
        assert [unnamed(c) for c in got["list"]] == [unnamed(c) for c in sync.list_conversations("t") if c.conversation_id == "sync"]
        assert got["errors"] == [
            error_of(lambda: sync.get_conversation("nobody", namespace="t")),
            error_of(lambda: sync.append_turn("sync", 5, turns[0], namespace="t")),
            error_of(lambda: sync.append_turn("", 0, turns[0])),
            error_of(lambda: sync.mark_inactive("sync", strategy="{not json", namespace="t")),
        ]
        assert got["errors"][0][0] == grpc.StatusCode.NOT_FOUND
        deleted = sync.delete_conversation("sync", namespace="t")
        assert dataclasses.replace(deleted, conversation_id="") == dataclasses.replace(got["deleted"], conversation_id="")
        assert got["deleted"].conversation_id == "async" and got["gone"][0] == grpc.StatusCode.NOT_FOUND
        assert sync.list_conversations("t") == []


def test_route_and_data_port_answer_as_the_synchronous_client(daemon_factory, tmp_path):
    plain = daemon_factory(data_dir=tmp_path / "plain")
    node = daemon_factory(
        *("--remote-url", "memory://", "--node-id", "a", "--node-address", "engine-a:8000", "--remote-health-seconds", "0.2"),
        data_dir=tmp_path / "node",
    )
    tokens = make_tokens(40, 6)

    async def main():
        async with AsyncKVStoreClient(plain.target) as bare, AsyncKVStoreClient(node.target) as client:
            refused = await async_error_of(lambda: bare.route(tokens, GEO))
            await client.put_prefix(tokens, make_kv(GEO, 40, 6), GEO)
            deadline = time.monotonic() + 10
            while not (await client.route(tokens, GEO)).local_chunks and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the node announces itself and its prefix
            routed = [
                await client.route(tokens, GEO),
                await client.route(tokens, GEO, loads={"a": 2.0, "b": 0.0}, max_load_gap=1.0),
                await client.route(make_tokens(40, 7), GEO, loads={"a": 1.0}),
            ]
            return refused, routed, await client.data_channel_port()

    refused, routed, port = run(main())
    with KVStoreClient(plain.target) as bare, KVStoreClient(node.target) as sync:
        assert refused == error_of(lambda: bare.route(tokens, GEO)) and refused[0] == grpc.StatusCode.FAILED_PRECONDITION
        assert routed == [
            sync.route(tokens, GEO),
            sync.route(tokens, GEO, loads={"a": 2.0, "b": 0.0}, max_load_gap=1.0),
            sync.route(make_tokens(40, 7), GEO, loads={"a": 1.0}),
        ]
        assert routed[0].node_id == "a" and routed[0].local_chunks == 3
        assert port == sync.data_channel_port()


async def async_stream_all(client, pid, sets, *, period_layers, shm, hints=None):
    """One async stream over ``sets`` (``hints``: guess ``hints[p + 1]`` after sending ``sets[p]``, then wait for its
    push); returns ({group: kv}, stream)."""
    got = {}
    async with client.prefetch(pid, period_layers=period_layers, shm=shm, hints=hints is not None) as st:
        assert st.num_periods == len(sets)
        for p, chunks in enumerate(sets):
            if hints is not None and p:
                await st.pushed(p, wait_s=30)
            await st.send(p, chunks)
            if hints is not None and p + 1 < len(sets):
                await st.hint(p + 1, hints[p + 1])
            async for g, kv in st.groups(p):
                got[g] = kv
            assert st.chunk_tokens(p).sum() == sum(min(16, 70 - 16 * j) for j in chunks)
    return got, st


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_prefetch_groups_are_the_bytes_of_read_chunks(daemon, shm):
    kv, tokens = make_kv(GEO, 70, 8), make_tokens(70, 8)  # 5 chunks, the last of 6 tokens; 3 groups
    sets = [[0, 2, 4], [1, 4], [3]]

    with KVStoreClient(daemon.target) as sync:
        pid = sync.put_prefix(tokens, kv, GEO).prefix_id

        async def main():
            async with AsyncKVStoreClient(daemon.target, shm=shm) as client:
                got, st = await async_stream_all(client, pid, sets, period_layers=2, shm=shm)
                assert st.stats.units_disk + st.stats.units_cpu == 6 and st.stats.bytes_useful == sum(v.nbytes for v in got.values())
                assert st.geometry == GEO and st.num_tokens == 70 and st.period_groups(2) == [2]
                # awaited instead of entered: closed by hand; a cancelled stream gives its pins back too
                st = await client.prefetch(pid, period_layers=2, shm=shm)
                await st.send(0, [1])
                one = await st.group_kv(0)
                assert (await st.close()).units_cpu + st.stats.units_disk == 1
                st = await client.prefetch(pid, period_layers=2, shm=shm)
                await st.send(0, [0, 1])
                st.cancel()
                return got, one

        got, one = run(main())
        for p, chunks in enumerate(sets):
            layer = p * GEO.group_layers
            with sync.read_chunks(pid, chunks, layer_start=layer, layer_end=layer + 1, shm=shm) as read:
                want = read.group_kv(p)
            assert got[p].tobytes() == want.tobytes() and got[p].shape == want.shape
        with sync.prefetch(pid, period_layers=2, shm=shm) as st:  # the synchronous stream: the same arrays
            st.send(0, [1])
            assert st.group_kv(0).tobytes() == one.tobytes()
        s = settled(sync)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


def test_prefetch_hints_and_pushed_groups_as_the_synchronous_stream(daemon):
    kv, tokens = make_kv(GEO, 70, 9), make_tokens(70, 9)
    sets = [[0, 1], [2, 3], [1, 4]]

    with KVStoreClient(daemon.target) as sync:
        pid = sync.put_prefix(tokens, kv, GEO).prefix_id

        async def main():
            async with AsyncKVStoreClient(daemon.target) as client:
                return await async_stream_all(client, pid, sets, period_layers=2, shm=True, hints=sets)

        got, st = run(main())
        assert st.covered == st.stats.groups_covered == st.stats.groups_pushed == 2  # periods 1 and 2 came as pushes
        for p, chunks in enumerate(sets):
            rows = np.concatenate([np.arange(16 * j, min(16 * j + 16, 70)) for j in chunks])
            np.testing.assert_array_equal(got[p], kv[2 * p : 2 * p + 2][:, :, :, rows])
        s = settled(sync)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


def test_prefetch_errors_are_the_synchronous_streams(daemon):
    with KVStoreClient(daemon.target) as sync:
        pid = sync.put_prefix(make_tokens(70, 10), make_kv(GEO, 70, 10), GEO).prefix_id
        cases = {  # name: (open arguments, sets sent, then every period's groups read)
            "unknown prefix": (("0" * 64,), {}, []),
            "out of order": ((pid,), {}, [(1, [0])]),
            "chunk out of range": ((pid,), {}, [(0, [0, 5])]),
            "period layers": ((pid,), {"period_layers": 1}, [(0, [0])]),
            "hint unasked": ((pid,), {"hints": False, "hint": True}, [(0, [1])]),
            "push without shm": ((pid,), {"shm": False, "push": True}, [(0, [0])]),
        }

        def opened(args, kw):
            kw = {"period_layers": 2, **kw}
            return args, {k: v for k, v in kw.items() if k != "hint"}, kw.get("hint", False)

        async def main():
            out = {}
            async with AsyncKVStoreClient(daemon.target) as client:
                for name, (args, kw, sends) in cases.items():
                    args, kw, hint = opened(args, kw)

                    async def attempt():
                        async with client.prefetch(*args, **kw) as st:
                            for p, chunks in sends:
                                if hint:
                                    await st.hint(p, chunks)
                                await st.send(p, chunks)
                            for p, _ in sends:
                                async for _g in st.groups(p):
                                    pass

                    out[name] = await async_error_of(attempt)
                async with AsyncKVStoreClient(daemon.target, shm=False) as no_shm:
                    with pytest.raises(ValueError, match="^no shared-memory session is open$"):
                        await no_shm.prefetch(pid, period_layers=2, shm=True)
                with pytest.raises(ValueError, match="not open"):
                    await client.prefetch(pid, period_layers=2).send(0, [0])
            return out

        got = run(main())
        for name, (args, kw, sends) in cases.items():
            args, kw, hint = opened(args, kw)

            def attempt():
                with PrefetchStream(sync, *args, **kw) as st:
                    for p, chunks in sends:
                        if hint:
                            st.hint(p, chunks)
                        st.send(p, chunks)
                    for p, _ in sends:
                        list(st.groups(p))

            assert got[name] == error_of(attempt), name
        assert got["unknown prefix"][0] == grpc.StatusCode.NOT_FOUND
        assert got["out of order"] == (grpc.StatusCode.INVALID_ARGUMENT, got["out of order"][1])
        assert "periods are sent in order: expected 0, got 1" in got["out of order"][1]


def test_a_write_that_meets_a_refused_stream_leaves_the_daemons_status(daemon):
    """grpc.aio replaces a call's status with INTERNAL ("Internal error from Core") when a write's batch
    fails because the daemon has just ended the call; ``DaemonStatus`` keeps the daemon's refusal.  The
    failing write is made here by grpc.aio's own step, after the refusal has arrived, as it happens
    under load when the write was already in flight."""
    with KVStoreClient(daemon.target) as sync:
        pid = sync.put_prefix(make_tokens(70, 11), make_kv(GEO, 70, 11), GEO).prefix_id

    async def main():
        async with AsyncKVStoreClient(daemon.target, shm=False) as client:
            call = client.stub.Prefetch(timeout=30)
            status = DaemonStatus(call)
            await call.write(open_request(pid, session_id=0, period_layers=2, speculate=False, coalesce=True, hints=False, push=False))
            await call.write(hint_request(0, [1]))
            with pytest.raises(grpc.RpcError) as refused:
                while await call.read() is not grpc.aio.EOF:
                    pass
            call._cython_call.set_internal_error('Failed "execute_batch": (SendMessageOperation,)')
            with pytest.raises(grpc.RpcError) as after:
                await call.read()
            return refused.value, after.value, await status.error(after.value)

    refused, after, error = run(main())
    want = (grpc.StatusCode.INVALID_ARGUMENT, "hint: the stream was not opened with open.hints")
    assert (refused.code(), refused.details()) == want
    assert (after.code(), after.details()) == CORE_WRITE_ERROR  # what the call alone would raise
    assert (error.code, error.message) == want
