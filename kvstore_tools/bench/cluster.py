"""``kvstore-bench cluster``: N daemons on one machine, shared prefixes under a Zipf workload, with and without the remote tier and routing.

Each node is a daemon of its own (data directory, socket, node id); with the
remote tier they share one Redis Cluster (``--remote-url``, or a local one of
3 masters and 3 replicas started here, ``kvstore_tools.local_cluster``).  The
workload: ``--prefixes`` shared prefixes (system prompts, documents) of
``--tokens`` tokens; each of ``--requests`` requests takes prefix ``i`` with
probability proportional to ``1 / (i + 1) ** zipf`` plus a fresh suffix, and
goes to a node: round robin, or where ``Route`` says (loads: requests served
so far, ``--max-load-gap``).  On its node a request looks its tokens up: a
**local** hit (the prefix is on the node's NVMe), a **remote** hit (filled
from the cluster by the look-up), or a **miss**, which the request pays by
recomputing the prefix (modelled at ``--recompute-tokens-per-s``) and storing
it (``put_prefix``).  Then it reads every chunk of the prefix (shared memory).

Modes: ``isolated`` (no remote tier, round robin: today's islands),
``remote`` (remote tier, round robin), ``routed`` (remote tier and routing).
Routing reads the prefix directory, which lives in the cluster, so there is
no routing without it.  The report: hit rates by tier, repeated prefixes
served locally, bytes moved (client reads, fills from the cluster,
replication to it), and the time to serve one chunk from each tier next to
recomputing it: ``local`` is a ReadChunks of a prefix on the node's NVMe,
``cross-node`` a look-up that fills it from the cluster plus that read
(the JSON has the two apart: the fill's local write runs behind the read).
Targets (docs/cluster.md): cross-node at most 2x local; with routing, at
least 90% of repeated prefixes served from a local tier.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import numpy as np

from kvstore.contract.geometry import ModelSpec, StoreGeometry

from .io_jobs import BenchError

GEOMETRY = StoreGeometry(ModelSpec(24, 2, 64, "bfloat16"), chunk_tokens=16, group_layers=8)  # Qwen2.5-0.5B's KV shape
MODES = ("isolated", "remote", "routed")


def add_cluster_parser(sub) -> None:
    p = sub.add_parser(
        "cluster", help="N daemons sharing a Redis Cluster: hit rates by tier, bytes moved, cross-node vs local vs recompute"
    )
    p.add_argument("--nodes", type=int, default=3, help="daemons (each its own data directory, socket and node id)")
    p.add_argument("--prefixes", type=int, default=12, help="shared prefixes")
    p.add_argument("--tokens", type=int, default=1024, help="tokens of each prefix")
    p.add_argument("--suffix-tokens", type=int, default=32, help="fresh tokens after the prefix in each request (never stored)")
    p.add_argument("--requests", type=int, default=120, help="requests per mode")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the prefixes' popularity")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument(
        "--max-load-gap", type=float, default=8.0, help="routing: a node this many requests busier than the idlest loses locality"
    )
    p.add_argument("--recompute-tokens-per-s", type=float, default=20000.0, help="prefill rate a miss is charged at (modelled)")
    p.add_argument("--remote-url", default="", help="an existing cluster (default: start 3 masters + 3 replicas on loopback)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(run=command_cluster)


def command_cluster(args) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise BenchError(f"--modes: expected some of {', '.join(MODES)}, got {args.modes!r}")
    if args.nodes < 1 or args.prefixes < 1 or args.requests < 1 or args.tokens < GEOMETRY.chunk_tokens:
        raise BenchError("--nodes, --prefixes and --requests must be positive and --tokens at least one chunk")
    report = run_cluster(args, modes)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_cluster(report))
    return 0


def _workload(args):
    from kvstore_tools.synthetic import synthetic_kv

    rng = np.random.default_rng(args.seed)
    m = GEOMETRY.model
    prefixes = [rng.integers(0, 50_000, args.tokens) for _ in range(args.prefixes)]
    kvs = [synthetic_kv(rng, (m.num_layers, 2, m.num_kv_heads, args.tokens, m.head_dim), m.dtype) for _ in range(args.prefixes)]
    weights = 1.0 / np.arange(1, args.prefixes + 1) ** args.zipf
    order = rng.choice(args.prefixes, size=args.requests, p=weights / weights.sum())
    suffixes = [rng.integers(50_000, 60_000, args.suffix_tokens) for _ in range(args.requests)]
    return prefixes, kvs, order.tolist(), suffixes


def run_cluster(args, modes: list[str]) -> dict:
    import os

    from .machine import machine_info

    os.makedirs(args.directory, exist_ok=True)
    prefixes, kvs, order, suffixes = _workload(args)
    report = {
        "machine": machine_info(args.directory),
        "config": {
            k: getattr(args, k) for k in ("nodes", "prefixes", "tokens", "suffix_tokens", "requests", "zipf", "max_load_gap", "seed")
        },
        "recompute_tokens_per_s": args.recompute_tokens_per_s,
        "chunk_bytes": sum(GEOMETRY.extent_bytes(g, GEOMETRY.chunk_tokens) for g in range(GEOMETRY.num_groups)),
        "modes": {},
    }
    with ExitStack() as stack:
        url = args.remote_url
        if not url and set(modes) - {"isolated"}:
            from kvstore_tools.local_cluster import LocalRedisCluster, available

            if not available():
                raise BenchError("no redis-server here (make redis), and no --remote-url given")
            cluster = LocalRedisCluster()
            stack.callback(cluster.close)
            url = cluster.url
        for mode in modes:
            report["modes"][mode] = _run_mode(args, mode, url, prefixes, kvs, order, suffixes)
    tiers = report["modes"].get("remote") or report["modes"].get("routed")  # remote: round robin, the most cross-node hits
    if tiers and tiers["chunk_ms"]["local"]:
        ms = tiers["chunk_ms"]
        report["cross_node_over_local"] = ms["cross_node"] / ms["local"] if ms["cross_node"] else None
        report["fetch_over_local"] = ms["remote_fetch"] / ms["local"] if ms["remote_fetch"] else None
    return report


def _start_nodes(args, mode: str, url: str, stack: ExitStack) -> list:
    from .daemon_io import private_daemon_client

    clients = []
    for i in range(args.nodes):
        extra = ["--node-id", f"n{i}", "--remote-health-seconds", "0.5"]
        if mode != "isolated":
            extra += ["--remote-url", url]
        clients.append(private_daemon_client(args.directory, f"cluster-{mode}-n{i}-", stack, extra=extra))
    return clients


def _settle(clients, timeout_s: float = 60.0) -> None:
    """Until every node's replication queue is empty (write-back has caught up)."""
    deadline = time.monotonic() + timeout_s
    while any(c.stats().pending_prefixes for c in clients):
        if time.monotonic() > deadline:
            raise BenchError("replication did not catch up within 60 s")
        time.sleep(0.05)


