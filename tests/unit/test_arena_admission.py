"""The arena admits reservations whole and in arrival order: no hold-and-wait, no starvation, no leak."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.server.arena import Arena
from kvstore.server.status import ArenaExhausted

SLOT = 4096


def run(coro):
    return asyncio.run(coro)


def make(slots: int) -> Arena:
    return Arena(slots * SLOT, SLOT)


def test_a_reservation_is_granted_whole_and_carved_without_waiting():
    arena = make(8)

    async def go():
        res = await arena.reserve(1, 5 * SLOT, wait_seconds=1)
        a = arena.carve(res, 2 * SLOT)
        b = arena.carve(res, 3 * SLOT)
        assert (a.slots, b.slots) == ((res.start, 2), (res.start + 2, 3))
        assert arena.carve(res, 1) is None  # used up: a carve never takes more than was granted
        assert arena.leased_bytes == 5 * SLOT
        arena.close_reservation(res)
        assert arena.leased_bytes == 5 * SLOT  # carved leases outlive the reservation
        arena.release(1, [a.lease_id, b.lease_id])
        assert arena.leased_bytes == 0

    run(go())
    arena.close()


def test_closing_gives_back_only_what_was_not_carved():
    arena = make(8)

    async def go():
        res = await arena.reserve(1, 6 * SLOT, wait_seconds=1)
        lease = arena.carve(res, SLOT)
        arena.close_reservation(res)
        assert arena.leased_bytes == SLOT
        assert arena.carve(res, SLOT) is None  # closed
        arena.close_reservation(res)  # twice is harmless
        assert arena.leased_bytes == SLOT
        arena.release(1, [lease.lease_id])

    run(go())
    assert arena.leased_bytes == 0
    arena.close()


def test_one_that_can_never_fit_is_refused_at_once_with_both_sizes():
    arena = make(8)
    with pytest.raises(ArenaExhausted, match=rf"of {9 * SLOT} bytes can never fit .*\({8 * SLOT} bytes"):
        run(arena.reserve(1, 9 * SLOT, wait_seconds=60))
    assert arena.num_waiting == 0
    arena.close()


def test_grants_follow_arrival_order_and_a_large_request_is_not_starved():
    """Small requests arriving after a queued large one wait behind it, although they would fit now."""
    arena = make(8)
    order = []

    async def go():
        first = await arena.reserve(1, 6 * SLOT, wait_seconds=1)  # 2 slots stay free

        async def ask(name, slots):
            res = await arena.reserve(2, slots * SLOT, wait_seconds=5)
            order.append(name)
            return res

        big = asyncio.ensure_future(ask("big", 8))
        await asyncio.sleep(0.01)
        small = [asyncio.ensure_future(ask(f"small{i}", 1)) for i in range(3)]
        await asyncio.sleep(0.05)
        assert order == [] and arena.num_waiting == 4  # 2 slots free, yet the small ones queue behind the big one
        arena.close_reservation(first)
        got = await big
        assert order == ["big"]
        arena.close_reservation(got)
        for task in small:
            arena.close_reservation(await task)
        assert order == ["big", "small0", "small1", "small2"]

    run(go())
    assert arena.leased_bytes == 0 and arena.num_waiting == 0
    arena.close()


def test_a_wait_that_times_out_names_the_sizes_and_leaves_the_queue():
    arena = make(4)

    async def go():
        held = await arena.reserve(1, 4 * SLOT, wait_seconds=1)
        with pytest.raises(ArenaExhausted, match=rf"read of {2 * SLOT} bytes not granted within 0.1s \(0 requests were ahead"):
            await arena.reserve(2, 2 * SLOT, wait_seconds=0.1)
        assert arena.num_waiting == 0
        arena.close_reservation(held)

    run(go())
    assert arena.leased_bytes == 0
    arena.close()


def test_a_cancelled_waiter_at_the_head_lets_the_next_one_in():
    arena = make(4)

    async def go():
        held = await arena.reserve(1, 3 * SLOT, wait_seconds=1)
        head = asyncio.ensure_future(arena.reserve(2, 4 * SLOT, wait_seconds=5))  # needs everything
        await asyncio.sleep(0.01)
        nxt = asyncio.ensure_future(arena.reserve(3, SLOT, wait_seconds=5))  # fits now, but waits behind head
        await asyncio.sleep(0.01)
        assert not nxt.done()
        head.cancel()
        got = await asyncio.wait_for(nxt, 1)
        assert arena.num_waiting == 0
        arena.close_reservation(got)
        arena.close_reservation(held)

    run(go())
    assert arena.leased_bytes == 0
    arena.close()


def test_a_speculative_lease_never_jumps_the_queue():
    arena = make(8)

    async def go():
        held = await arena.reserve(1, 6 * SLOT, wait_seconds=1)
        queued = asyncio.ensure_future(arena.reserve(2, 4 * SLOT, wait_seconds=5))
        await asyncio.sleep(0.01)
        with pytest.raises(ArenaExhausted):  # 2 slots are free, and keep_free asks for 1: still refused while others queue
            arena.lease(3, SLOT, wait_seconds=0, keep_free_bytes=SLOT)
        lease = arena.lease(3, SLOT, wait_seconds=0)  # admitted work may take free space ahead of the queue
        arena.release(3, [lease.lease_id])
        arena.close_reservation(held)
        arena.close_reservation(await queued)

    run(go())
    assert arena.leased_bytes == 0
    arena.close()


def test_a_grant_from_another_thread_reaches_the_waiting_loop():
    """Leases are released from other threads (the shm socket's, the pool's): the queue must move from there."""
    arena = make(4)

    async def go():
        lease = arena.lease(1, 4 * SLOT, wait_seconds=0)
        waiting = asyncio.ensure_future(arena.reserve(2, 2 * SLOT, wait_seconds=5))
        await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, arena.release, 1, [lease.lease_id])
        arena.close_reservation(await asyncio.wait_for(waiting, 2))

    run(go())
    assert arena.leased_bytes == 0
    arena.close()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=24), st.integers(0, 2**31))
def test_every_request_that_fits_is_served_in_arrival_order(sizes, seed):
    """Many concurrent readers, each holding its whole reservation for a moment: all served, FIFO, nothing leaked."""
    import random

    rng = random.Random(seed)
    arena = make(8)
    served = []

    async def reader(i, slots):
        res = await arena.reserve(i, slots * SLOT, wait_seconds=10)
        served.append(i)
        leases = []
        while (lease := arena.carve(res, SLOT)) is not None:
            leases.append(lease.lease_id)
        await asyncio.sleep(rng.random() * 0.002)
        arena.close_reservation(res)
        arena.release(i, leases)

    async def go():
        await asyncio.gather(*(reader(i, n) for i, n in enumerate(sizes)))

    run(go())
    assert served == list(range(len(sizes)))  # they arrive in index order, and are granted in it
    assert arena.leased_bytes == 0 and arena.num_waiting == 0
    arena.close()


def test_admissions_closed_from_another_thread_give_everything_back_on_their_loop():
    """A call's end may be seen off its event loop: closing from there must not touch the loop's futures directly."""
    import threading

    from kvstore.contract.geometry import ModelSpec, StoreGeometry
    from kvstore.server.admission import Admissions

    arena = make(8)
    geo = StoreGeometry(ModelSpec(1, 1, 1024, "float32"), chunk_tokens=1, group_layers=1)  # 8 KiB extents: 2 slots

    async def go():
        adm = Admissions(arena, 1, geo)
        held = adm.grant(0)
        adm.need(held, 0, 4)  # all 8 slots
        adm.open(held, 5)
        await held.ready
        waiting = adm.grant(1)
        adm.need(waiting, 0, 1)
        adm.open(waiting, 5)  # queued behind nothing, but no room
        await asyncio.sleep(0.01)
        assert arena.num_waiting == 1
        t = threading.Thread(target=adm.close_all)
        t.start()
        t.join()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if arena.leased_bytes == 0 and arena.num_waiting == 0:
                break
        assert waiting.ready.cancelled()

    run(go())
    assert arena.leased_bytes == 0 and arena.num_waiting == 0
    arena.close()
