"""Cache policies: one contract over every policy, orderings, heap invariants, the tier pair."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.contract.errors import InvalidArgument
from kvstore.policy import POLICIES, IndexedMinHeap, TierPair, make_policy
from kvstore.scores import UnitScore


def state(policy):
    """Everything a policy holds (values are immutable, so shallow copies suffice)."""
    heap = policy._heap
    return (
        policy.used_bytes,
        dict(policy._sizes),
        dict(policy._stamp),
        list(heap._keys),
        list(heap._prios),
        dict(heap._pos),
        dict(policy._held),
        dict(policy._leases),
        policy._clock,
    )


def reference_victims(policy, nbytes, limit):
    """The lowest-priority unleased units below ``limit`` that make room, by brute force."""
    if nbytes > policy.capacity_bytes:
        return None
    out, room = [], policy.free_bytes
    for unit in sorted((u for u in policy.units() if not policy.leased(u)), key=policy._heap.priority):
        if room >= nbytes:
            break
        if not policy._heap.priority(unit) < limit:
            return None
        out.append(unit)
        room += policy.size(unit)
    return out if room >= nbytes else None


@pytest.mark.parametrize("name", POLICIES)
class TestContract:
    def test_random_operations_keep_capacity_and_leases(self, name):
        rng = random.Random(name)
        pol = make_policy(name, 1000)
        stats: dict = {}
        for step in range(3000):
            u = rng.randrange(40)
            s = stats.setdefault(u, UnitScore())
            op = rng.random()
            if u not in pol:
                size = rng.randrange(1, 300)
                before = state(pol)
                victims = pol.victims(size, incoming=(u, s))
                assert state(pol) == before  # looking has no side effects
                assert victims == reference_victims(pol, size, pol.priority(u, s))
                assert pol.can_admit(u, size, s) == (victims is not None)
                assert state(pol) == before
                if victims is None:
                    continue
                for v in victims:
                    assert not pol.leased(v) and pol.priority(v, stats[v]) < pol.priority(u, s)
                    pol.remove(v)
                pol.admit(u, size, s)
            elif op < 0.3:
                s.frequency += 1
                pol.touch(u, s)
            elif op < 0.5:
                s.importance += rng.random()
                pol.update_score(u, s)
            elif op < 0.65:
                pol.lease(u)
            elif op < 0.8 and pol.leased(u):
                pol.unlease(u)
            elif not pol.leased(u):
                pol.remove(u)
            assert pol.used_bytes <= pol.capacity_bytes
            assert pol.used_bytes == sum(pol._sizes.values())
            pol._heap.check()
            before = state(pol)
            top = pol.min_priority()
            order = list(pol.smallest())
            assert state(pol) == before  # neither does reading the order
            assert [p for _, p in order] == sorted(p for _, p in pol._heap.items())
            assert top == (order[0][1] if order else None)
            assert not any(pol.leased(v) for v, _ in order)
            assert sorted(v for v, _ in order) == sorted(v for v in pol.units() if not pol.leased(v))
        assert len(pol) > 0

    def test_leased_units_are_never_victims(self, name):
        pol = make_policy(name, 300)
        for u in range(3):
            pol.admit(u, 100, UnitScore(0.0, 0))
        for u in range(3):
            pol.lease(u)
        assert pol.victims(100) is None and pol.min_priority() is None
        with pytest.raises(ValueError):
            pol.remove(1)
        pol.unlease(1)
        assert pol.victims(100) == [1]
        pol.lease(0)  # twice: still leased after one unlease
        pol.unlease(0)
        assert pol.leased(0) and pol.victims(200) is None

    def test_errors(self, name):
        pol = make_policy(name, 100)
        pol.admit("a", 60, UnitScore())
        with pytest.raises(ValueError):
            pol.admit("a", 10, UnitScore())
        with pytest.raises(ValueError):
            pol.admit("b", 50, UnitScore())  # does not fit: evict first
        with pytest.raises(ValueError):
            pol.unlease("a")
        with pytest.raises(KeyError):
            pol.lease("zzz")
        for call in (pol.touch, pol.update_score):
            with pytest.raises(KeyError):
                call("zzz", UnitScore())
        with pytest.raises(KeyError):
            pol.remove("zzz")
        with pytest.raises(ValueError):
            pol.admit("c", -1, UnitScore())
        assert pol.victims(101) is None and not pol.can_admit("c", 101, UnitScore(1e9, 10**6))
        assert pol.victims(40) == [] and pol.used_bytes == 60 and pol.free_bytes == 40
        assert "zzz" not in pol and len(pol) == 1 and pol.units() == ["a"]

    def test_recency_breaks_ties(self, name):
        pol = make_policy(name, 30)
        same = UnitScore(2.0, 3)
        fill(pol, [("a", same), ("b", same), ("c", same)])
        pol.touch("a", same)
        assert pol.victims(20) == ["b", "c"]
        assert [u for u, _ in pol.smallest()] == ["b", "c", "a"] and [u for u, _ in pol.smallest(1)] == ["b"]
        assert pol.can_admit("d", 10, same)  # an equal newcomer is more recent than b
        pol.update_score("b", same)  # a re-key without an access keeps b's age
        assert pol.victims(10) == ["b"]


def fill(pol, items):
    for u, s in items:
        pol.admit(u, 10, s)


def test_orderings():
    lru = make_policy("lru", 30)
    fill(lru, [("a", UnitScore(9, 9)), ("b", UnitScore()), ("c", UnitScore())])
    lru.touch("a", UnitScore(9, 9))
    assert lru.victims(10) == ["b"]
    lfu = make_policy("lfu", 30)
    fill(lfu, [("a", UnitScore(0, 5)), ("b", UnitScore(9, 1)), ("c", UnitScore(0, 3))])
    assert lfu.victims(20) == ["b", "c"]
    score = make_policy("score", 30)
    fill(score, [("a", UnitScore(1.0, 5)), ("b", UnitScore(4.0, 1)), ("c", UnitScore(4.0, 1))])
    assert score.victims(10) == ["b"]  # 4 < 5, ties (b, c) to the least recent
    assert not score.can_admit("d", 10, UnitScore(1.0, 1)) and score.can_admit("d", 10, UnitScore(5.0, 1))
    imp = make_policy("impress", 30)
    fill(imp, [("a", UnitScore(0.5, 100)), ("b", UnitScore(2.0, 1)), ("c", UnitScore(1.0, 1))])
    assert imp.victims(10) == ["a"]
    with pytest.raises(InvalidArgument, match="policy"):
        make_policy("fifo", 10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("puro"), st.integers(0, 15), st.integers(-50, 50)), max_size=120))
def test_heap_matches_a_dict_under_random_operations(ops):
    heap, ref = IndexedMinHeap(), {}
    for op, key, prio in ops:
        if op == "p" and key not in ref:
            heap.push(key, (prio, key))
            ref[key] = (prio, key)
        elif op == "u" and key in ref:
            heap.update(key, (prio, key))
            ref[key] = (prio, key)
        elif op == "r" and key in ref:
            assert heap.remove(key) == ref.pop(key)
        elif op == "o" and ref:
            k, p = heap.pop()
            assert p == min(ref.values()) and ref.pop(k) == p
        heap.check()
        assert len(heap) == len(ref)
        assert [p for _, p in heap.smallest()] == sorted(ref.values())
        assert [p for _, p in heap.smallest(3)] == sorted(ref.values())[:3]
        assert heap.peek() == (min(ref.items(), key=lambda kv: kv[1]) if ref else None)
        heap.check()  # smallest() did not change it


def scores(**kw):
    table = {u: UnitScore(float(i), 1) for u, i in kw.items()}
    return lambda u: table.get(u, UnitScore())


def test_tier_pair_demotes_what_beats_the_cpu_minimum_and_drops_the_rest():
    gpu, cpu = make_policy("score", 20), make_policy("score", 20)
    pair = TierPair(gpu, cpu)
    sf = scores(a=5, b=1, c=3, d=2, x=9)
    for u in "ab":
        gpu.admit(u, 10, sf(u))
    for u in "cd":
        cpu.admit(u, 10, sf(u))
    before = (state(gpu), state(cpu))
    plan = pair.plan("x", 20, sf)
    assert (state(gpu), state(cpu)) == before  # planning looks only
    assert plan.tier == "upper" and sorted(plan.evict_upper) == ["a", "b"]
    assert plan.demote == ["a"] and plan.evict_lower == ["d"]  # a (5) beats d (2); b (1) beats nothing
    pair.apply(plan, "x", 20, sf)
    assert gpu.units() == ["x"] and sorted(cpu.units()) == ["a", "c"]


def test_tier_pair_without_a_gpu_is_cpu_only_and_respects_leases():
    pair = TierPair(make_policy("lru", 0), make_policy("lru", 20))
    sf = scores()
    for u in "ab":
        plan = pair.plan(u, 10, sf)
        assert plan.tier == "lower" and not plan.evict_upper
        pair.apply(plan, u, 10, sf)
    pair.lower.lease("a")
    plan = pair.plan("c", 10, sf)
    assert plan.evict_lower == ["b"]
    pair.lower.lease("b")
    assert pair.plan("c", 10, sf).tier is None


def test_promotion_moves_a_hit_up_and_demotes_the_gpu_victim():
    gpu, cpu = make_policy("score", 10), make_policy("score", 10)
    pair = TierPair(gpu, cpu)
    sf = scores(a=1, b=8)
    gpu.admit("a", 10, sf("a"))
    cpu.admit("b", 10, sf("b"))
    plan = pair.plan_promote("b", sf)
    assert plan.tier == "upper" and plan.promote and plan.evict_upper == ["a"] and plan.demote == ["a"]
    pair.apply(plan, "b", 10, sf)
    assert gpu.units() == ["b"] and cpu.units() == ["a"]
    cpu.lease("a")
    assert pair.plan_promote("a", sf).tier is None  # leased: stays where it is


def test_tier_pair_drops_nothing_for_a_demotion_that_cannot_happen():
    gpu, cpu = make_policy("score", 20), make_policy("score", 20)
    pair = TierPair(gpu, cpu)
    sf = scores(a=5, x=9, c=3, e=7)
    gpu.admit("a", 20, sf("a"))
    cpu.admit("c", 10, sf("c"))
    cpu.admit("e", 10, sf("e"))
    plan = pair.plan("x", 20, sf)
    # a (5) would need both c (3) and e (7) gone; e beats it, so a leaves memory and c stays
    assert plan.tier == "upper" and plan.evict_upper == ["a"] and plan.demote == [] and plan.evict_lower == []


def test_tier_pair_never_plans_around_a_leased_gpu_unit():
    gpu, cpu = make_policy("score", 20), make_policy("score", 20)
    pair = TierPair(gpu, cpu)
    sf = scores(a=1, b=2, x=9)
    for u in "ab":
        gpu.admit(u, 10, sf(u))
    gpu.lease("a")
    plan = pair.plan("x", 10, sf)
    assert plan.tier == "upper" and plan.evict_upper == ["b"] and plan.demote == ["b"]
    plan = pair.plan("x", 20, sf)  # room only by evicting the leased a: the CPU tier instead
    assert plan.tier == "lower" and plan.evict_upper == [] and plan.evict_lower == []


@pytest.mark.parametrize("upper_bytes", [0, 100])
@pytest.mark.parametrize("name", POLICIES)
def test_tier_pair_random_plans_are_consistent(name, upper_bytes):
    rng = random.Random(f"pair-{name}-{upper_bytes}")
    upper, lower = make_policy(name, upper_bytes), make_policy(name, 200)
    pair = TierPair(upper, lower)
    table: dict = {}

    def sf(u):
        return table.setdefault(u, UnitScore(rng.random(), rng.randrange(1, 5)))

    for _ in range(500):
        u = rng.randrange(30)
        tier = upper if u in upper else lower if u in lower else None
        sf(u).frequency += rng.random() < 0.5  # the daemon counts the access before placing
        sf(u).importance += rng.random()
        before = (state(upper), state(lower))
        if tier is None:
            nbytes = rng.randrange(1, 70)
            plan = pair.plan(u, nbytes, sf)
        elif tier is lower and rng.random() < 0.5:
            nbytes = lower.size(u)
            plan = pair.plan_promote(u, sf)
        else:
            op = rng.random()
            if op < 0.3:
                tier.lease(u)
            elif tier.leased(u):
                tier.unlease(u)
            else:
                tier.touch(u, sf(u))
            continue
        assert (state(upper), state(lower)) == before  # planning only looks
        moved = plan.evict_upper + plan.evict_lower
        assert not any(upper.leased(v) for v in plan.evict_upper) and not any(lower.leased(v) for v in plan.evict_lower)
        assert set(plan.demote) <= set(plan.evict_upper) and len(set(moved)) == len(moved)
        assert all(v in upper for v in plan.evict_upper) and all(v in lower for v in plan.evict_lower)
        if not upper.capacity_bytes:
            assert plan.tier != "upper"
        pair.apply(plan, u, nbytes, sf)  # admit raises if the plan overfills a tier
        assert upper.used_bytes <= upper.capacity_bytes and lower.used_bytes <= lower.capacity_bytes
        assert not set(upper.units()) & set(lower.units())
        assert (u in upper) == (plan.tier == "upper") or (tier is lower and plan.tier is None and u in lower)
    assert len(lower) > 0
