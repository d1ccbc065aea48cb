"""What the conversation calls answer, as plain values (no protobuf, no I/O).

Field names and order are the messages' own (``tests/unit/test_wire.py``);
``codec`` fills them.  A conversation is a chain of turns whose histories
are stored prefixes; see ``kvstore.conversations`` for the record and its
rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ConversationTurn:
    turn: int  # 0-based
    prefix_id: str  # full id of the turn's history prefix
    num_tokens: int
    created: float
    stored: bool  # the prefix is still stored (eviction or Delete may remove it)
    kv_bytes: int  # the prefix's KV at its geometry


@dataclass(frozen=True)
class CompressedForm:
    """The client's compressed form of an inactive conversation: a prefix under any geometry."""

    prefix_id: str
    format: str  # the client's label, e.g. "kv8", "krul-merge"
    strategy_json: str  # a JSON object: how to restore it
    num_tokens: int
    stored: bool
    kv_bytes: int

    @property
    def strategy(self) -> dict:
        return json.loads(self.strategy_json) if self.strategy_json else {}


@dataclass(frozen=True)
class ConversationInfo:
    """One conversation record, with which of its prefixes are stored and its bytes."""

    conversation_id: str
    namespace: str
    model_fingerprint: str
    state: str  # "active" | "inactive"
    num_turns: int
    num_tokens: int  # the last turn's
    turns: tuple[ConversationTurn, ...]  # empty in list_conversations
    compressed: CompressedForm | None
    created: float
    updated: float
    uncompressed_bytes: int  # the last turn's prefix KV
    compressed_bytes: int  # the compressed prefix's KV (0: none)
    stored_bytes: int  # segment bytes of the stored prefixes, each segment once
    missing_prefixes: int  # prefixes the record names that are no longer stored


@dataclass(frozen=True)
class PrefixKept:
    prefix_id: str
    reason: str


@dataclass(frozen=True)
class ConversationDeleted:
    conversation_id: str
    deleted_prefixes: tuple[str, ...]
    kept_prefixes: tuple[PrefixKept, ...]  # asked to delete, not deleted, and why
