"""The remote tier's pure parts: routing, time to live, value formats, URLs and configuration."""

import numpy as np
import pytest
from helpers import GEOMETRIES
from hypothesis import given
from hypothesis import strategies as st

from kvstore.contract.errors import InvalidArgument
from kvstore.policy.remote import MAX_STRETCH, ttl_seconds
from kvstore.policy.routing import LEAST_LOADED, LOCAL, REMOTE, choose_node, leading_run
from kvstore.remote.config import RemoteConfig
from kvstore.remote.records import (
    RemoteChecksumError,
    RemoteManifest,
    decode_extent,
    decode_manifest,
    encode_extent,
    encode_manifest,
    extent_key,
)
from kvstore.remote.urls import parse_url


def test_the_longest_local_match_wins_then_the_lighter_load_then_the_smaller_id():
    assert choose_node({"a": 3, "b": 5}, {"a": 0.0, "b": 9.0}, 5).node_id == "b"
    assert choose_node({"a": 5, "b": 5}, {"a": 2.0, "b": 1.0}, 5).node_id == "b"
    assert choose_node({"a": 5, "b": 5}, {"b": 1.0, "a": 1.0}, 5).node_id == "a"
    c = choose_node({"a": 5}, {"a": 0.0, "b": 0.0}, 7)
    assert (c.node_id, c.reason, c.local_chunks, c.remote_chunks) == ("a", LOCAL, 5, 7)


def test_a_node_too_busy_loses_locality_and_nobody_holding_it_goes_to_the_idlest():
    assert choose_node({"a": 9}, {"a": 10.0, "b": 1.0}, 9, max_load_gap=4.0).reason == REMOTE
    assert choose_node({"a": 9}, {"a": 10.0, "b": 1.0}, 9, max_load_gap=4.0).node_id == "b"
    c = choose_node({}, {"a": 1.0, "b": 0.5}, 0)
    assert (c.node_id, c.reason) == ("b", LEAST_LOADED)
    with pytest.raises(ValueError):
        choose_node({}, {}, 0)


@given(st.lists(st.frozensets(st.sampled_from("abc")), max_size=12))
def test_leading_run_matches_brute_force(holders):
    for node in "abc":
        expected = next((j for j, s in enumerate(holders) if node not in s), len(holders))
        assert leading_run(holders, node) == expected


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_ttl_grows_with_reads_and_stays_within_the_stretch(base, reads, more):
    assert ttl_seconds(0, reads) == 0
    if base:
        assert base <= ttl_seconds(base, reads) <= base * MAX_STRETCH
        assert ttl_seconds(base, reads) <= ttl_seconds(base, reads + more)


def test_extent_values_catch_truncation_overwrites_and_swaps():
    a, b = np.arange(100, dtype=np.uint8), np.arange(100, dtype=np.uint8)[::-1].copy()
    xa, va = encode_extent(a)
    xb, vb = encode_extent(b)
    assert bytes(decode_extent(va, length=100, xxh3=xa)) == a.tobytes()
    for bad, why in (
        (va[:50], "holds"),
        (va[:-1] + bytes([va[-1] ^ 1]), "checksum"),
        (vb, "manifest"),
        (b"junk", "shorter"),
        (b"XXXX" + va[4:], "magic"),
    ):
        with pytest.raises(RemoteChecksumError, match=why):
            decode_extent(bad, length=100, xxh3=xa)
    assert extent_key("ab" * 32, 2, xa) != extent_key("ab" * 32, 2, xb)


def test_manifests_round_trip_and_refuse_damage():
    geo = GEOMETRIES[0]
    hashes = tuple(f"{i:064x}" for i in range(3))
    m = RemoteManifest(hashes[-1], "ns", "fp", geo, 40, hashes, "prefix", np.arange(9, dtype=np.uint64).reshape(3, 3))
    blob = encode_manifest(m)
    got = decode_manifest(blob, hashes[-1])
    assert (got.num_tokens, got.chunk_hashes, got.extent_xxh3.tolist()) == (40, hashes, m.extent_xxh3.tolist())
    assert got.extent_length(2, 0) == geo.extent_bytes(0, 8) and got.tokens_upto(2) == 32
    with pytest.raises(RemoteChecksumError):
        decode_manifest(blob[:-3], hashes[-1])
    with pytest.raises(RemoteChecksumError):
        decode_manifest(blob, hashes[0])  # stored under another id


def test_urls_and_configuration_are_checked_in_one_line():
    assert parse_url("redis-cluster://u:p%40ss@h1:7000,[::1]:7001") == (False, [("h1", 7000), ("::1", 7001)], "u", "p@ss")
    assert parse_url("redis-cluster+tls://h:1")[0] is True
    for url in ("redis://h:1", "redis-cluster://h", "redis-cluster://h:99999"):
        with pytest.raises(InvalidArgument, match="remote_url"):
            RemoteConfig(remote_url=url)
    with pytest.raises(InvalidArgument, match="remote_wait_seconds"):
        RemoteConfig(remote_url="redis-cluster://h:1", remote_wait_seconds=5.0)
    assert not RemoteConfig().enabled and RemoteConfig(remote_url="memory://").enabled
