"""The pure rules of conversation records: what a request may change, and what it is refused for."""

import numpy as np
import pytest

from kvstore.contract.errors import FailedPrecondition, InvalidArgument, NotFound
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.conversation_rules import INACTIVE, appended, check_format, check_key, marked_inactive, parse_strategy, prefix_ids
from kvstore.hashing import chunk_hashes
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


def history(tokens, *, geometry=GEO) -> PrefixView:
    """A prefix of ``tokens`` as a put stores it: its id is its last chunk's chained hash."""
    hashes = tuple(h.hex() for h in chunk_hashes(np.array(tokens, dtype="<u4"), geometry, "ns", "m"))
    return PrefixView(hashes[-1], "ns", "m", geometry, len(tokens), hashes, (), 0.0)


TURN_0 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # two whole chunks of 4, then 2 tokens


@pytest.mark.parametrize(
    "tokens, chunk",
    [
        ([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], 0),  # longer, unrelated
        ([1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12], 1),  # chunk 1 differs
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 0], 2),  # as long, the last (short) chunk differs
        ([1, 2, 3, 4, 5, 6, 7], 1),  # ends inside chunk 1: shorter, refused by length first
    ],
)
def test_a_turn_that_does_not_extend_the_last_is_refused_naming_the_first_chunk_that_differs(tokens, chunk):
    rec = appended(None, "ns", "c", 0, history(TURN_0), now=1.0)
    assert history(TURN_0).first_chunk_not_extended(history(tokens)) == chunk
    with pytest.raises((FailedPrecondition, InvalidArgument)) as err:
        appended(rec, "ns", "c", 1, history(tokens), now=2.0, previous=history(TURN_0))
    message = str(err.value)
    assert message.startswith("prefix_id: ") and "\n" not in message
    if len(tokens) >= len(TURN_0):
        assert type(err.value) is FailedPrecondition
        assert message.endswith(f"does not extend turn 0's history {history(TURN_0).prefix_id[:16]}: chunk {chunk} differs")
    assert rec == appended(None, "ns", "c", 0, history(TURN_0), now=1.0)  # the record is a value: nothing changed


def test_a_turn_that_extends_the_last_is_appended():
    rec = appended(None, "ns", "c", 0, history(TURN_0), now=1.0)
    for tokens in (TURN_0, [*TURN_0, 11], [*TURN_0, 11, 12, 13, 14, 15, 16]):
        assert history(TURN_0).first_chunk_not_extended(history(tokens)) is None
        out = appended(rec, "ns", "c", 1, history(tokens), now=2.0, previous=history(TURN_0))
        assert out["turns"][-1]["prefix_id"] == history(tokens).prefix_id
    # the tokens of turn 0's short last chunk (9, 10) are stored nowhere: a longer history compares its whole chunks only
    assert history(TURN_0).first_chunk_not_extended(history([*TURN_0[:8], 0, 0, 0, 0])) is None
    # whole chunks only: every chunk compares
    whole = history(TURN_0[:8])
    assert whole.first_chunk_not_extended(history([*TURN_0[:7], 0, 9])) == 1
    # another geometry chains other hashes: chunk 0 differs, and the message says why
    other = StoreGeometry(ModelSpec(2, 1, 4, "float32"), chunk_tokens=2, group_layers=1)
    with pytest.raises(FailedPrecondition, match="chunk 0 differs; it is stored under another geometry$"):
        appended(rec, "ns", "c", 1, history([*TURN_0, 11], geometry=other), now=2.0, previous=history(TURN_0))
    # the last turn's prefix no longer stored (previous=None): only the token counts compare
    assert appended(rec, "ns", "c", 1, history(list(range(20, 32))), now=2.0)["turns"][1]["num_tokens"] == 12


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
