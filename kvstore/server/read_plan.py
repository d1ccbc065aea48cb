"""Which disk reads a Period needs: a pure plan, decided apart from carrying it out.

The read path's decisions live here, as functions of plain values, so they
are tested like the cache policies (``tests/unit/test_read_plan.py``,
with property tests); ``read_exec.ReadExecutor`` carries plans out (pins,
leases, threads, messages) and ``prefetch.py`` / ``ReadChunks`` drive it.

For one stored group of a Period the inputs are the chunks wanted, those
already pinned in a memory tier, and the speculative reads in flight for
that group (with whether each has started).  The plan:

- serves every resident chunk from its tier (a *hit*);
- cancels a speculative read that has not started unless all its chunks
  are wanted (reading the difference costs less than reading what nobody
  asked for); a started read is never cancelled;
- serves a wanted chunk from a kept speculative read when one holds it;
- reads the rest, in chunk order, in reads of at most ``per_read`` chunks
  (one coalesced read each, so a group's extents arrive in a few large I/Os
  and no single read takes more than its share of the buffer reserve).

A group the client computes on from a push (``covered``) reads nothing.
Speculation for the next Period follows the same cancellation rule against
the guess, and reads what is neither resident, already held for a push,
nor in a kept read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InFlight:
    """A speculative read submitted earlier, as the planner sees it."""

    read_id: int
    chunks: tuple[int, ...]
    started: bool


@dataclass(frozen=True)
class GroupPlan:
    """What one stored group of a Period is served from."""

    group: int
    hits: tuple[int, ...] = ()  # chunks served from a memory tier (pinned by the caller)
    from_reads: dict[int, tuple[int, ...]] = field(default_factory=dict)  # kept read id -> chunks it serves
    keep: tuple[int, ...] = ()  # in-flight reads kept (a started one that serves nothing still completes)
    cancel: tuple[int, ...] = ()  # in-flight reads dropped before they started
    reads: tuple[tuple[int, ...], ...] = ()  # new reads to submit
    covered: bool = False  # served from a push: nothing read, nothing cancelled

    @property
    def num_read(self) -> int:
        return sum(len(r) for r in self.reads)


@dataclass(frozen=True)
class SpecPlan:
    """Speculative loads of one group for the next Period."""

    group: int
    keep: tuple[int, ...] = ()
    cancel: tuple[int, ...] = ()
    pin: tuple[int, ...] = ()  # resident chunks to hold for a push (not an access)
    reads: tuple[tuple[int, ...], ...] = ()


def split(chunks: Sequence[int], per_read: int) -> tuple[tuple[int, ...], ...]:
    """``chunks`` in order, cut into reads of at most ``per_read`` chunks."""
    if per_read < 1:
        raise ValueError(f"per_read must be at least 1, got {per_read}")
    chunks = tuple(chunks)
    return tuple(chunks[i : i + per_read] for i in range(0, len(chunks), per_read))


def _cancellable(read: InFlight, wanted: set[int]) -> bool:
    return not read.started and not wanted.issuperset(read.chunks)


def plan_group(
    group: int,
    wanted: Sequence[int],
    resident: Iterable[int] = (),
    inflight: Sequence[InFlight] = (),
    *,
    per_read: int,
    covered: bool = False,
) -> GroupPlan:
    """The plan of one group whose wanted chunks (in order) are ``wanted``."""
    if covered:
        return GroupPlan(group, keep=tuple(r.read_id for r in inflight), covered=True)
    want = set(wanted)
    resident = set(resident) & want
    cancel = tuple(r.read_id for r in inflight if _cancellable(r, want))
    kept = [r for r in inflight if r.read_id not in cancel]
    served: dict[int, int] = {}
    for r in kept:
        for j in r.chunks:
            if j in want and j not in resident:
                served.setdefault(j, r.read_id)
    from_reads: dict[int, list[int]] = {}
    for j in wanted:
        if j in served:
            from_reads.setdefault(served[j], []).append(j)
    missing = [j for j in wanted if j not in resident and j not in served]
    return GroupPlan(
        group,
        hits=tuple(j for j in wanted if j in resident),
        from_reads={rid: tuple(cs) for rid, cs in from_reads.items()},
        keep=tuple(r.read_id for r in kept),
        cancel=cancel,
        reads=split(missing, per_read),
    )


def plan_speculation(
    group: int,
    guess: Sequence[int],
    resident: Iterable[int] = (),
    inflight: Sequence[InFlight] = (),
    *,
    held: Iterable[int] = (),
    per_read: int,
    push: bool = False,
) -> SpecPlan:
    """Loads of ``guess`` for a group of the next Period, before its real set is known.

    ``resident``: chunks in a memory tier now; ``held``: chunks already
    pinned for a push of this group.
    """
    want = set(guess)
    resident, held = set(resident), set(held)
    cancel = tuple(r.read_id for r in inflight if _cancellable(r, want))
    kept = [r for r in inflight if r.read_id not in cancel]
    have = {j for r in kept for j in r.chunks}
    pin = tuple(j for j in guess if push and j in resident and j not in held and j not in have) if push else ()
    cold = [j for j in guess if j not in have and j not in held and j not in resident]
    return SpecPlan(group, keep=tuple(r.read_id for r in kept), cancel=cancel, pin=pin, reads=split(cold, per_read))
