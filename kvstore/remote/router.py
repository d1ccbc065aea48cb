"""``Router``: cache-aware routing over the prefix directory the nodes keep in the remote tier.

Every node publishes the chunk hashes of the prefixes on its local tier
(``store/replication.py``: added on put and fill, removed on delete and
eviction) and announces itself (``server/remote.py``: node id and
``node_address``, with a time to live).  Given a request's tokens, the
router computes the chunk hashes (the same chain the store uses), reads
which nodes hold each, and lets ``policy.routing.choose_node`` pick.  Any
daemon answers ``Route`` with it; a load balancer can also import it and
ask the cluster directly (docs/cluster.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.geometry import StoreGeometry
from ..hashing import chunk_hashes, validate_tokens
from ..policy.routing import RouteChoice, choose_node, leading_run
from .base import RemoteTier
from .records import is_hash_hex


@dataclass(frozen=True)
class NodeRoute:
    node_id: str
    local_chunks: int
    load: float
    address: str


@dataclass(frozen=True)
class Route:
    choice: RouteChoice
    num_chunks: int
    nodes: tuple[NodeRoute, ...]
    address: str  # the chosen node's


class Router:
    def __init__(self, tier: RemoteTier, *, max_tokens: int = 1 << 20):
        self._tier = tier
        self._max_tokens = max_tokens

    def route(
        self,
        tokens,
        geometry: StoreGeometry,
        *,
        namespace: str = "",
        model_fingerprint: str = "",
        loads: dict[str, float] | None = None,
        max_load_gap: float = 0.0,
    ) -> Route:
        """The node for a request; ``loads``: the candidates (default: every announced node, load 0). RemoteUnavailable propagates."""
        arr = validate_tokens(tokens, self._max_tokens)
        names = [h.hex() for h in chunk_hashes(arr, geometry, namespace, model_fingerprint)]
        announced = self._tier.nodes()
        loads = dict(loads) if loads else dict.fromkeys(announced, 0.0)
        holders = self._tier.directory(names)
        local = {n: leading_run(holders, n) for n in loads}
        choice = choose_node(local, loads, self._remote_chunks(names), max_load_gap=max_load_gap)
        nodes = tuple(NodeRoute(n, local[n], loads[n], announced.get(n, "")) for n in sorted(loads))
        return Route(choice, len(names), nodes, announced.get(choice.node_id, ""))

    def _remote_chunks(self, names: list[str]) -> int:
        """Leading chunks the remote tier's chunk index knows (bisection: a manifest holding chunk j holds those before)."""
        lo, hi = 0, len(names)
        while lo < hi:
            mid = (lo + hi) // 2
            holder = self._tier.holders([names[mid]])[0]
            if holder is not None and is_hash_hex(holder):
                lo = mid + 1
            else:
                hi = mid
        return lo
