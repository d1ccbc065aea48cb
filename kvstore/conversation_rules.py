"""The rules of conversation records: pure functions of a record and the prefixes' views.

What a request may change (``appended``, ``marked_inactive``), the checks of
its fields, and which prefixes a record names and holds.  Each raises before
anything changes; ``conversations.Conversations`` applies them under the
record's lock.  No I/O.
"""

from __future__ import annotations

import json
import string

from .contract.errors import FailedPrecondition, InvalidArgument, NotFound
from .hashing import MAX_NAMESPACE_BYTES, validate_label
from .index import conversation_key
from .records import PREFIX, PrefixView

ACTIVE, INACTIVE = "active", "inactive"
ID_CHARS = frozenset(string.ascii_letters + string.digits + "._:-")
MAX_ID_CHARS = 128
FORMAT_CHARS = frozenset(string.ascii_lowercase + string.digits + "._-")
MAX_FORMAT_CHARS = 32
MAX_STRATEGY_BYTES = 64 * 1024


# ------------------------------------------------------------ request fields
def check_key(namespace: str, conversation_id: str) -> bytes:
    """The record key; InvalidArgument naming the field that is wrong."""
    validate_label("namespace", namespace, MAX_NAMESPACE_BYTES)
    if not isinstance(conversation_id, str) or not 1 <= len(conversation_id) <= MAX_ID_CHARS:
        got = len(conversation_id) if isinstance(conversation_id, str) else type(conversation_id).__name__
        raise InvalidArgument("conversation_id", f"must be 1-{MAX_ID_CHARS} characters, got {got}")
    bad = sorted(set(conversation_id) - ID_CHARS)
    if bad:
        raise InvalidArgument("conversation_id", f"may hold only letters, digits and . _ : -, got {bad[0]!r}")
    return conversation_key(namespace, conversation_id)


def check_format(fmt: str) -> str:
    if not 1 <= len(fmt) <= MAX_FORMAT_CHARS or not set(fmt) <= FORMAT_CHARS:
        raise InvalidArgument("format", f"must be 1-{MAX_FORMAT_CHARS} characters of [a-z0-9._-] (e.g. kv8), got {fmt[:40]!r}")
    return fmt


