"""The asyncio client on real daemons: the synchronous client's answers, errors, deadlines and retries."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import numpy as np
import pytest
import torch
from helpers import GEOMETRIES, make_kv, make_tokens
from test_client_errors import UNKNOWN, _Flaky, _FlakyStream, serve  # noqa: F401 - the serve fixture
from test_client_recovery import SLACK_S, stalled_socket  # noqa: F401 - the stalled_socket fixture
from test_pages import make_pages, page_keys

from engine_client.aio import AsyncKVStoreClient
from engine_client.client import KVStoreClient, KVStoreRpcError, to_torch

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