def _run_mode(args, mode: str, url: str, prefixes, kvs, order, suffixes) -> dict:
    chunks = GEOMETRY.num_chunks(args.tokens)
    served = {"local": 0, "remote": 0, "miss": 0}
    repeated = repeated_local = 0
    seen: set[int] = set()
    times = {"local": [], "cross_node": [], "miss_read": [], "cross_node_lookup": [], "cross_node_read": []}
    recompute_ms = 0.0
    namespace = f"bench-{mode}-{time.time_ns()}"  # every mode starts from an empty cluster (the namespace is in every key)
    with ExitStack() as stack:
        clients = _start_nodes(args, mode, url, stack)
        loads = {f"n{i}": 0.0 for i in range(args.nodes)}
        for r, p in enumerate(order):
            tokens = np.concatenate([prefixes[p], suffixes[r]])
            if mode == "routed":
                route = clients[0].route(tokens, GEOMETRY, loads=loads, max_load_gap=args.max_load_gap, namespace=namespace)
                node = int(route.node_id[1:])
            else:
                node = r % args.nodes
            loads[f"n{node}"] += 1
            client = clients[node]
            before = client.stats().fill_chunks if mode != "isolated" else 0
            t0 = time.perf_counter()
            hit = client.lookup(tokens, GEOMETRY, namespace=namespace)
            lookup_s = time.perf_counter() - t0
            filled = (client.stats().fill_chunks - before) if mode != "isolated" else 0
            if hit.matched_chunks < chunks:  # a miss: the engine recomputes the prefix and stores it
                kind = "miss"
                recompute_ms += 1e3 * args.tokens / args.recompute_tokens_per_s
                pid = client.put_prefix(prefixes[p], kvs[p], GEOMETRY, namespace=namespace).prefix_id
            else:
                kind = "remote" if filled else "local"
                pid = hit.prefix_id
            t0 = time.perf_counter()
            with client.read_chunks(pid, list(range(chunks))) as got:
                if got.bytes_useful != kvs[p].nbytes:
                    raise BenchError(f"request {r}: read {got.bytes_useful} bytes of {kvs[p].nbytes}")
            read_s = time.perf_counter() - t0
            served[kind] += 1
            if p in seen:
                repeated += 1
                repeated_local += kind == "local"
            seen.add(p)
            if kind == "local":
                times["local"].append(1e3 * read_s / chunks)
            elif kind == "remote":
                times["cross_node"].append(1e3 * (lookup_s + read_s) / chunks)
                times["cross_node_lookup"].append(1e3 * lookup_s / chunks)  # the fetch into the image and its checks
                times["cross_node_read"].append(1e3 * read_s / chunks)  # served from memory while the write runs behind
            if mode != "isolated":
                _settle([client])  # write-back done before the next request: a fair count of what the cluster holds
        stats = [c.stats() for c in clients]
    fetch_ms = _fetch_ms(url, prefixes, namespace) if mode != "isolated" else None
    n = len(order)
    median = {k: float(np.median(v)) if v else None for k, v in times.items()}
    return {
        "hit_rate": {k: v / n for k, v in served.items()},
        "served": served,
        "repeated_requests": repeated,
        "repeated_served_locally": repeated_local / repeated if repeated else None,
        "bytes": {
            "read_by_clients": int(sum(s.bytes_read for s in stats)),
            "filled_from_remote": int(sum(s.fill_bytes for s in stats)),
            "replicated_to_remote": int(sum(s.replicated_bytes for s in stats)),
            "written_locally": int(sum(s.bytes_written for s in stats)),
        },
        "chunk_ms": {
            "local": median["local"],
            "cross_node": median["cross_node"],
            "remote_fetch": fetch_ms,
            "recompute": 1e3 * GEOMETRY.chunk_tokens / args.recompute_tokens_per_s,
            "cross_node_lookup": median["cross_node_lookup"],
            "cross_node_read": median["cross_node_read"],
        },
        "recompute_ms_total": recompute_ms,
        "requests_per_node": {k: int(v) for k, v in loads.items()},
    }


