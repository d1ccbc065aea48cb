"""The Prefetch stream's message protocol as a pure state machine: which sets and hints it accepts, and when a Period's resources go back.

A client sends each Period's chunk set in order, at most ``max_ahead``
Periods beyond the last one delivered (a Period it computes on wholly from
pushed groups needs no delivery); a hint names the next Period not yet
sent, once, and only on a stream opened with hints; a set may name groups
it computes on from what the daemon pushed (``covered``), which must be of
that Period, pushed for it, and hold every chunk of the set.

What a Period's descriptors point at stays valid until the Period is
delivered AND the client has sent the next Period's set (it computed on
them before it could choose that set); then ``to_retire`` hands the range
back.  No I/O here: ``prefetch.PrefetchHandler`` feeds it the messages and
acts on its answers.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..contract.errors import InvalidArgument
from .status import Backpressure


class PeriodOrder:
    def __init__(self, num_periods: int, groups_per_period: int, num_groups: int, *, max_ahead: int, hinted: bool):
        self.num_periods = num_periods
        self.groups_per_period = groups_per_period
        self.num_groups = num_groups
        self.max_ahead = max_ahead
        self.hinted = hinted
        self.next_period = 0
        self.delivered = -1  # last Period whose groups were all sent
        self.retired = -1  # last Period whose resources went back
        self._all_covered: set[int] = set()  # Periods computed wholly from pushes
        self._hints: set[int] = set()

    def period_groups(self, period: int) -> list[int]:
        first = period * self.groups_per_period
        return list(range(first, min(first + self.groups_per_period, self.num_groups)))

    def check_set(self, period: int) -> None:
        """A set for ``period`` may come now (range, order, how far ahead); raises otherwise."""
        p = period
        if p >= self.num_periods:
            raise InvalidArgument("period.period", f"period {p} out of range [0, {self.num_periods})")
        if p < self.next_period:
            raise InvalidArgument("period.period", f"period {p} already passed; the next is {self.next_period}")
        if p > self.next_period:
            raise InvalidArgument("period.period", f"periods are sent in order: expected {self.next_period}, got {p}")
        delivered = self.delivered  # as the client sees it: a Period computed from pushes needs no delivery
        while delivered + 1 in self._all_covered:
            delivered += 1
        if p - delivered > self.max_ahead:
            raise Backpressure(
                f"period.period: period {p} is {p - delivered} ahead of the last delivered one "
                f"({delivered}); at most {self.max_ahead} may be outstanding"
            )

    def check_covered(self, period: int, wanted: set, covered: list[int], pushed: Mapping[int, tuple[int, set]]) -> None:
        """``covered`` groups are of ``period``, pushed for it (``pushed``: group -> (period, chunks)), and hold ``wanted``."""
        groups = self.period_groups(period)
        if len(set(covered)) != len(covered):
            raise InvalidArgument("period.covered_groups", f"repeated group in {covered}")
        for g in covered:
            if g not in groups:
                raise InvalidArgument("period.covered_groups", f"group {g} is not one of period {period}'s ({groups})")
            push = pushed.get(g)
            if push is None or push[0] != period:
                raise InvalidArgument("period.covered_groups", f"group {g} was not pushed")
            extra = sorted(wanted - set(push[1]))
            if extra:
                raise InvalidArgument("period.covered_groups", f"group {g}: chunks {extra[:8]} were not pushed")

    def accept_set(self, period: int, covered: list[int]) -> None:
        """The set for ``period`` (checked) is taken: the next one may follow."""
        if set(covered) == set(self.period_groups(period)):
            self._all_covered.add(period)
        self.next_period = period + 1

    def check_hint(self, period: int) -> None:
        if not self.hinted:
            raise InvalidArgument("hint", "the stream was not opened with open.hints")
        if period != self.next_period or period >= self.num_periods:
            raise InvalidArgument("hint.period", f"a hint is for the next period not yet sent ({self.next_period}), got {period}")
        if period in self._hints:
            raise InvalidArgument("hint.period", f"period {period} was already hinted")

    def accept_hint(self, period: int) -> None:
        self._hints.add(period)

    def mark_delivered(self, period: int) -> None:
        self.delivered = period

    def to_retire(self) -> tuple[int, int] | None:
        """The Periods whose resources may go back now (delivered, and a later set sent), each once."""
        last = min(self.delivered, self.next_period - 2)
        if last <= self.retired:
            return None
        span = (self.retired + 1, last)
        self.retired = last
        return span
