"""An error raised inside the Redis client (as it can be mid-failover) is the remote tier being unavailable; one
raised in the tier's own code is not."""

import pytest

from kvstore.remote.base import RemoteUnavailable
from kvstore.remote.redis_cluster import RedisClusterTier, _raised_in_client

pytest.importorskip("redis")


def test_only_errors_from_inside_the_client_are_told_apart():
    from redis.crc import key_slot

    with pytest.raises(AttributeError) as inside:
        key_slot(None)
    assert _raised_in_client(inside.value)
    with pytest.raises(TypeError) as own:
        len(None)
    assert not _raised_in_client(own.value)


def test_a_client_failure_in_a_call_degrades_and_an_own_bug_propagates():
    from redis.crc import key_slot

    tier = RedisClusterTier([("127.0.0.1", 1)])
    tier._cluster = lambda: None  # no connection is made: the call's function fails by itself
    with pytest.raises(RemoteUnavailable, match="in the Redis client"):
        tier._call(lambda rc: key_slot(None))
    with pytest.raises(TypeError):
        tier._call(lambda rc: len(None))
