"""What ``Route`` answers (``RouteResult``), and its request and reply read both ways (docs/cluster.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _proto as pb
from .codec import geometry_to_pb
from .geometry import StoreGeometry


@dataclass(frozen=True)
class NodeMatch:
    node_id: str
    local_chunks: int  # leading chunks of the request on its local tier
    load: float
    address: str  # its node_address, as announced ("" if none)


@dataclass(frozen=True)
class RouteResult:
    """The node to send a request to, and why: ``local`` (it holds the longest leading part), ``remote`` (no
    node does, the remote tier has it: the least loaded node fills it), ``least_loaded`` (nobody has it)."""

    node_id: str
    reason: str
    local_chunks: int
    remote_chunks: int
    num_chunks: int
    nodes: tuple[NodeMatch, ...]
    address: str


def route_request(
    tokens, geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, loads: dict[str, float] | None, max_load_gap: float
) -> pb.RouteRequest:
    return pb.RouteRequest(
        namespace=namespace,
        model_fingerprint=model_fingerprint,
        geometry=geometry_to_pb(geometry),
        tokens=np.asarray(tokens).astype(np.int64).ravel().tolist(),
        loads=[pb.NodeLoad(node_id=n, load=float(v)) for n, v in (loads or {}).items()],
        max_load_gap=max_load_gap,
    )


def route_from_pb(msg: pb.RouteResponse) -> RouteResult:
    return RouteResult(
        node_id=msg.node_id,
        reason=msg.reason,
        local_chunks=msg.local_chunks,
        remote_chunks=msg.remote_chunks,
        num_chunks=msg.num_chunks,
        nodes=tuple(NodeMatch(n.node_id, n.local_chunks, n.load, n.address) for n in msg.nodes),
        address=msg.address,
    )
