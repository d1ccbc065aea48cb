"""The longest-run search of a look-up's fill (``RemoteFill._longest``) over the chunk index of a real ``MemoryTier``."""

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.remote.memory import MemoryTier
from kvstore.store.remote_fill import RemoteFill
from kvstore.store.remote_link import RemoteLink


class CountingTier(MemoryTier):
    """A ``MemoryTier`` that counts the round trips of ``holders``."""

    def __init__(self):
        super().__init__()
        self.holder_calls = 0

    def holders(self, chunk_hashes):
        self.holder_calls += 1
        return super().holders(chunk_hashes)


def names(n: int, seed: int) -> list[str]:
    return [hashlib.sha256(f"{seed}:{i}".encode()).hexdigest() for i in range(n)]


def search(run: int, n: int, lo: int, seed: int = 0):
    """``_longest`` over ``n`` chunk names of which the chunk index knows the first ``run``; (result, round trips)."""
    tier = CountingTier()
    chunks = names(n, seed)
    holder = hashlib.sha256(b"manifest").hexdigest()
    if run:
        tier.put_manifest(holder, b"m", chunks[:run])
    fill = RemoteFill(RemoteLink(tier), catalogue=None, writer=None, batch_bytes=1 << 20, ttl_s=0)
    return fill._longest(chunks, lo), tier.holder_calls, holder


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(0, n))))
def test_the_search_finds_the_end_of_the_known_run(case):
    n, run, lo = case
    found, _, holder = search(run, n, lo)
    assert found == ((run - 1, holder) if run > lo else None)


def test_a_whole_prefix_of_64_chunks_takes_two_round_trips_and_4096_take_four():
    assert search(64, 64, 0)[1] == 2
    assert search(64, 68, 0)[1] == 2  # a stored prefix and a query's new tokens after it
    assert search(4096, 4096, 0)[1] <= 4
    assert search(1000, 4096, 0)[1] <= 4
    assert search(0, 64, 0)[1] == 2  # a miss: the first probe past ``lo`` is unknown, then the gap before it
