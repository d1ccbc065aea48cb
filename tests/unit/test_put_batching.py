"""Group commit of page puts: what a merged put sends, what each call is told, and who sends when."""

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

from engine_client.put_batching import AsyncPutQueue, MergedPages, PutEntry, PutQueue, merge, split, take
from engine_client.rpc import KVStoreRpcError
from kvstore.contract import PagesPutResult


def entry(keys: str, first: int = 0) -> PutEntry:
    """Pages ``[n, 2 layers, 2, 1 head, 2 tokens, 1 dim]`` whose values say (entry's first value + page)."""
    n = len(keys)
    pages = np.repeat(np.arange(first, first + n, dtype=np.float32), 8).reshape(n, 2, 2, 1, 2, 1)
    return PutEntry([k.encode() for k in keys], pages)


def test_a_merged_put_sends_each_key_once_from_the_first_call_that_has_it():
    a, b, c = entry("xyz", 0), entry("wy", 10), entry("v", 20)
    keys, sources = merge([a, b, c])
    assert keys == [b"x", b"y", b"z", b"w", b"v"] and sources == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]
    pages = MergedPages([a, b, c], sources)
    assert pages.shape == (5, 2, 2, 1, 2, 1) and pages.nbytes == 5 * 32
    assert [float(pages[i, 0:1].ravel()[0]) for i in range(5)] == [0, 1, 2, 10, 20]
    assert pages[3, 1:2].shape == (1, 2, 1, 2, 1)


def test_each_call_is_told_the_pages_it_sent_and_the_daemon_wrote():
    a, b = entry("xyz"), entry("wy")
    keys, sources = merge([a, b])
    stored = np.array([False, True, False, False])  # y was stored before the put
    res = PagesPutResult(num_pages=4, pages_written=3, pages_already_stored=1, bytes_written=300, batch_id="B")
    ra, rb = split([a, b], sources, stored, res)
    assert ra == PagesPutResult(3, 2, 1, 200, "B")
    assert rb == PagesPutResult(2, 1, 1, 100, "B")  # its y was another's: already stored for it
    nothing = PagesPutResult(num_pages=4, pages_written=0, pages_already_stored=4, bytes_written=0, batch_id="")
    assert [r.pages_written for r in split([a, b], sources, np.ones(4, bool), nothing)] == [0, 0]
    alone = PagesPutResult(3, 3, 0, 99, "C")
    assert split([a], merge([a])[1], np.zeros(3, bool), alone) == [alone]  # one call: the daemon's answer as it is


def test_the_next_put_carries_the_head_of_the_queue_within_the_limits():
    q = [entry("ab"), entry("cde"), entry("f")]
    assert [len(e.keys) for e in take(q, 5, 1 << 20)] == [2, 3] and len(q) == 1
    q = [entry("abcdefg"), entry("h")]
    assert [len(e.keys) for e in take(q, 5, 1 << 20)] == [7]  # at least one, however large
    q = [entry("ab"), entry("cd")]
    assert len(take(q, 10, 64)) == 1  # two pages of 32 bytes each: the bytes limit


def test_calls_made_while_a_put_is_in_flight_go_together_in_the_next():
    sent, gate = [], threading.Event()

    def send(scope, batch):
        sent.append((scope, [k for e in batch for k in e.keys]))
        if len(sent) == 1:
            gate.wait(5)  # the first put is slow: the others queue behind it
        keys, sources = merge(batch)
        batch_id = b"+".join(sorted(keys)).decode()
        return split(batch, sources, np.zeros(len(keys), bool), PagesPutResult(len(keys), len(keys), 0, len(keys), batch_id))

    q = PutQueue(send)
    results = {}

    def put(name, keys, scope="s"):
        results[name] = q.put(scope, entry(keys))

    first = threading.Thread(target=put, args=("first", "a"))
    first.start()
    time.sleep(0.2)
    others = [threading.Thread(target=put, args=(f"t{i}", k)) for i, k in enumerate(["b", "c", "d"])]
    other_scope = threading.Thread(target=put, args=("other", "z", "t"))
    for t in (*others, other_scope):
        t.start()
    time.sleep(0.3)
    gate.set()
    for t in (first, *others, other_scope):
        t.join(10)
    in_s = [keys for scope, keys in sent if scope == "s"]
    assert in_s[0] == [b"a"] and sorted(in_s[1]) == [b"b", b"c", b"d"] and len(in_s) == 2
    assert ("t", [b"z"]) in sent  # another scope never waits for this one
    assert results["first"].batch_id == "a" and {results[f"t{i}"].batch_id for i in range(3)} == {"b+c+d"}
    assert all(results[f"t{i}"].pages_written == 1 for i in range(3))


def test_a_failed_put_fails_every_call_it_carried_and_the_queue_goes_on():
    calls = []

    def send(scope, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KVStoreRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        time.sleep(0.2)
        return [PagesPutResult(len(e.keys), len(e.keys), 0, 0, "b") for e in batch]

    q = PutQueue(send)
    out = {}

    def put(name):
        try:
            out[name] = q.put("s", entry(name))
        except KVStoreRpcError as exc:
            out[name] = exc.code

    threads = [threading.Thread(target=put, args=(n,)) for n in "abc"]
    threads[0].start()
    time.sleep(0.05)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    assert out["a"].batch_id == "b" and out["b"] == out["c"] == grpc.StatusCode.RESOURCE_EXHAUSTED and calls == [1, 2]
    assert q.put("s", entry("d")).pages_written == 1  # nothing left stuck


def test_a_queued_call_past_its_deadline_leaves_the_queue():
    gate = threading.Event()

    def send(scope, batch):
        gate.wait(5)
        return [PagesPutResult(len(e.keys), len(e.keys), 0, 0, "b") for e in batch]

    q = PutQueue(send)
    t = threading.Thread(target=q.put, args=("s", entry("a")))
    t.start()
    time.sleep(0.1)
    late = entry("b")
    late.deadline = time.monotonic() + 0.2
    with pytest.raises(KVStoreRpcError) as err:
        q.put("s", late)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    gate.set()
    t.join(5)
    assert q.put("s", entry("c")).pages_written == 1


def test_the_asyncio_queue_groups_the_calls_of_one_loop():
    sent = []

    async def send(scope, batch):
        sent.append(len(batch))
        await asyncio.sleep(0.05)
        return [PagesPutResult(len(e.keys), len(e.keys), 0, 0, f"b{len(sent)}") for e in batch]

    async def main():
        q = AsyncPutQueue(send)
        return await asyncio.gather(*(q.put("s", entry(chr(97 + i))) for i in range(20)))

    results = asyncio.run(main())
    assert sent[0] == 1 and sum(sent) == 20 and len(sent) <= 3  # the first alone, the rest behind it
    assert all(r.pages_written == 1 for r in results)
