"""The client's conversation calls (``KVStoreClient`` has them, ``AsyncKVStoreClient`` as coroutines).

A conversation is a chain of turns: after each turn the worker stores the
history (every previous turn's tokens and KV) with ``put_prefix``, whose
leading chunks are the previous turn's and are not sent again, then
``append_turn`` records it.  ``mark_inactive`` names a compressed form the
worker stored (any geometry, e.g. quantized or with merged layers) and how
to restore it; ``delete_conversation`` drops the record and, if asked, the
prefixes no other conversation names.  Every call answers with a value of
``kvstore.contract`` (``ConversationInfo``, ``ConversationDeleted``); errors are
``KVStoreRpcError`` as for every call.

Each call is built once, as a ``ConversationCall`` (the RPC's name, its
request, how its answer is read), by the functions below; ``ConversationCalls``
sends it with ``rpc.call``, ``AsyncConversationCalls`` with ``aio_rpc.acall``
(the same retries and deadline).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

from kvstore.contract import ConversationDeleted, ConversationInfo, conversation_deleted_from_pb, conversation_from_pb, pb

from .aio_rpc import acall
from .rpc import call


class ConversationCall(NamedTuple):
    """One conversation RPC: the stub method's name, its request, and what its response becomes."""

    rpc: str
    request: object
    decode: Callable


def _info(res) -> ConversationInfo:
    return conversation_from_pb(res.conversation)


def _listed(res) -> list[ConversationInfo]:
    return [conversation_from_pb(c) for c in res.conversations]


def append_turn_call(conversation_id: str, turn: int, prefix_id: str, namespace: str) -> ConversationCall:
    req = pb.AppendTurnRequest(namespace=namespace, conversation_id=conversation_id, turn=turn, prefix_id=prefix_id)
    return ConversationCall("AppendTurn", req, _info)


def mark_inactive_call(
    conversation_id: str, compressed_prefix_id: str, format: str, strategy: dict | str | None, namespace: str
) -> ConversationCall:
    strategy_json = strategy if isinstance(strategy, str) else ("" if strategy is None else json.dumps(strategy))
    req = pb.MarkInactiveRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        compressed_prefix_id=compressed_prefix_id,
        format=format,
        strategy_json=strategy_json,
    )
    return ConversationCall("MarkInactive", req, _info)


def get_conversation_call(conversation_id: str, namespace: str) -> ConversationCall:
    return ConversationCall("GetConversation", pb.GetConversationRequest(namespace=namespace, conversation_id=conversation_id), _info)


def list_conversations_call(namespace: str) -> ConversationCall:
    return ConversationCall("ListConversations", pb.ListConversationsRequest(namespace=namespace), _listed)


def delete_conversation_call(conversation_id: str, delete_prefixes: bool, namespace: str) -> ConversationCall:
    req = pb.DeleteConversationRequest(namespace=namespace, conversation_id=conversation_id, delete_prefixes=delete_prefixes)
    return ConversationCall("DeleteConversation", req, conversation_deleted_from_pb)


class ConversationCalls:
    """Mixed into ``KVStoreClient`` (``self.stub``, ``self._kw``)."""

    def _conversation(self, c: ConversationCall, timeout):
        return c.decode(call(getattr(self.stub, c.rpc), c.request, **self._kw(timeout)))

    def append_turn(self, conversation_id: str, turn: int, prefix_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        """Record ``turn`` (0 creates the conversation); retrying the last turn with the same prefix is a no-op."""
        return self._conversation(append_turn_call(conversation_id, turn, prefix_id, namespace), timeout)

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
        return self._conversation(mark_inactive_call(conversation_id, compressed_prefix_id, format, strategy, namespace), timeout)

    def get_conversation(self, conversation_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        return self._conversation(get_conversation_call(conversation_id, namespace), timeout)

    def list_conversations(self, namespace: str = "", *, timeout=None) -> list[ConversationInfo]:
        """Every conversation of ``namespace`` ("" = every namespace this client may use), without per-turn detail."""
        return self._conversation(list_conversations_call(namespace), timeout)

    def delete_conversation(
        self, conversation_id: str, *, delete_prefixes: bool = False, namespace: str = "", timeout=None
    ) -> ConversationDeleted:
        return self._conversation(delete_conversation_call(conversation_id, delete_prefixes, namespace), timeout)


class AsyncConversationCalls:
    """Mixed into ``AsyncKVStoreClient`` (``self.stub``, ``self._kw``): ``ConversationCalls`` as coroutines."""

    async def _conversation(self, c: ConversationCall, timeout):
        return c.decode(await acall(getattr(self.stub, c.rpc), c.request, **self._kw(timeout)))

    async def append_turn(self, conversation_id: str, turn: int, prefix_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        """As ``ConversationCalls.append_turn``."""
        return await self._conversation(append_turn_call(conversation_id, turn, prefix_id, namespace), timeout)

    async def mark_inactive(
        self,
        conversation_id: str,
        *,
        compressed_prefix_id: str = "",
        format: str = "",
        strategy: dict | str | None = None,
        namespace: str = "",
        timeout=None,
    ) -> ConversationInfo:
        """As ``ConversationCalls.mark_inactive``."""
        return await self._conversation(mark_inactive_call(conversation_id, compressed_prefix_id, format, strategy, namespace), timeout)

    async def get_conversation(self, conversation_id: str, *, namespace: str = "", timeout=None) -> ConversationInfo:
        return await self._conversation(get_conversation_call(conversation_id, namespace), timeout)

    async def list_conversations(self, namespace: str = "", *, timeout=None) -> list[ConversationInfo]:
        """As ``ConversationCalls.list_conversations``."""
        return await self._conversation(list_conversations_call(namespace), timeout)

    async def delete_conversation(
        self, conversation_id: str, *, delete_prefixes: bool = False, namespace: str = "", timeout=None
    ) -> ConversationDeleted:
        return await self._conversation(delete_conversation_call(conversation_id, delete_prefixes, namespace), timeout)
