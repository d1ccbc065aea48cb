"""Cache-aware routing (pure): which node should serve a request, from what each holds locally and its load.

The node with the longest local match of the request's leading chunks
serves it (its KV is read from its own NVMe: no recompute, no network);
ties go to the less loaded node, then to the smaller node id.  A node more
loaded than the least loaded one by more than ``max_load_gap`` is not
chosen for locality (0: no limit), so a hot prefix cannot pin all of its
traffic on one overloaded node.  When no eligible node holds any of it, the
least loaded node serves it, from the remote tier if that holds the prefix
(``remote``), else by computing it (``least_loaded``).
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL, REMOTE, LEAST_LOADED = "local", "remote", "least_loaded"


@dataclass(frozen=True)
class RouteChoice:
    node_id: str
    reason: str  # LOCAL, REMOTE or LEAST_LOADED
    local_chunks: int  # leading chunks the chosen node holds locally
    remote_chunks: int  # leading chunks the remote tier holds


def leading_run(holders: list[frozenset[str]], node_id: str) -> int:
    """Leading chunks ``node_id`` holds: the first ``j`` with ``node_id`` in every ``holders[:j]``."""
    for j, nodes in enumerate(holders):
        if node_id not in nodes:
            return j
    return len(holders)


def choose_node(local_chunks: dict[str, int], loads: dict[str, float], remote_chunks: int, *, max_load_gap: float = 0.0) -> RouteChoice:
    """The node for a request (``loads``: the candidates, lower is better); ValueError without candidates."""
    if not loads:
        raise ValueError("no candidate nodes")
    least = min(loads.values())
    eligible = [n for n in loads if max_load_gap <= 0 or loads[n] - least <= max_load_gap]
    best = min(eligible, key=lambda n: (-local_chunks.get(n, 0), loads[n], n))
    if local_chunks.get(best, 0) > 0:
        return RouteChoice(best, LOCAL, local_chunks[best], remote_chunks)
    idle = min(loads, key=lambda n: (loads[n], n))
    return RouteChoice(idle, REMOTE if remote_chunks > 0 else LEAST_LOADED, local_chunks.get(idle, 0), remote_chunks)
