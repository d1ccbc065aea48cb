"""The conversation RPCs of the KVStore service: thin handlers over ``kvstore.conversations``.

Namespaces are an access boundary as for prefixes: a call naming a
namespace its token may not use is PERMISSION_DENIED (as ``PutPrefix`` and
``Lookup``), a prefix of such a namespace is NOT_FOUND (as ``Describe``),
and ``ListConversations`` shows only the namespaces the token may use (as
``ListPrefixes``).
"""

from __future__ import annotations

from ..contract import pb
from .auth import check_namespace, namespaces_of
from .status import unary


def info_to_pb(info: dict) -> pb.ConversationInfo:
    """``Conversations.info``'s dict as the message."""
    fields = {k: v for k, v in info.items() if k not in ("turns", "compressed")}
    msg = pb.ConversationInfo(**fields, turns=[pb.ConversationTurn(**t) for t in info["turns"]])
    if info["compressed"] is not None:
        msg.compressed.CopyFrom(pb.CompressedForm(**info["compressed"]))
    return msg


class ConversationRpcs:
    """Mixed into ``KVStoreServicer`` (``self.svc``, ``self.metrics``, ``self.admitted``)."""

    @unary
    async def AppendTurn(self, request, context):
        svc = self.svc
        check_namespace(context, request.namespace)
        conv = svc.store.conversations
        record = await svc.run(
            conv.append_turn,
            request.namespace,
            request.conversation_id,
            request.turn,
            request.prefix_id,
            resolve=lambda pid: svc.reach(pid, context),
        )
        return pb.AppendTurnResponse(conversation=info_to_pb(await svc.run(conv.info, record)))

    @unary
    async def MarkInactive(self, request, context):
        svc = self.svc
        check_namespace(context, request.namespace)
        conv = svc.store.conversations
        record = await svc.run(
            conv.mark_inactive,
            request.namespace,
            request.conversation_id,
            request.compressed_prefix_id,
            request.format,
            request.strategy_json,
            resolve=lambda pid: svc.reach(pid, context),
        )
        return pb.MarkInactiveResponse(conversation=info_to_pb(await svc.run(conv.info, record)))

    @unary
    async def GetConversation(self, request, context):
        check_namespace(context, request.namespace)
        conv = self.svc.store.conversations
        record = await self.svc.run(conv.get, request.namespace, request.conversation_id)
        return pb.GetConversationResponse(conversation=info_to_pb(await self.svc.run(conv.info, record)))

    @unary
    async def ListConversations(self, request, context):
        conv = self.svc.store.conversations
        allowed = namespaces_of(context)

        def infos() -> list[dict]:
            records = conv.records(request.namespace or None)
            return [conv.info(r, turns=False) for r in records if allowed is None or r["namespace"] in allowed]

        return pb.ListConversationsResponse(conversations=[info_to_pb(i) for i in await self.svc.run(infos)])

    @unary
    async def DeleteConversation(self, request, context):
        check_namespace(context, request.namespace)
        res = await self.svc.run(
            self.svc.store.conversations.delete,
            request.namespace,
            request.conversation_id,
            delete_prefixes=request.delete_prefixes,
        )
        return pb.DeleteConversationResponse(
            conversation_id=res["conversation_id"],
            deleted_prefixes=res["deleted_prefixes"],
            kept_prefixes=[pb.PrefixKept(prefix_id=p, reason=why) for p, why in res["kept_prefixes"]],
        )
