import os

import pytest

from kvstore.contract.errors import InvalidArgument
from kvstore.server.config import ServerConfig
from kvstore.server.shm_sessions import PeerPolicy


def test_peer_policy_admits_by_uid_or_gid_within_the_bound():
    policy = PeerPolicy(frozenset({1000}), frozenset({2000}), max_sessions=2)
    assert policy.refusal(1000, 5, num_open=0) is None  # allowed uid
    assert policy.refusal(5, 2000, num_open=1) is None  # allowed gid
    assert "shm_allowed_uids" in policy.refusal(0, 0, num_open=0)  # root is not special
    assert "max_shm_sessions (2)" in policy.refusal(1000, 2000, num_open=2)


def test_allow_lists_default_to_the_daemons_own_ids_and_bad_ones_name_the_key():
    cfg = ServerConfig()
    assert cfg.allowed_uids == {os.getuid()} and cfg.allowed_gids == {os.getgid()}
    assert ServerConfig(shm_allowed_uids=" 7, 8 ").allowed_uids == {7, 8}
    with pytest.raises(InvalidArgument, match="shm_allowed_gids"):
        ServerConfig(shm_allowed_gids="7,x")
    with pytest.raises(InvalidArgument, match="max_shm_sessions"):
        ServerConfig(max_shm_sessions=0)
    with pytest.raises(InvalidArgument, match="put_idle_seconds"):
        ServerConfig(put_idle_seconds=0)
