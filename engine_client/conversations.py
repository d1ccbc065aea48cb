"""The client's conversation calls (``KVStoreClient`` has them).

A conversation is a chain of turns: after each turn the worker stores the
history (every previous turn's tokens and KV) with ``put_prefix``, whose
leading chunks are the previous turn's and are not sent again, then
``append_turn`` records it.  ``mark_inactive`` names a compressed form the
worker stored (any geometry, e.g. quantized or with merged layers) and how
to restore it; ``delete_conversation`` drops the record and, if asked, the
prefixes no other conversation names.  Every call answers with a value of
``kvstore.contract`` (``ConversationInfo``, ``ConversationDeleted``); errors are
``KVStoreRpcError`` as for every call.
"""

from __future__ import annotations

import json

from kvstore.contract import ConversationDeleted, ConversationInfo, conversation_deleted_from_pb, conversation_from_pb, pb

from .rpc import call


class ConversationCalls:
    """Mixed into ``KVStoreClient`` (``self.stub``, ``self._kw``)."""

    def append_turn(self, conversation_id: str, turn: int, prefix_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        """Record ``turn`` (0 creates the conversation); retrying the last turn with the same prefix is a no-op."""
        req = pb.AppendTurnRequest(namespace=namespace, conversation_id=conversation_id, turn=turn, prefix_id=prefix_id)
        return conversation_from_pb(call(self.stub.AppendTurn, req, **self._kw(timeout)).conversation)

    def mark_inactive(
        self,
        conversation_id: str,
        *,
        compressed_prefix_id: str = "",
        format: str = "",
        strategy: dict | str | None = None,
        namespace: str = "",
        timeout=None,
    ) -> ConversationInfo:
        """Mark it inactive, with the compressed form stored as ``compressed_prefix_id`` ("" = none);
        ``format`` labels it (e.g. "kv8"), ``strategy`` (a dict or its JSON) says how to restore it."""
        strategy_json = strategy if isinstance(strategy, str) else ("" if strategy is None else json.dumps(strategy))
        req = pb.MarkInactiveRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            compressed_prefix_id=compressed_prefix_id,
            format=format,
            strategy_json=strategy_json,
        )
        return conversation_from_pb(call(self.stub.MarkInactive, req, **self._kw(timeout)).conversation)

    def get_conversation(self, conversation_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        req = pb.GetConversationRequest(namespace=namespace, conversation_id=conversation_id)
        return conversation_from_pb(call(self.stub.GetConversation, req, **self._kw(timeout)).conversation)

    def list_conversations(self, namespace: str = "", *, timeout=None) -> list[ConversationInfo]:
        """Every conversation of ``namespace`` ("" = every namespace this client may use), without per-turn detail."""
        res = call(self.stub.ListConversations, pb.ListConversationsRequest(namespace=namespace), **self._kw(timeout))
        return [conversation_from_pb(c) for c in res.conversations]

    def delete_conversation(
        self, conversation_id: str, *, delete_prefixes: bool = False, namespace: str = "", timeout=None
    ) -> ConversationDeleted:
        req = pb.DeleteConversationRequest(namespace=namespace, conversation_id=conversation_id, delete_prefixes=delete_prefixes)
        return conversation_deleted_from_pb(call(self.stub.DeleteConversation, req, **self._kw(timeout)))
