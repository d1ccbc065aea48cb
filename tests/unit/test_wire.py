"""The client's results carry every field of the replies they are read from."""

from dataclasses import fields

import numpy as np
import pytest

from kvstore.contract import (
    ChunkScores,
    CompactResult,
    CompressedForm,
    ConversationDeleted,
    ConversationInfo,
    ConversationTurn,
    EvictResult,
    LatencySummary,
    LookupResult,
    PagesPresent,
    PagesPutResult,
    PrefetchStats,
    PrefixDescription,
    PrefixInfo,
    PrefixKept,
    PutResult,
    SegmentReport,
    StoreStats,
    array_frames,
    array_from_frames,
    conversation_deleted_from_pb,
    conversation_from_pb,
    description_from_pb,
    geometry_to_pb,
    pb,
    read_from_header,
    stats_from_pb,
)
from kvstore.contract.geometry import ModelSpec, StoreGeometry

PAIRS = [
    (LookupResult, pb.LookupResponse),
    (PutResult, pb.PutPrefixResponse),
    (PagesPresent, pb.PagesExistResponse),
    (PagesPutResult, pb.PutPagesResponse),
    (PrefixDescription, pb.DescribeResponse),
    (PrefixInfo, pb.PrefixInfo),
    (ChunkScores, pb.GetScoresResponse),
    (LatencySummary, pb.LatencySummary),
    (StoreStats, pb.StatsResponse),
    (PrefetchStats, pb.PrefetchStats),
    (SegmentReport, pb.SegmentReport),
    (EvictResult, pb.EvictResponse),
    (CompactResult, pb.CompactResponse),
    (ConversationTurn, pb.ConversationTurn),
    (CompressedForm, pb.CompressedForm),
    (ConversationInfo, pb.ConversationInfo),
    (PrefixKept, pb.PrefixKept),
    (ConversationDeleted, pb.DeleteConversationResponse),
]
GEO = StoreGeometry(ModelSpec(4, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2)


@pytest.mark.parametrize("result, message", PAIRS, ids=[r.__name__ for r, _ in PAIRS])
def test_a_result_has_its_messages_fields_in_their_order(result, message):
    assert [f.name for f in fields(result)] == [f.name for f in message.DESCRIPTOR.fields]


def test_replies_become_values_with_nothing_of_protobuf_left():
    desc = description_from_pb(pb.DescribeResponse(prefix_id="ab", geometry=geometry_to_pb(GEO), num_tokens=40, num_chunks=3))
    assert desc.geometry == GEO and desc.num_tokens == 40 and desc.kind == ""
    st = stats_from_pb(pb.StatsResponse(backend="posix", latency=[pb.LatencySummary(rpc="Lookup", count=2, p50_ms=0.5)]))
    assert st.backend == "posix" and st.latency == (LatencySummary("Lookup", 2, 0.5, 0.0, 0.0),)
    read = read_from_header("ab", pb.ReadHeader(geometry=geometry_to_pb(GEO), chunks=[0, 2], chunk_tokens=[16, 8], groups=[1]), False)
    assert read.chunks.tolist() == [0, 2] and read.groups == [1] and read.geometry == GEO


def test_array_frames_round_trip():
    arr = np.arange(3 * 5 * 7, dtype=np.float32).reshape(3, 5, 7)
    np.testing.assert_array_equal(array_from_frames(array_frames(arr, frame_bytes=64)), arr)
    # packed quantized probe rows keep their dtype and shape, a non-contiguous slice included
    rows = np.arange(2 * 9 * 36, dtype=np.uint8).reshape(2, 9, 36)[:, 2:7]
    got = array_from_frames(array_frames(rows, frame_bytes=50))
    assert got.dtype == np.uint8 and got.shape == (2, 5, 36)
    np.testing.assert_array_equal(got, rows)


def test_geometry_carries_probe_bits_both_ways_and_refuses_bad_ones_by_name():
    from dataclasses import replace

    from kvstore.contract import geometry_from_pb
    from kvstore.contract.errors import InvalidArgument

    for bits in (0, 4, 8):
        geo = replace(GEO, probe_bits=bits)
        assert geometry_from_pb(geometry_to_pb(geo)) == geo
    msg = geometry_to_pb(GEO)
    msg.probe_bits = 3
    with pytest.raises(InvalidArgument, match="must be one of 0, 4, 8") as err:
        geometry_from_pb(msg)
    assert err.value.field == "geometry.probe_bits"


def test_conversation_replies_become_values():
    msg = pb.ConversationInfo(
        conversation_id="c", state="active", num_turns=1, turns=[pb.ConversationTurn(turn=0, prefix_id="ab", stored=True)]
    )
    info = conversation_from_pb(msg)
    assert info.compressed is None and info.turns == (ConversationTurn(0, "ab", 0, 0.0, True, 0),)
    msg.compressed.CopyFrom(pb.CompressedForm(prefix_id="cd", format="kv8", strategy_json='{"bits": 8}'))
    assert conversation_from_pb(msg).compressed.strategy == {"bits": 8}
    deleted = conversation_deleted_from_pb(
        pb.DeleteConversationResponse(
            conversation_id="c", deleted_prefixes=["ab"], kept_prefixes=[pb.PrefixKept(prefix_id="cd", reason="why")]
        )
    )
    assert deleted == ConversationDeleted("c", ("ab",), (PrefixKept("cd", "why"),))
