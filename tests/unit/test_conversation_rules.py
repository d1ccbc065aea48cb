"""The pure rules of conversation records: what a request may change, and what it is refused for."""

import pytest

from kvstore.conversations import INACTIVE, appended, check_format, check_key, marked_inactive, parse_strategy, prefix_ids
from kvstore.errors import FailedPrecondition, InvalidArgument, NotFound
from kvstore.geometry import ModelSpec, StoreGeometry
from kvstore.records import PrefixView

GEO = StoreGeometry(ModelSpec(2, 1, 4, "float32"), chunk_tokens=4, group_layers=1)


def view(pid: str, num_tokens: int, *, namespace="ns", model="m", kind="prefix", geometry=GEO) -> PrefixView:
    return PrefixView(pid * 64, namespace, model, geometry, num_tokens, (), (), 0.0, kind)


def test_turns_are_appended_in_order_and_a_retry_changes_nothing():
    rec = appended(None, "ns", "c", 0, view("a", 8), now=1.0)
    assert rec["model_fingerprint"] == "m" and rec["state"] == "active" and rec["created"] == 1.0
    assert rec["turns"] == [{"turn": 0, "prefix_id": "a" * 64, "num_tokens": 8, "kv_bytes": 8 * 2 * 2 * 4 * 4, "created": 1.0}]
    rec = appended(rec, "ns", "c", 1, view("b", 8), now=2.0)  # as long as the last: allowed
    assert appended(rec, "ns", "c", 1, view("b", 8), now=3.0) is None
    with pytest.raises(FailedPrecondition, match="^turn: turn 1 is recorded already"):
        appended(rec, "ns", "c", 1, view("c", 12), now=3.0)
    with pytest.raises(FailedPrecondition, match="^turn: turn 3 would leave a gap; the next turn is 2"):
        appended(rec, "ns", "c", 3, view("c", 12), now=3.0)
    with pytest.raises(NotFound):
        appended(None, "ns", "c", 1, view("a", 8), now=1.0)
    for bad, match in (
        (view("c", 7), "fewer than turn 1's 8"),
        (view("c", 12, model="other"), "of model 'other'"),
        (view("c", 12, namespace="x"), "in namespace 'x'"),
        (view("c", 12, kind="pages"), "batch of pages"),
    ):
        with pytest.raises(InvalidArgument, match=match) as err:
            appended(rec, "ns", "c", 2, bad, now=3.0)
        assert err.value.field == "prefix_id"
    assert prefix_ids(rec) == ["a" * 64, "b" * 64]


def test_the_compressed_form_holds_the_last_turns_tokens_under_any_geometry():
    rec = appended(None, "ns", "c", 0, view("a", 8), now=1.0)
    half = StoreGeometry(ModelSpec(1, 1, 4, "float16"), chunk_tokens=4, group_layers=1)
    out = marked_inactive(rec, view("z", 8, geometry=half), "kv8", {"bits": 8}, now=2.0)
    assert out["state"] == INACTIVE and out["compressed"]["kv_bytes"] == 8 * 1 * 2 * 4 * 2 and rec["compressed"] is None
    assert prefix_ids(out) == ["a" * 64, "z" * 64]
    with pytest.raises(InvalidArgument, match="the last turn's 8") as err:
        marked_inactive(rec, view("z", 12, geometry=half), "kv8", {}, now=2.0)
    assert err.value.field == "compressed_prefix_id"
    again = appended(out, "ns", "c", 1, view("b", 12), now=3.0)
    assert again["state"] == "active" and again["compressed"] == out["compressed"]
    assert marked_inactive(again, None, "", {}, now=4.0)["compressed"] is None


@pytest.mark.parametrize(
    "namespace, conversation_id, field",
    [("ns", "", "conversation_id"), ("ns", "x" * 129, "conversation_id"), ("ns", "é", "conversation_id"), ("a\0", "c", "namespace")],
)
def test_a_key_is_refused_by_the_field_that_is_wrong(namespace, conversation_id, field):
    with pytest.raises(InvalidArgument) as err:
        check_key(namespace, conversation_id)
    assert err.value.field == field


def test_labels_and_strategies():
    assert check_key("ns", "user-1:s.2_x") == b"ns\0user-1:s.2_x"
    assert check_format("krul-merge") == "krul-merge"
    for bad in ("", "KV8", "k v", "k" * 33):
        with pytest.raises(InvalidArgument, match="^format:"):
            check_format(bad)
    assert parse_strategy("") == {} and parse_strategy('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for bad in ("[]", "1", "{", '{"a": NaN}', "[" * 60_000, '{"a": "' + "x" * 65536 + '"}'):
        with pytest.raises(InvalidArgument, match="^strategy_json:"):
            parse_strategy(bad)
