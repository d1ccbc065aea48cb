import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.contract.errors import NotFound
from kvstore.server.arena import Arena, SlotAllocator
from kvstore.server.status import ArenaExhausted


def test_allocator_first_fit_and_merge():
    a = SlotAllocator(10)
    assert a.allocate(4) == 0 and a.allocate(4) == 4
    assert a.allocate(3) is None and a.can_allocate(2)
    a.free(0, 4)
    assert a.allocate(5) is None  # free runs 0-3 and 8-9 are not adjacent
    a.free(4, 4)
    assert a.allocate(10) == 0 and a.free_slots == 0
    a.free(0, 10)
    with pytest.raises(ValueError, match="already free"):
        a.free(2, 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=60))
def test_allocator_never_hands_out_a_slot_twice(ops):
    a = SlotAllocator(32)
    held = {}
    for alloc, n in ops:
        if alloc or not held:
            start = a.allocate(n)
            if start is not None:
                slots = set(range(start, start + n))
                assert all(slots.isdisjoint(s) for s in held.values())
                assert max(slots) < 32
                held[start] = slots
        else:
            start = next(iter(held))
            a.free(start, len(held.pop(start)))
        assert a.free_slots == 32 - sum(len(s) for s in held.values())


def test_arena_is_sealed_and_leases_block_until_released():
    import fcntl

    arena = Arena(16 * 4096, 4096)
    try:
        seals = fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
        first = arena.lease(1, nbytes=12 * 4096, wait_seconds=0)
        with pytest.raises(ArenaExhausted, match="busy"):
            arena.lease(2, nbytes=8 * 4096, wait_seconds=0.05)
        with pytest.raises(ArenaExhausted, match="can never fit"):
            arena.lease(2, nbytes=17 * 4096, wait_seconds=0)
        assert arena.release(2, [first.lease_id]) == 0  # not that owner's lease
        assert arena.release(1, [first.lease_id]) == 1
        arena.lease(2, nbytes=8 * 4096, wait_seconds=0)
        arena.lease(2, nbytes=4096, wait_seconds=0)
        assert arena.num_leases(2) == 2
        assert arena.release_owner(2) == 2 and arena.leased_bytes == 0
    finally:
        arena.close()


def test_a_strict_release_of_another_owners_lease_frees_nothing():
    arena = Arena(16 * 4096, 4096)
    try:
        mine = [arena.lease(7, nbytes=4096, wait_seconds=0).lease_id for _ in range(3)]
        theirs = arena.lease(8, nbytes=4096, wait_seconds=0).lease_id
        assert len({*mine, theirs}) == 4 and all(i > 4 for i in [*mine, theirs])  # random ids, not 1..N
        with pytest.raises(NotFound, match=f"lease {theirs} is not held"):
            arena.release(7, [*mine, theirs], strict=True)
        assert arena.num_leases(7) == 3 and arena.num_leases(8) == 1  # nothing changed
        assert arena.release(7, mine, strict=True) == 3
        assert arena.num_leases() == 1
    finally:
        arena.close()


def test_close_with_a_view_still_alive_does_not_fail():
    import numpy as np

    arena = Arena(4 * 4096, 4096)
    view = np.frombuffer(arena.view, np.uint8, count=16)  # e.g. a stream's result the shutdown could not drop
    arena.close()
    assert view.size == 16