def _fetch_ms(url: str, prefixes, namespace: str, repeats: int = 3) -> float | None:
    """Per chunk, the remote tier's own read of a whole prefix: manifest, every extent (16 MiB batches), every check."""
    from kvstore.hashing import chunk_hashes
    from kvstore.remote import RemoteConfig, make_tier
    from kvstore.remote.records import decode_extent, decode_manifest

    tier = make_tier(RemoteConfig(remote_url=url))
    try:
        tier.connect()
        pid = chunk_hashes(np.asarray(prefixes[0], dtype="<u4"), GEOMETRY, namespace, "")[-1].hex()
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            blob = tier.get_manifest(pid)
            if blob is None:
                return None
            m = decode_manifest(blob, pid)
            per_batch = max(1, (16 << 20) // sum(m.extent_length(0, g) for g in range(GEOMETRY.num_groups)))
            for start in range(0, m.num_chunks, per_batch):
                want = [(j, g) for j in range(start, min(start + per_batch, m.num_chunks)) for g in range(GEOMETRY.num_groups)]
                for (j, g), value in zip(want, tier.get_extents([m.extent_key(j, g) for j, g in want])):
                    decode_extent(value, length=m.extent_length(j, g), xxh3=int(m.extent_xxh3[j, g]))
            ms = 1e3 * (time.perf_counter() - t0) / m.num_chunks
            best = ms if best is None else min(best, ms)
        return best
    finally:
        tier.close()


def format_cluster(report: dict) -> str:
    from kvstore_tools.fmt import format_table, human_bytes

    cfg = report["config"]
    lines = [
        f"{cfg['nodes']} nodes, {cfg['prefixes']} prefixes of {cfg['tokens']} tokens (Zipf {cfg['zipf']}), {cfg['requests']} requests "
        f"per mode; chunk {human_bytes(report['chunk_bytes'])}; a miss recomputes at {report['recompute_tokens_per_s']:.0f} tokens/s (modelled)",
    ]
    rows = []
    for mode, m in report["modes"].items():
        ms = m["chunk_ms"]
        rows.append(
            [
                mode,
                f"{100 * m['hit_rate']['local']:.0f}%",
                f"{100 * m['hit_rate']['remote']:.0f}%",
                f"{100 * m['hit_rate']['miss']:.0f}%",
                "-" if m["repeated_served_locally"] is None else f"{100 * m['repeated_served_locally']:.0f}%",
                human_bytes(m["bytes"]["filled_from_remote"]),
                human_bytes(m["bytes"]["replicated_to_remote"]),
                human_bytes(m["bytes"]["written_locally"]),
                "-" if ms["local"] is None else f"{ms['local']:.3f}",
                "-" if ms["cross_node"] is None else f"{ms['cross_node']:.3f}",
                "-" if ms["remote_fetch"] is None else f"{ms['remote_fetch']:.3f}",
                f"{ms['recompute']:.3f}",
            ]
        )
    headers = ["MODE", "LOCAL", "REMOTE", "MISS", "REPEATS LOCAL", "FILLED", "REPLICATED", "WRITTEN"]
    headers += ["LOCAL MS/CHUNK", "X-NODE MS/CHUNK", "FETCH MS/CHUNK", "RECOMPUTE"]
    lines.append(format_table(headers, rows, right=set(range(1, 12))))
    lines.append(
        "LOCAL: a ReadChunks of a prefix on the node's NVMe; X-NODE: a look-up that fills it from the cluster (fetched into "
        "memory and checked; its local write runs behind), then that read; FETCH: the cluster's read of the same bytes with every check; "
        "RECOMPUTE: modelled"
    )
    ratio, fetch = report.get("cross_node_over_local"), report.get("fetch_over_local")
    if ratio and fetch:
        lines.append(
            f"cross-node hit as served / local NVMe read: {ratio:.2f}x; remote fetch / local NVMe read: {fetch:.2f}x (target <= 2x)"
        )
    return "\n".join(lines)
