"""The Prefetch stream's protocol (``PeriodOrder``, pure): order, flow control, covered groups, hints, retirement."""

import pytest

from kvstore.contract.errors import InvalidArgument
from kvstore.server.prefetch_order import PeriodOrder
from kvstore.server.status import Backpressure


def order(num_periods=4, max_ahead=1, hinted=False, groups_per_period=1):
    return PeriodOrder(num_periods, groups_per_period, num_periods * groups_per_period, max_ahead=max_ahead, hinted=hinted)


def send(o, period, covered=False, pushed=None):
    """One set of chunks [0, 1]; ``covered``: the client computes the period's group on what was pushed for it."""
    pushed = pushed if pushed is not None else ({period: (period, set(range(8)))} if covered else {})
    groups = [period] if covered else []
    o.check_set(period)
    o.check_covered(period, {0, 1}, groups, pushed)
    o.accept_set(period, groups)


def test_periods_computed_from_pushes_do_not_count_as_outstanding():
    o = order()
    send(o, 0)
    o.mark_delivered(0)  # period 0's group went out
    send(o, 1, covered=True)  # the client computes period 1 on its push and chooses period 2 at once,
    send(o, 2, covered=True)  # before the daemon has accounted period 1 (delivered is still 0)
    assert o.delivered == 0 and o.next_period == 3


def test_a_client_ahead_of_what_it_was_sent_is_still_refused():
    o = order()
    send(o, 0)
    o.mark_delivered(0)
    send(o, 1)  # read from the daemon: outstanding until delivered
    with pytest.raises(Backpressure, match="period 2 is 2 ahead of the last delivered one \\(0\\); at most 1"):
        send(o, 2, covered=True)  # a pushed period after an outstanding one does not count as delivered


@pytest.mark.parametrize(
    "period, says",
    [(4, "period 4 out of range \\[0, 4\\)"), (1, "periods are sent in order: expected 0, got 1")],
)
def test_sets_come_in_order_and_in_range(period, says):
    with pytest.raises(InvalidArgument, match=says):
        order().check_set(period)


def test_a_passed_period_is_refused():
    o = order(max_ahead=2)
    send(o, 0)
    with pytest.raises(InvalidArgument, match="period 0 already passed; the next is 1"):
        o.check_set(0)


@pytest.mark.parametrize(
    "covered, pushed, says",
    [
        ([0, 0], {0: (0, {0, 1})}, "repeated group"),
        ([2], {2: (0, {0, 1})}, "group 2 is not one of period 0's"),
        ([0], {}, "group 0 was not pushed"),
        ([0], {0: (1, {0, 1})}, "group 0 was not pushed"),  # pushed for another period
        ([0], {0: (0, {0})}, "group 0: chunks \\[1\\] were not pushed"),
    ],
)
def test_covered_groups_must_be_the_periods_pushed_whole(covered, pushed, says):
    o = order(groups_per_period=2)
    with pytest.raises(InvalidArgument, match=says):
        o.check_covered(0, {0, 1}, covered, pushed)
    assert o.next_period == 0  # a refused set changes nothing


def test_hints_name_the_next_period_once_and_only_when_opened_with_hints():
    with pytest.raises(InvalidArgument, match="not opened with open.hints"):
        order().check_hint(0)
    o = order(hinted=True)
    with pytest.raises(InvalidArgument, match="next period not yet sent \\(0\\), got 1"):
        o.check_hint(1)
    o.check_hint(0)
    o.accept_hint(0)
    with pytest.raises(InvalidArgument, match="period 0 was already hinted"):
        o.check_hint(0)


def test_a_period_retires_once_delivered_and_the_next_set_sent():
    o = order(max_ahead=2)
    send(o, 0)
    assert o.to_retire() is None  # not delivered
    o.mark_delivered(0)
    assert o.to_retire() is None  # delivered, but the client may still compute on it
    send(o, 1)
    assert o.to_retire() == (0, 0)
    assert o.to_retire() is None  # each period once
    send(o, 2)
    o.mark_delivered(1)
    o.mark_delivered(2)
    send(o, 3)
    assert o.to_retire() == (1, 2)