def parse_strategy(text: str) -> dict:
    """The strategy object of ``strategy_json`` ("" = {})."""
    if len(text.encode()) > MAX_STRATEGY_BYTES:
        raise InvalidArgument("strategy_json", f"longer than {MAX_STRATEGY_BYTES} bytes")
    if not text:
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("strategy_json", f"is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise InvalidArgument("strategy_json", f"must be a JSON object, got {type(value).__name__}")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def check_prefix(view: PrefixView, field: str, namespace: str, model_fingerprint: str | None) -> None:
    """A prefix a record may name: a token prefix of the conversation's namespace and model."""
    pid = view.prefix_id[:16]
    if view.kind != PREFIX:
        raise InvalidArgument(field, f"{pid} is a batch of pages ({view.kind}), not a prefix")
    if view.namespace != namespace:
        raise InvalidArgument(field, f"prefix {pid} is in namespace {view.namespace!r}, the conversation in {namespace!r}")
    if model_fingerprint is not None and view.model_fingerprint != model_fingerprint:
        raise InvalidArgument(field, f"prefix {pid} is of model {view.model_fingerprint!r}, the conversation of {model_fingerprint!r}")


# ------------------------------------------------------------ rules
def appended(
    record: dict | None, namespace: str, conversation_id: str, turn: int, view: PrefixView, now: float, previous: PrefixView | None = None
) -> dict | None:
    """The record with ``turn`` appended; None when it is a retry of the last turn (nothing changes).

    ``previous`` is the last turn's prefix: ``view`` must extend its tokens
    (``check_extends``).  None when it is no longer stored (an inactive
    conversation's history may be evicted): then only the token counts
    compare.
    """
    turns = record["turns"] if record else []
    if record is None and turn != 0:
        raise NotFound(f"conversation {conversation_id!r} is not stored in namespace {namespace!r} (its first turn is 0)")
    if turn < len(turns):
        if turn == len(turns) - 1 and turns[-1]["prefix_id"] == view.prefix_id:
            return None
        raise FailedPrecondition(
            f"turn: turn {turn} is recorded already (prefix {turns[turn]['prefix_id'][:16]}); the next turn is {len(turns)}"
        )
    if turn > len(turns):
        raise FailedPrecondition(f"turn: turn {turn} would leave a gap; the next turn is {len(turns)}")
    check_prefix(view, "prefix_id", namespace, record["model_fingerprint"] if record else None)
    if turns and view.num_tokens < turns[-1]["num_tokens"]:
        raise InvalidArgument(
            "prefix_id", f"holds {view.num_tokens} tokens, fewer than turn {turn - 1}'s {turns[-1]['num_tokens']}: a history only grows"
        )
    if previous is not None:
        check_extends(previous, view, turn - 1)
    entry = {"turn": turn, "prefix_id": view.prefix_id, "num_tokens": view.num_tokens, "kv_bytes": view.kv_bytes, "created": now}
    base = record or {
        "conversation_id": conversation_id,
        "namespace": namespace,
        "model_fingerprint": view.model_fingerprint,
        "compressed": None,
        "created": now,
    }
    return {**base, "state": ACTIVE, "turns": [*turns, entry], "updated": now}


def check_extends(previous: PrefixView, view: PrefixView, previous_turn: int) -> None:
    """FailedPrecondition naming the first chunk of ``previous`` (turn ``previous_turn``'s prefix) that ``view`` does not start with."""
    j = previous.first_chunk_not_extended(view)
    if j is None:
        return
    why = "; it is stored under another geometry" if view.geometry.digest != previous.geometry.digest else ""
    raise FailedPrecondition(
        f"prefix_id: {view.prefix_id[:16]} does not extend turn {previous_turn}'s history {previous.prefix_id[:16]}: chunk {j} differs{why}"
    )


def marked_inactive(record: dict, view: PrefixView | None, fmt: str, strategy: dict, now: float) -> dict:
    """The record inactive, its compressed form ``view`` (None: none) replacing the one before."""
    compressed = None
    if view is not None:
        check_prefix(view, "compressed_prefix_id", record["namespace"], record["model_fingerprint"])
        last = record["turns"][-1]
        if view.num_tokens != last["num_tokens"]:
            raise InvalidArgument(
                "compressed_prefix_id",
                f"holds {view.num_tokens} tokens; the compressed form holds the last turn's {last['num_tokens']}",
            )
        compressed = {"prefix_id": view.prefix_id, "format": fmt, "strategy": strategy, "num_tokens": view.num_tokens}
        compressed["kv_bytes"] = view.kv_bytes
    return {**record, "state": INACTIVE, "compressed": compressed, "updated": now}


def prefix_ids(record: dict) -> list[str]:
    """The prefixes a record names, turns first, each once."""
    ids = [t["prefix_id"] for t in record["turns"]]
    if record.get("compressed"):
        ids.append(record["compressed"]["prefix_id"])
    return list(dict.fromkeys(ids))


def held_prefix_id(record: dict) -> str:
    """The prefix a record keeps from eviction: an inactive conversation's compressed form, else its last turn's."""
    if record["state"] == INACTIVE and record.get("compressed"):
        return record["compressed"]["prefix_id"]
    return record["turns"][-1]["prefix_id"]


def check_record(record: dict) -> bytes:
    """The key of a record read from a file; ValueError, KeyError or TypeError if it is not one."""
    key = check_key(record["namespace"], record["conversation_id"])
    if record["state"] not in (ACTIVE, INACTIVE) or not record["turns"]:
        raise ValueError("not a conversation record")
    for i, t in enumerate(record["turns"]):
        if t["turn"] != i or not isinstance(t["prefix_id"], str) or int(t["num_tokens"]) < 0:
            raise ValueError(f"turn {i} is malformed")
    if record["compressed"] is not None and not isinstance(record["compressed"]["prefix_id"], str):
        raise ValueError("compressed form is malformed")
    return key
