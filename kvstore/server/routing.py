"""The ``Route`` call: cache-aware routing answered from the prefix directory (``kvstore.remote.router``)."""

from __future__ import annotations

from ..contract import geometry_from_pb, pb, tokens_from_pb
from ..contract.errors import FailedPrecondition, InvalidArgument
from ..remote.base import RemoteUnavailable
from .auth import check_namespace
from .status import unary


class RouteRpcs:
    """Mixed into ``KVStoreServicer`` (``self.svc``: the ``Service``, whose ``router`` is set with a remote tier)."""

    @unary
    async def Route(self, request, context):
        svc = self.svc
        check_namespace(context, request.namespace)
        router = svc.router
        if router is None:
            raise FailedPrecondition("Route needs a remote tier (remote_url): this daemon is on its own")
        loads = {}
        for i, nl in enumerate(request.loads):
            if not nl.node_id or nl.node_id in loads:
                raise InvalidArgument(f"loads[{i}].node_id", "must be set and unique")
            loads[nl.node_id] = nl.load
        try:
            route = await svc.run(
                router.route,
                tokens_from_pb(request.tokens),
                geometry_from_pb(request.geometry),
                namespace=request.namespace,
                model_fingerprint=request.model_fingerprint,
                loads=loads or None,
                max_load_gap=request.max_load_gap,
            )
        except InvalidArgument:
            raise
        except RemoteUnavailable as exc:
            raise FailedPrecondition(f"the remote tier cannot be reached: {exc}") from None
        except ValueError as exc:  # no candidate nodes
            raise FailedPrecondition(f"no node to route to ({exc}): pass loads, or start nodes with a remote tier") from None
        c = route.choice
        return pb.RouteResponse(
            node_id=c.node_id,
            reason=c.reason,
            local_chunks=c.local_chunks,
            remote_chunks=c.remote_chunks,
            num_chunks=route.num_chunks,
            nodes=[pb.NodeMatch(node_id=n.node_id, local_chunks=n.local_chunks, load=n.load, address=n.address) for n in route.nodes],
            address=route.address,
        )
