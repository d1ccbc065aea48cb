"""The client's routing call (``KVStoreClient.route``, ``AsyncKVStoreClient.route``): which node of a cluster should serve a request.

Any daemon with a remote tier answers it from the prefix directory the
nodes keep in the cluster (``kvstore.remote.router``): the node holding the
longest leading part of the request locally, or, when none holds any, the
least loaded one (which fills from the remote tier if that has it).  A
serving engine's router or a load balancer calls it per request with the
loads it already tracks and forwards the request to ``result.node_id``
(``result.address`` is what that node announced); docs/cluster.md.  The
request and the answer are ``kvstore.contract.routing``'s, for both clients.
"""

from __future__ import annotations

from kvstore.contract.geometry import StoreGeometry
from kvstore.contract.routing import RouteResult, route_from_pb, route_request

from .aio_rpc import acall
from .rpc import call


class RouteCalls:
    """Mixed into ``KVStoreClient`` (``self.stub``, ``self._kw``)."""

    def route(
        self,
        tokens,
        geometry: StoreGeometry,
        *,
        loads: dict[str, float] | None = None,
        namespace: str = "",
        model_fingerprint: str = "",
        max_load_gap: float = 0.0,
        timeout=None,
    ) -> RouteResult:
        """The node for ``tokens``; ``loads``: ``{node_id: load}`` of the candidates (lower is better; none: every
        node that announced itself, all equal).  FailedPrecondition when the daemon has no remote tier."""
        req = route_request(
            tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint, loads=loads, max_load_gap=max_load_gap
        )
        return route_from_pb(call(self.stub.Route, req, **self._kw(timeout)))


class AsyncRouteCalls:
    """Mixed into ``AsyncKVStoreClient`` (``self.stub``, ``self._kw``): ``RouteCalls`` as a coroutine."""

    async def route(
        self,
        tokens,
        geometry: StoreGeometry,
        *,
        loads: dict[str, float] | None = None,
        namespace: str = "",
        model_fingerprint: str = "",
        max_load_gap: float = 0.0,
        timeout=None,
    ) -> RouteResult:
        """As ``RouteCalls.route``."""
        req = route_request(
            tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint, loads=loads, max_load_gap=max_load_gap
        )
        return route_from_pb(await acall(self.stub.Route, req, **self._kw(timeout)))
