"""Conversation records on a real daemon: turns, compression, listings, deletes, restarts, rebuilds, namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest
from helpers import data_root, make_kv, make_tokens
from test_metrics import metrics_port, scrape

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.layout import SegmentLayout

GEO = StoreGeometry(ModelSpec(4, 2, 8, "float16"), chunk_tokens=16, group_layers=2)
# the compressed form: half the layers (a merge of layer pairs), stored under its own geometry
MERGED = StoreGeometry(ModelSpec(2, 2, 8, "float16"), chunk_tokens=16, group_layers=2)
HISTORY = (48, 88, 130)  # tokens of each turn's history: 3 whole chunks, then 40 and 42 more tokens
TOKENS, KV = make_tokens(200, 1), make_kv(GEO, 200, 1)
STRATEGY = {
    "recompute_tokens": [16, 8],
    "selector": {"gamma": 0.6, "ratio": 0.5, "non_ir": [0], "pairs": [[2, 3]], "distances": [0.1], "num_layers": 4},
    "edge_mass": [0.31, 0.9, 1.0, 1.25],
}


def admin(*argv) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "KVSTORE_SOCKET"}, "PYTHONPATH": data_root()}
    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", *argv], cwd=data_root(), env=env, capture_output=True, text=True, timeout=120
    )


def put_history(client, n: int, *, namespace="", model="m", geometry=GEO, kv=KV):
    return client.put_prefix(TOKENS[:n], kv[: geometry.model.num_layers, :, :, :n], geometry, namespace=namespace, model_fingerprint=model)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(KVStoreRpcError) as err:
        call()
    return err.value.code


def refused(call, code: grpc.StatusCode, field: str | None = None) -> str:
    """``call`` fails with ``code``, with a one-line message naming ``field``."""
    with pytest.raises(KVStoreRpcError) as err:
        call()
    assert err.value.code == code, err.value
    assert "\n" not in err.value.message
    if field is not None:
        assert err.value.message.startswith(f"{field}:"), err.value.message
    return err.value.message


def three_turns(client, conversation_id="chat-1", namespace="") -> list:
    puts = [put_history(client, n, namespace=namespace) for n in HISTORY]
    for turn, res in enumerate(puts):
        info = client.append_turn(conversation_id, turn, res.prefix_id[:12] if turn == 1 else res.prefix_id, namespace=namespace)
    assert info.num_turns == 3
    return puts


def test_a_conversation_grows_turn_by_turn_is_compressed_and_shown(daemon_factory):
    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    with KVStoreClient(d.target) as client:
        puts = three_turns(client)
        # each turn's history extends the last one: its put writes only the new chunks
        assert puts[1].reused_chunks == 3 and puts[1].bytes_written == SegmentLayout(GEO, 88 - 48).total_bytes
        assert puts[1].bytes_written < SegmentLayout(GEO, 88).total_bytes
        # 48 + 40: the last chunk of turn 1 held 8 tokens; turn 2 writes it again whole, then its own
        assert puts[2].reused_chunks == 5 and puts[2].bytes_written == SegmentLayout(GEO, 130 - 80).total_bytes

        info = client.get_conversation("chat-1")
        assert (info.state, info.num_turns, info.num_tokens, info.model_fingerprint) == ("active", 3, 130, "m")
        assert [(t.turn, t.prefix_id, t.num_tokens, t.stored) for t in info.turns] == [
            (i, p.prefix_id, n, True) for i, (p, n) in enumerate(zip(puts, HISTORY))
        ]
        kv_bytes = 130 * GEO.model.num_layers * GEO.model.token_layer_bytes
        assert info.uncompressed_bytes == kv_bytes and info.compressed is None and info.compressed_bytes == 0
        # the last turn's prefix reaches every segment of the conversation: each counted once
        assert info.stored_bytes == sum(s["total_bytes"] for s in client.inspect(puts[2].prefix_id)["segments"])
        assert info.stored_bytes == sum(p.bytes_written for p in puts) and info.missing_prefixes == 0
        assert client.append_turn("chat-1", 2, puts[2].prefix_id) == info  # a retry of the last turn changes nothing

        (listed,) = client.list_conversations()
        assert listed.conversation_id == "chat-1" and listed.num_turns == 3 and listed.turns == ()

        merged = put_history(client, 130, geometry=MERGED, kv=KV)
        info = client.mark_inactive("chat-1", compressed_prefix_id=merged.prefix_id, format="krul-merge", strategy=STRATEGY)
        assert info.state == "inactive" and info.compressed.prefix_id == merged.prefix_id and info.compressed.stored
        assert info.compressed.strategy == STRATEGY and info.compressed.format == "krul-merge"
        assert info.compressed_bytes * 2 == info.uncompressed_bytes
        assert info.stored_bytes == sum(p.bytes_written for p in puts) + merged.bytes_written

        listing = admin("--socket-path", d.socket, "conversations")
        assert listing.returncode == 0, listing.stderr
        header, row, footer = listing.stdout.splitlines()
        assert header.split()[:6] == ["CONVERSATION", "NAMESPACE", "STATE", "TURNS", "TOKENS", "FORMAT"]
        assert row.split()[:6] == ["chat-1", "-", "inactive", "3", "130", "krul-merge"] and "2.0x" in row
        assert footer == "1 conversations"
        shown = admin("--socket-path", d.socket, "conversation", "chat-1")
        assert shown.returncode == 0, shown.stderr
        assert "krul-merge" in shown.stdout and '{"recompute_tokens": [16, 8]}' in shown.stdout
        assert "input-sensitive layers [0], pairs [[2, 3]]" in shown.stdout and "per layer 0.31 0.90 1.00 1.25" in shown.stdout
        turn_rows = [ln.split() for ln in shown.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"], ["2"])]
        assert [(r[0], r[1], r[2], r[-1]) for r in turn_rows] == [
            (str(i), p.prefix_id, str(n), "yes") for i, (p, n) in enumerate(zip(puts, HISTORY))
        ]
        as_json = json.loads(admin("--socket-path", d.socket, "--json", "conversation", "chat-1").stdout)
        assert as_json["compressed"]["strategy"] == STRATEGY and len(as_json["turns"]) == 3

        # a new turn makes it active again; the compressed form stays until the next MarkInactive
        fourth = put_history(client, 200)
        info = client.append_turn("chat-1", 3, fourth.prefix_id)
        assert info.state == "active" and info.compressed.prefix_id == merged.prefix_id and info.num_tokens == 200
        assert client.mark_inactive("chat-1").compressed is None  # inactive, no compressed form

        # a prefix deleted (or evicted) is reported, not an error
        client.delete(puts[0].prefix_id)
        info = client.get_conversation("chat-1")
        assert [t.stored for t in info.turns] == [False, True, True, True] and info.missing_prefixes == 1

        assert client.stats().num_conversations == 1
    assert scrape(metrics_port(d))[("kvstore_conversations", ())] == 1


def test_every_bad_request_is_refused_by_name_and_changes_nothing(daemon):
    INVALID, FAILED, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND
    with KVStoreClient(daemon.target) as client:
        puts = [put_history(client, n) for n in HISTORY]
        client.append_turn("c", 0, puts[0].prefix_id)
        client.append_turn("c", 1, puts[1].prefix_id)
        other_model = put_history(client, 130, model="other")
        merged = put_history(client, 88, geometry=MERGED)  # the last turn's 88 tokens, another geometry
        short = put_history(client, 40, geometry=MERGED)
        before = client.get_conversation("c")
        cases = [
            (lambda: client.append_turn("c d", 2, puts[2].prefix_id), INVALID, "conversation_id"),
            (lambda: client.append_turn("c/d", 0, puts[0].prefix_id), INVALID, "conversation_id"),
            (lambda: client.append_turn("x" * 129, 0, puts[0].prefix_id), INVALID, "conversation_id"),
            (lambda: client.append_turn("", 0, puts[0].prefix_id), INVALID, "conversation_id"),
            (lambda: client.append_turn("c", 1, puts[2].prefix_id), FAILED, "turn"),  # turn 1 has another prefix
            (lambda: client.append_turn("c", 0, puts[0].prefix_id), FAILED, "turn"),  # an older turn
            (lambda: client.append_turn("c", 3, puts[2].prefix_id), FAILED, "turn"),  # a gap
            (lambda: client.append_turn("c", 2, "0" * 64), NOT_FOUND, None),
            (lambda: client.append_turn("c", 2, "abc"), INVALID, "prefix_id"),
            (lambda: client.append_turn("c", 2, other_model.prefix_id), INVALID, "prefix_id"),
            (lambda: client.append_turn("c", 2, puts[0].prefix_id), INVALID, "prefix_id"),  # the history shrinks
            (lambda: client.append_turn("c", 2, puts[2].prefix_id, namespace="a\0b"), INVALID, "namespace"),
            (lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="KV8"), INVALID, "format"),
            (lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="k" * 33), INVALID, "format"),
            (lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id), INVALID, "format"),
            (lambda: client.mark_inactive("c", format="kv8"), INVALID, "format"),  # a label of no compressed form
            (
                lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="kv8", strategy={"x": "y" * 65536}),
                INVALID,
                "strategy_json",
            ),
            (
                lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="kv8", strategy="[1]"),
                INVALID,
                "strategy_json",
            ),
            (
                lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="kv8", strategy="{"),
                INVALID,
                "strategy_json",
            ),
            (
                lambda: client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="kv8", strategy="[" * 60000),
                INVALID,
                "strategy_json",
            ),
            (lambda: client.mark_inactive("c", compressed_prefix_id=short.prefix_id, format="kv8"), INVALID, "compressed_prefix_id"),
            (lambda: client.mark_inactive("c", compressed_prefix_id="f" * 64, format="kv8"), NOT_FOUND, None),
            (lambda: client.mark_inactive("nobody", compressed_prefix_id=merged.prefix_id, format="kv8"), NOT_FOUND, None),
            (lambda: client.get_conversation("nobody"), NOT_FOUND, None),
            (lambda: client.get_conversation("c", namespace="elsewhere"), NOT_FOUND, None),
            (lambda: client.delete_conversation("nobody", delete_prefixes=True), NOT_FOUND, None),
            (lambda: client.append_turn("new", 1, puts[0].prefix_id), NOT_FOUND, None),  # unknown conversation
        ]
        for call, code, field in cases:
            refused(call, code, field)
            assert client.get_conversation("c") == before
        assert [c.conversation_id for c in client.list_conversations()] == ["c"]
        assert {p.prefix_id for p in client.list_prefixes()} >= {p.prefix_id for p in puts}
        # the compressed prefix holds the last turn's 88 tokens under another geometry: accepted
        assert client.mark_inactive("c", compressed_prefix_id=merged.prefix_id, format="kv8").state == "inactive"


def test_a_turn_must_extend_the_last_turns_tokens(daemon):
    FAILED = grpc.StatusCode.FAILED_PRECONDITION
    with KVStoreClient(daemon.target) as client:
        first = put_history(client, 48)  # chunks 0-2
        client.append_turn("c", 0, first.prefix_id)
        before = client.get_conversation("c")
        unrelated = make_tokens(300, 2)
        assert unrelated[0] != TOKENS[0]
        unrelated = client.put_prefix(unrelated, make_kv(GEO, 300, 2), GEO, model_fingerprint="m")
        edited = TOKENS[:88].copy()
        edited[2 * 16 + 5] += 1  # chunk 2 differs, chunks 0 and 1 are turn 0's
        edited = client.put_prefix(edited, KV[:, :, :, :88], GEO, model_fingerprint="m")
        assert edited.reused_chunks == 2
        for put, chunk in ((unrelated, 0), (edited, 2)):
            message = refused(lambda: client.append_turn("c", 1, put.prefix_id), FAILED, "prefix_id")
            assert message.endswith(f"does not extend turn 0's history {first.prefix_id[:16]}: chunk {chunk} differs"), message
            assert client.get_conversation("c") == before
        extension = put_history(client, 88)
        info = client.append_turn("c", 1, extension.prefix_id)
        assert [t.prefix_id for t in info.turns] == [first.prefix_id, extension.prefix_id]


def test_delete_with_and_without_its_prefixes(daemon):
    with KVStoreClient(daemon.target) as client:
        p0, p1, p2 = (put_history(client, n).prefix_id for n in HISTORY)
        client.append_turn("a", 0, p0)
        client.append_turn("a", 1, p1)
        client.append_turn("b", 0, p0)  # shares a's first turn
        client.append_turn("c", 0, p2)

        gone = client.delete_conversation("c")  # the record only
        assert gone.conversation_id == "c" and gone.deleted_prefixes == () and gone.kept_prefixes == ()
        assert code_of(lambda: client.get_conversation("c")) == grpc.StatusCode.NOT_FOUND
        assert p2 in {p.prefix_id for p in client.list_prefixes()}

        gone = client.delete_conversation("a", delete_prefixes=True)
        assert gone.deleted_prefixes == (p1,)
        assert [(k.prefix_id, k.reason) for k in gone.kept_prefixes] == [(p0, "named by another conversation")]
        assert {p.prefix_id for p in client.list_prefixes()} == {p0, p2}

        with KVStoreClient(daemon.target, shm=True) as reader_client:  # a read holds p0: it is kept, and why
            reader = reader_client.prefetch(p0, period_layers=GEO.group_layers)
            reader.send(0, [0])
            list(reader.groups(0))
            gone = client.delete_conversation("b", delete_prefixes=True)
            assert gone.deleted_prefixes == () and [(k.prefix_id, k.reason) for k in gone.kept_prefixes] == [
                (p0, "in use by a read or a put")
            ]
            reader.close()
        assert {p.prefix_id for p in client.list_prefixes()} == {p0, p2} and client.list_conversations() == []


def test_records_survive_a_restart_and_a_rebuild_of_a_lost_index(daemon_factory):
    d = daemon_factory()
    with KVStoreClient(d.target) as client:
        three_turns(client, "kept")
        merged = put_history(client, 130, geometry=MERGED)
        client.mark_inactive("kept", compressed_prefix_id=merged.prefix_id, format="kv8", strategy=STRATEGY)
        client.append_turn("dropped", 0, put_history(client, 48).prefix_id)
        client.delete_conversation("dropped")
        before = client.get_conversation("kept")
    assert d.stop() == 0
    d.start()
    with KVStoreClient(d.target) as client:
        assert client.get_conversation("kept") == before
        assert [c.conversation_id for c in client.list_conversations()] == ["kept"]
    assert d.stop(signal.SIGKILL) != 0
    os.unlink(os.path.join(d.data_dir, "index", "data.mdb"))
    rebuilt = admin("--data-dir", d.data_dir, "--json", "rebuild-index")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    report = json.loads(rebuilt.stdout)
    assert report["conversations"] == ["/kept"] and report["skipped_conversations"] == {}
    d.start()
    with KVStoreClient(d.target) as client:
        assert client.get_conversation("kept") == before
        assert [c.conversation_id for c in client.list_conversations()] == ["kept"]


TENANT_A = "tenant-a-token-0123456789"
TENANT_B = "tenant-b-token-0123456789"
OPERATOR = "operator-token-0123456789"


def test_a_token_reaches_only_the_conversations_of_its_namespaces(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TENANT_A}" = ["a"]\n"{TENANT_B}" = ["b"]\n"{OPERATOR}" = ["*"]\n')
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-tokens-file", str(tokens))
    tcp = f"127.0.0.1:{d.tcp_port}"
    denied, not_found = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND
    with KVStoreClient(tcp, token=TENANT_A) as a, KVStoreClient(tcp, token=TENANT_B) as b, KVStoreClient(tcp, token=OPERATOR) as op:
        pid_a = put_history(a, 48, namespace="a").prefix_id
        pid_b = put_history(b, 48, namespace="b").prefix_id
        a.append_turn("chat", 0, pid_a, namespace="a")
        b.append_turn("chat", 0, pid_b, namespace="b")
        before = op.get_conversation("chat", namespace="a")
        for call in (
            lambda: b.get_conversation("chat", namespace="a"),
            lambda: b.append_turn("chat", 1, pid_b, namespace="a"),
            lambda: b.mark_inactive("chat", namespace="a"),
            lambda: b.delete_conversation("chat", namespace="a", delete_prefixes=True),
        ):
            assert code_of(call) == denied
        assert code_of(lambda: b.append_turn("other", 0, pid_a, namespace="b")) == not_found  # a's prefix does not exist for b
        assert code_of(lambda: b.mark_inactive("chat", compressed_prefix_id=pid_a, format="kv8", namespace="b")) == not_found
        assert [(c.namespace, c.conversation_id) for c in b.list_conversations()] == [("b", "chat")]
        assert b.list_conversations("a") == []
        # a token that sees both namespaces still cannot name another namespace's prefix in a conversation
        refused(lambda: op.append_turn("chat", 1, pid_b, namespace="a"), grpc.StatusCode.INVALID_ARGUMENT, "prefix_id")
        assert {(c.namespace, c.conversation_id) for c in op.list_conversations()} == {("a", "chat"), ("b", "chat")}
        assert op.get_conversation("chat", namespace="a") == before
        assert [t.stored for t in before.turns] == [True]


def test_a_change_killed_before_its_commit_is_not_kept_nor_brought_back_by_a_rebuild(daemon_factory):
    d = daemon_factory()
    with KVStoreClient(d.target) as client:
        puts = [put_history(client, n) for n in HISTORY]
        client.append_turn("c", 0, puts[0].prefix_id)
        client.append_turn("c", 1, puts[1].prefix_id)
        client.append_turn("gone", 0, puts[0].prefix_id)
        acked = client.get_conversation("c")
    d.stop()
    data = d.data_dir
    for step, call in (
        ("conversation:file-written", lambda c: c.append_turn("c", 2, puts[2].prefix_id)),  # record file written, index not
        ("conversation:deleted", lambda c: c.delete_conversation("gone")),  # index committed, record file not removed
    ):
        dying = daemon_factory(data_dir=data, env={"KVSTORE_FAULTS": "1", "KVSTORE_CRASH_AT": step})
        with KVStoreClient(dying.target, deadline_s=5) as client:
            assert code_of(lambda: call(client)) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert dying.proc.wait(30) == -signal.SIGKILL
    # offline, the store opens with its index: the unacknowledged turn is not there, the deleted record is gone
    listing = admin("--data-dir", data, "--json", "conversations")
    assert listing.returncode == 0, listing.stderr
    assert [(c["conversation_id"], c["num_turns"]) for c in json.loads(listing.stdout)] == [("c", 2)]
    os.unlink(os.path.join(data, "index", "data.mdb"))
    assert admin("--data-dir", data, "rebuild-index").returncode == 0  # from the record files the open brought in line
    d = daemon_factory(data_dir=data)
    with KVStoreClient(d.target) as client:
        assert client.get_conversation("c") == acked
        assert [c.conversation_id for c in client.list_conversations()] == ["c"]
        assert client.append_turn("c", 2, puts[2].prefix_id).num_turns == 3
