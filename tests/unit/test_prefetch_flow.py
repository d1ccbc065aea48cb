"""The Prefetch stream's flow control: a period the client computes on from pushes needs no delivery to count."""

from types import SimpleNamespace

import numpy as np
import pytest

from kvstore._proto import kvstore_pb2 as pb
from kvstore.server.prefetch import PrefetchHandler, _Push
from kvstore.server.status import Backpressure


def handler(num_periods=4):
    """A stream's bookkeeping alone: one group per period, 8 chunks, nothing read (no store needed)."""
    h = PrefetchHandler.__new__(PrefetchHandler)
    h.num_periods, h.groups_per_period = num_periods, 1
    h.geometry = SimpleNamespace(num_groups=num_periods)
    h.view = SimpleNamespace(num_chunks=8)
    h.next_period, h.delivered, h._retired = 0, -1, -1
    h._all_covered, h._pushed = set(), {}
    h.exec = SimpleNamespace(retire=lambda first, last: None)
    return h


def send(h, period, covered=False):
    if covered:
        h._pushed[period] = _Push(period, {j: None for j in range(8)})
    msg = pb.PeriodSet(period=period, chunks=[0, 1], covered_groups=[period] if covered else [])
    return h.check_period(msg, max_ahead=1)


def test_periods_computed_from_pushes_do_not_count_as_outstanding():
    h = handler()
    np.testing.assert_array_equal(send(h, 0), [0, 1])
    h.delivered = 0  # period 0's group went out
    send(h, 1, covered=True)  # the client computes period 1 on its push and chooses period 2 at once,
    send(h, 2, covered=True)  # before the daemon has accounted period 1 (delivered is still 0)
    assert h.delivered == 0 and h.next_period == 3


def test_a_client_ahead_of_what_it_was_sent_is_still_refused():
    h = handler()
    send(h, 0)
    h.delivered = 0
    send(h, 1)  # read from the daemon: outstanding until delivered
    with pytest.raises(Backpressure, match="period 2 is 2 ahead of the last delivered one \\(0\\); at most 1"):
        send(h, 2, covered=True)  # a pushed period after an outstanding one does not count as delivered
