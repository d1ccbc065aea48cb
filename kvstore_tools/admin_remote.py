"""``kvstore-admin remote`` and ``route``: the remote tier's state, and cache-aware routing.

``remote`` shows a daemon's remote tier: healthy or degraded (and why),
prefixes pending, replicated and failed, bytes moved each way, fills,
misses and checksum failures.  ``route`` asks which node should serve a
request: through a daemon (its ``Route`` call), or with ``--remote-url``
straight from the cluster's prefix directory (no daemon needed: what a
load balancer's sidecar does).  The request's geometry must be the one its
prefix was stored with (it is in every chunk hash): ``--geometry-json``
takes it as ``kvstore-admin inspect --json`` shows it, or the flags name
its parts.
"""

from __future__ import annotations

import argparse
import json

from kvstore.contract.errors import FailedPrecondition, InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore_tools.fmt import format_table, human_bytes

REMOTE_FIELDS = (
    "remote_state",
    "remote_node_id",
    "pending_prefixes",
    "replicated_prefixes",
    "failed_prefixes",
    "replicated_extents",
    "replicated_bytes",
    "replication_skipped_extents",
    "replication_retries",
    "fill_prefixes",
    "fill_chunks",
    "fill_bytes",
    "fill_pages",
    "remote_misses",
    "remote_checksum_failures",
    "fill_failures",
    "remote_degraded_events",
)


def add_parsers(sub, common) -> None:
    sub.add_parser("remote", parents=[common], help="the remote tier: state, replication pending/replicated/failed, fills")
    p = sub.add_parser("route", parents=[common], help="which node should serve a request (cache-aware routing)")
    p.add_argument("--tokens", help="the request's token ids, comma-separated")
    p.add_argument("--tokens-file", help="a file of token ids (a JSON list, or whitespace-separated)")
    p.add_argument(
        "--load", action="append", default=[], metavar="NODE=LOAD", help="a candidate node and its load (repeat; none: every node)"
    )
    p.add_argument("--max-load-gap", type=float, default=0.0, help="skip for locality a node more loaded than the least by more than this")
    p.add_argument("--remote-url", help="route from the cluster directly (redis-cluster://...), without a daemon")
    p.add_argument("--remote-password-file", default="", help="with --remote-url: the cluster's password")
    p.add_argument("--namespace", default="")
    p.add_argument("--model-fingerprint", default="")
    p.add_argument("--geometry-json", help='the stored geometry as JSON ({"model": {...}, "chunk_tokens": 16, ...})')
    p.add_argument("--layers", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument("--group-layers", type=int, default=8)
    p.add_argument("--probe-bits", type=int, default=0)
    p.add_argument("--no-probe-keys", dest="probe_keys", action="store_false")
    p.add_argument("--kv-quant", default="")


def cmd_remote(admin, args) -> tuple[object, str, int]:
    st = admin.stats()
    if not st.get("remote_state"):
        return {"remote_state": ""}, "no remote tier (remote_url is not set)", 0
    data = {k: st[k] for k in REMOTE_FIELDS}
    rows = [[k, human_bytes(v) if k.endswith("_bytes") else v] for k, v in data.items()]
    return data, format_table(None, rows), 0 if st["remote_state"] == "ok" else 1


def _geometry(args) -> StoreGeometry:
    if args.geometry_json:
        try:
            return StoreGeometry.from_dict(json.loads(args.geometry_json))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument("--geometry-json", str(exc)) from None
    if not (args.layers and args.kv_heads and args.head_dim):
        raise InvalidArgument("--layers", "route needs the geometry: --geometry-json, or --layers, --kv-heads and --head-dim")
    return StoreGeometry(
        ModelSpec(args.layers, args.kv_heads, args.head_dim, args.dtype),
        chunk_tokens=args.chunk_tokens,
        group_layers=args.group_layers,
        probe_keys=args.probe_keys,
        probe_bits=args.probe_bits,
        kv_quant=args.kv_quant,
    )


def _tokens(args) -> list[int]:
    if args.tokens_file:
        with open(args.tokens_file) as fh:
            text = fh.read()
        values = json.loads(text) if text.lstrip().startswith("[") else text.split()
    elif args.tokens:
        values = args.tokens.split(",")
    else:
        raise InvalidArgument("--tokens", "route needs the request's tokens (--tokens or --tokens-file)")
    try:
        return [int(v) for v in values]
    except ValueError as exc:
        raise InvalidArgument("--tokens", str(exc)) from None


def _loads(args) -> dict[str, float] | None:
    loads = {}
    for item in args.load:
        node, sep, value = item.partition("=")
        try:
            loads[node] = float(value)
        except ValueError:
            sep = ""
        if not sep or not node:
            raise InvalidArgument("--load", f"expected NODE=LOAD, got {item!r}")
    return loads or None


def _report(res: dict) -> tuple[object, str, int]:
    rows = [[n["node_id"], n["local_chunks"], n["load"], n["address"] or "-"] for n in res["nodes"]]
    text = format_table(["NODE", "LOCAL CHUNKS", "LOAD", "ADDRESS"], rows, right={1, 2})
    text += (
        f"\nroute to {res['node_id']} ({res['reason']}): {res['local_chunks']} of {res['num_chunks']} chunks local there, "
        f"{res['remote_chunks']} on the remote tier{', address ' + res['address'] if res['address'] else ''}"
    )
    return res, text, 0


def cmd_route(admin, args) -> tuple[object, str, int]:
    """Through the daemon's ``Route`` call."""
    client = getattr(admin, "client", None)
    if client is None:
        raise FailedPrecondition("route needs a daemon (--socket-path, --tcp-address) or the cluster (--remote-url)")
    r = client.route(
        _tokens(args),
        _geometry(args),
        loads=_loads(args),
        namespace=args.namespace,
        model_fingerprint=args.model_fingerprint,
        max_load_gap=args.max_load_gap,
    )
    nodes = [{"node_id": n.node_id, "local_chunks": n.local_chunks, "load": n.load, "address": n.address} for n in r.nodes]
    fields = ("node_id", "reason", "local_chunks", "remote_chunks", "num_chunks", "address")
    return _report({**{k: getattr(r, k) for k in fields}, "nodes": nodes})


def cmd_route_direct(args) -> tuple[object, str, int]:
    """From the cluster's prefix directory, with no daemon (``--remote-url``)."""
    from kvstore.remote import RemoteConfig, RemoteRefused, RemoteUnavailable, make_tier
    from kvstore.remote.router import Router

    tier = make_tier(RemoteConfig(remote_url=args.remote_url, remote_password_file=args.remote_password_file))
    try:
        tier.connect()
        route = Router(tier).route(
            _tokens(args),
            _geometry(args),
            namespace=args.namespace,
            model_fingerprint=args.model_fingerprint,
            loads=_loads(args),
            max_load_gap=args.max_load_gap,
        )
    except (RemoteRefused, RemoteUnavailable, ValueError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise FailedPrecondition(f"route: {exc}") from None
    finally:
        tier.close()
    c = route.choice
    nodes = [{"node_id": n.node_id, "local_chunks": n.local_chunks, "load": n.load, "address": n.address} for n in route.nodes]
    return _report(
        {
            "node_id": c.node_id,
            "reason": c.reason,
            "local_chunks": c.local_chunks,
            "remote_chunks": c.remote_chunks,
            "num_chunks": route.num_chunks,
            "address": route.address,
            "nodes": nodes,
        }
    )


def is_direct(args: argparse.Namespace) -> bool:
    return args.command == "route" and bool(getattr(args, "remote_url", None))
