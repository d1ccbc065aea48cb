"""The read planner, without a daemon: what a Period's group is served from."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.server.read_plan import InFlight, plan_group, plan_speculation, split


def test_split_keeps_order_and_size():
    assert split([1, 2, 3, 4, 5], 2) == ((1, 2), (3, 4), (5,))
    assert split([], 3) == ()
    with pytest.raises(ValueError):
        split([1], 0)


def test_hits_then_speculation_then_reads():
    spec = InFlight(7, (3, 4), started=True)
    gp = plan_group(0, [1, 2, 3, 4, 5, 6], resident=[2], inflight=[spec], per_read=2)
    assert gp.hits == (2,)
    assert gp.from_reads == {7: (3, 4)}
    assert gp.keep == (7,) and gp.cancel == ()
    assert gp.reads == ((1, 5), (6,))


def test_unstarted_read_not_wholly_wanted_is_cancelled_and_its_chunks_read():
    spec = InFlight(1, (3, 9), started=False)
    gp = plan_group(0, [3, 4], inflight=[spec], per_read=8)
    assert gp.cancel == (1,) and gp.keep == ()
    assert gp.reads == ((3, 4),)


def test_started_read_is_kept_even_when_it_serves_nothing():
    spec = InFlight(1, (8, 9), started=True)
    gp = plan_group(0, [3, 4], inflight=[spec], per_read=8)
    assert gp.cancel == () and gp.keep == (1,)
    assert gp.from_reads == {}
    assert gp.reads == ((3, 4),)


def test_unstarted_read_wholly_wanted_is_used():
    spec = InFlight(1, (3, 4), started=False)
    gp = plan_group(0, [3, 4, 5], inflight=[spec], per_read=8)
    assert gp.cancel == ()
    assert gp.from_reads == {1: (3, 4)} and gp.reads == ((5,),)


def test_a_resident_chunk_is_a_hit_even_when_a_read_holds_it():
    spec = InFlight(1, (3, 4), started=True)
    gp = plan_group(0, [3, 4], resident=[3], inflight=[spec], per_read=8)
    assert gp.hits == (3,) and gp.from_reads == {1: (4,)} and gp.reads == ()


def test_covered_group_reads_nothing_and_keeps_every_read():
    spec = InFlight(1, (3, 9), started=False)
    gp = plan_group(0, [3], inflight=[spec], per_read=8, covered=True)
    assert gp.covered and gp.reads == () and gp.cancel == () and gp.keep == (1,)


def test_speculation_reads_what_is_nowhere_and_pins_for_a_push():
    inflight = [InFlight(1, (2,), started=False), InFlight(2, (9,), started=False)]
    sp = plan_speculation(0, [1, 2, 3, 4, 5], resident=[3, 4], inflight=inflight, held=[4], per_read=8, push=True)
    assert sp.cancel == (2,) and sp.keep == (1,)
    assert sp.pin == (3,)  # 4 already held for the push, 2 is read
    assert sp.reads == ((1, 5),)
    assert plan_speculation(0, [1, 3], resident=[3], per_read=8).pin == ()  # no push: nothing pinned


chunk_sets = st.lists(st.integers(0, 40), max_size=30, unique=True).map(sorted)


@st.composite
def inflight_reads(draw):
    reads, rid = [], 0
    for chunks in draw(st.lists(chunk_sets.filter(bool), max_size=4)):
        reads.append(InFlight(rid, tuple(chunks), draw(st.booleans())))
        rid += 1
    return reads


@settings(max_examples=300, deadline=None)
@given(wanted=chunk_sets, resident=chunk_sets, inflight=inflight_reads(), per_read=st.integers(1, 9))
def test_plan_serves_every_wanted_chunk_once_and_cancels_only_unstarted(wanted, resident, inflight, per_read):
    gp = plan_group(0, wanted, resident, inflight, per_read=per_read)
    by_id = {r.read_id: r for r in inflight}
    read = [j for part in gp.reads for j in part]
    served = [j for cs in gp.from_reads.values() for j in cs]
    # never drops a needed chunk, never serves one twice
    assert sorted(list(gp.hits) + served + read) == sorted(wanted)
    assert len(read) == len(set(read))
    assert set(gp.hits) == set(resident) & set(wanted)
    # every new read is in chunk order and within the size limit
    assert all(0 < len(part) <= per_read and list(part) == sorted(part) for part in gp.reads)
    # cancels only reads that have not started; kept and cancelled partition the reads in flight
    assert all(not by_id[i].started for i in gp.cancel)
    assert sorted(gp.cancel + gp.keep) == sorted(by_id)
    # a chunk served by a read is one that read holds, and the read is kept
    for rid, cs in gp.from_reads.items():
        assert rid in gp.keep and set(cs) <= set(by_id[rid].chunks)
    # an unstarted read is cancelled exactly when it holds something not wanted
    for r in inflight:
        assert (r.read_id in gp.cancel) == (not r.started and not set(r.chunks) <= set(wanted))


@settings(max_examples=300, deadline=None)
@given(guess=chunk_sets, resident=chunk_sets, held=chunk_sets, inflight=inflight_reads(), per_read=st.integers(1, 9), push=st.booleans())
def test_speculation_never_loads_a_chunk_twice(guess, resident, held, inflight, per_read, push):
    sp = plan_speculation(0, guess, resident, inflight, held=held, per_read=per_read, push=push)
    by_id = {r.read_id: r for r in inflight}
    kept = {j for rid in sp.keep for j in by_id[rid].chunks}
    read = [j for part in sp.reads for j in part]
    assert len(read) == len(set(read))
    assert not set(read) & (kept | set(held) | set(resident))
    assert set(guess) <= set(read) | kept | set(held) | set(resident)
    assert all(not by_id[i].started for i in sp.cancel)
    assert set(sp.pin) <= set(resident) - set(held) - kept and (push or not sp.pin)


def test_read_options_default_on_and_honour_the_older_negated_spelling():
    from kvstore.contract import pb
    from kvstore.server.read_exec import read_flag

    for msg, name, older in ((pb.PrefetchOpen, "speculation", "no_speculation"), (pb.ReadChunksRequest, "coalesce", "no_coalesce")):
        assert read_flag(msg(), name, older) is True
        assert read_flag(msg(**{older: True}), name, older) is False
        assert read_flag(msg(**{name: False}), name, older) is False
        assert read_flag(msg(**{name: True, older: True}), name, older) is True  # the positive flag wins when set
