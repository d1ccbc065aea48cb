"""``kvstore-admin``: inspect and maintain a kvstore, through its daemon or offline.

With ``--socket-path`` or ``--tcp-address`` the commands go to a running daemon
(``inspect``, ``verify``, ``evict`` and ``compact`` need its admin RPCs
enabled).  Without either, and without ``--data-dir``, the daemon is found at
``$KVSTORE_SOCKET``, ``$KVSTORE_SOCKET_PATH``, then ``/run/kvstore/kvstore.sock``, then this
directory's ``.kvstore/run/kvstore.sock``; failing those, the default data
directory is opened offline, and the error says where it looked.  With ``--data-dir`` they open the
data directory directly, which only works while no daemon holds it (the
store takes an exclusive lock); opening it runs the startup scan, which
removes orphaned segment files left by an interrupted put (only when the
index opened cleanly and is this store's; a missing or damaged index is
refused with one line).  ``rebuild-index`` (``--data-dir`` only, daemon
stopped) moves a damaged index aside and rebuilds it from the segments'
trailers, the manifest files and the conversation record files.
``conversations`` and ``conversation ID`` show conversation records.  Human tables by default, ``--json`` for
scripts.  Exit status: 0 ok, 1 on an error or when
``verify`` finds a bad or quarantined segment.  Where the operations run,
a data directory opened here or a daemon, is ``kvstore_tools.admin_targets``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from kvstore import cli_flags
from kvstore.config import HelpFormatter, StoreConfig, parse_bytes, parse_host_port
from kvstore.contract.errors import InvalidArgument, KVStoreError
from kvstore.progress import add_progress_flag, progress, set_enabled
from kvstore.rebuild import rebuild_index
from kvstore_tools.admin_conversations import cmd_conversation, cmd_conversations
from kvstore_tools.admin_remote import add_parsers as add_remote_parsers
from kvstore_tools.admin_remote import cmd_remote, cmd_route, cmd_route_direct, is_direct
from kvstore_tools.admin_targets import connect
from kvstore_tools.fmt import format_table, human_bytes
from kvstore_tools.fmt import when as _when

SHORT_ID_CHARS = 16


def _probe_form(geo: dict) -> str:
    """How the prefix stores its probe keys: off, on (the KV dtype) or quantized (``probe_bits``)."""
    if not geo["probe_keys"]:
        return "off"
    return f"{geo['probe_bits']}-bit" if geo.get("probe_bits") else "on"


def _status(quarantined: str | None) -> str:
    return "ok" if not quarantined else f"QUARANTINED: {quarantined}"


# ------------------------------------------------------------ commands
def page_objects(entries: list[dict]) -> list[dict]:
    """Prefixes as they are, and the page batches of one namespace and model as ONE object: each PutPages
    stores its new pages as a batch of its own, but what an engine stored is the pages of its model."""
    out, pages = [], {}
    for p in sorted(entries, key=lambda p: p["created"]):
        if (p.get("kind") or "prefix") != "pages":
            out.append(p)
            continue
        key = (p["namespace"], p["model_fingerprint"])
        obj = pages.get(key)
        if obj is None:
            obj = pages[key] = {
                "kind": "pages",
                "namespace": p["namespace"],
                "model_fingerprint": p["model_fingerprint"],
                "num_pages": 0,
                "num_tokens": 0,
                "num_segments": 0,
                "num_batches": 0,
                "quarantined_batches": 0,
                "created": p["created"],
                "updated": p["created"],
                "batches": [],
            }
            out.append(obj)
        obj["num_pages"] += p["num_chunks"]
        obj["num_tokens"] += p["num_tokens"]
        obj["num_segments"] += p["num_segments"]
        obj["num_batches"] += 1
        obj["quarantined_batches"] += bool(p["quarantined"])
        obj["updated"] = max(obj["updated"], p["created"])
        obj["batches"].append(p["prefix_id"])
    return out


def cmd_ls(admin, args) -> tuple[object, str, int]:
    entries = sorted(admin.list_prefixes(), key=lambda p: p["created"])
    items = entries if getattr(args, "batches", False) else page_objects(entries)
    rows = []
    for p in items:
        if "batches" in p:  # the pages of one namespace and model
            n, bad = p["num_batches"], p["quarantined_batches"]
            ident = f"({n} batch{'es' if n != 1 else ''})"
            rows.append([ident, "pages", p["num_tokens"], p["num_pages"], p["num_segments"]])
            status = "ok" if not bad else f"QUARANTINED: {bad} of {n} batches"
            when = p["updated"]
        else:
            rows.append([p["prefix_id"][:SHORT_ID_CHARS], p.get("kind") or "prefix", p["num_tokens"], p["num_chunks"], p["num_segments"]])
            status, when = _status(p["quarantined"]), p["created"]
        rows[-1] += [p["namespace"] or "-", p["model_fingerprint"] or "-", _when(when), status]
    # KIND "pages": every PutPages batch of one namespace and model in one row (ls --batches: each), CHUNKS its pages
    headers = ["PREFIX", "KIND", "TOKENS", "CHUNKS", "SEGMENTS", "NAMESPACE", "MODEL", "CREATED", "STATUS"]
    num_prefixes = sum(1 for p in entries if (p.get("kind") or "prefix") != "pages")
    tail = f"{num_prefixes} prefixes"
    if len(entries) > num_prefixes:
        objects = len({(p["namespace"], p["model_fingerprint"]) for p in entries if p.get("kind") == "pages"})
        tail += f", pages of {objects} model{'s' if objects != 1 else ''} in {len(entries) - num_prefixes} batches"
    return items, format_table(headers, rows, right={2, 3, 4}) + "\n" + tail, 0


def _kv_bytes(info: dict) -> str:
    """Stored KV bytes, and for a quantized prefix its scheme and the bytes saved against the KV dtype."""
    stored, raw = info["kv_bytes"], info.get("kv_bytes_unquantized", info["kv_bytes"])
    form = info.get("kv_quant") or info["geometry"]["model"]["dtype"]
    if info.get("streaming_heads"):  # LServe's layout: those heads' sink and recent rows are the client's pages
        form += f", {info['streaming_heads']} streaming (layer, KV head) pairs left out"
    if stored == raw:
        return f"{human_bytes(stored)} ({form})"
    whole = "unquantized" if not info.get("streaming_heads") else "as the full layout unquantized"
    return f"{human_bytes(stored)} ({form}; {human_bytes(raw)} {whole}, {raw / stored:.2f}x smaller, {human_bytes(raw - stored)} saved)"


def cmd_inspect(admin, args) -> tuple[object, str, int]:
    info = admin.inspect(args.prefix)
    m = info["geometry"]["model"]
    geo = info["geometry"]
    head = [
        ["prefix", info["prefix_id"]],
        ["kind", info.get("kind") or "prefix"],
        ["namespace", info["namespace"] or "-"],
        ["model", info["model_fingerprint"] or "-"],
        [
            "geometry",
            f"{m['num_layers']} layers x {m['num_kv_heads']} KV heads x {m['head_dim']} dim {m['dtype']}, "
            f"chunk {geo['chunk_tokens']}, group {geo['group_layers']} layers, probe keys {_probe_form(geo)}",
        ],
        ["tokens", f"{info['num_tokens']} ({info['num_chunks']} chunks x {info['num_groups']} groups)"],
        ["KV bytes", _kv_bytes(info)],
        ["created", _when(info["created"])],
        ["status", _status(info["quarantined"])],
    ]
    rows = [
        [
            s["segment_id"],
            s["file"],
            f"{s['first_chunk']}-{s['first_chunk'] + s['num_chunks'] - 1}",
            s["segment_chunk"],
            s["segment_chunks"],
            human_bytes(s["total_bytes"]),
            human_bytes(s["payload_bytes"]),
            human_bytes(s["padding_bytes"]),
            s["refcount"],
            s["checksums"],
            _status(s["quarantined"]),
        ]
        for s in info["segments"]
    ]
    headers = ["SEGMENT", "FILE", "CHUNKS", "SEG FROM", "SEG CHUNKS", "SIZE", "PAYLOAD", "PADDING", "REFS", "CHECKSUMS", "STATUS"]
    text = format_table(None, head) + "\n\n" + format_table(headers, rows, right={0, 3, 4, 5, 6, 7, 8, 9})
    return info, text, 0


def cmd_stats(admin, args) -> tuple[object, str, int]:
    st = admin.stats()
    rows = [[k, human_bytes(v) if "bytes" in k else ("-" if v is None else v)] for k, v in st.items() if k != "latency"]
    text = format_table(None, rows)
    if st.get("max_disk_bytes"):
        used, cap = st["disk_used_bytes"], st["max_disk_bytes"]
        text += f"\n\ndisk: {human_bytes(used)} of {human_bytes(cap)} ({100 * used / cap:.1f}% of max_disk_bytes)"
    if st.get("latency"):
        lat = [[r["rpc"], r["count"], f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}"] for r in st["latency"]]
        text += "\n\n" + format_table(["RPC", "COUNT", "P50 MS", "P90 MS", "P99 MS"], lat, right={1, 2, 3, 4})
    return st, text, 0


def cmd_delete(admin, args) -> tuple[object, str, int]:
    prefix_id = admin.delete(args.prefix)
    return {"deleted": prefix_id}, f"deleted {prefix_id}", 0


def cmd_evict(admin, args) -> tuple[object, str, int]:
    res = admin.evict(args.to_bytes)
    text = "\n".join(f"evicted {p}" for p in res["evicted"])
    freed, stored = human_bytes(res["bytes_freed"]), human_bytes(res["disk_used_bytes"])
    text += f"\n{len(res['evicted'])} prefixes evicted, {freed} freed, {stored} stored"
    return res, text.strip(), 0


def cmd_compact(admin, args) -> tuple[object, str, int]:
    res = admin.compact()
    text = (
        f"{res['segments_compacted']} segments compacted, {human_bytes(res['bytes_reclaimed'])} reclaimed, "
        f"{res['segments_merged']} small page segments merged into {res['merges']}, {human_bytes(res['disk_used_bytes'])} stored"
    )
    return res, text, 0


def _non_negative_bytes(text: str) -> int:
    """A byte size with the configuration's units (``4096``, ``512MiB``, ``1GB``)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must not be negative, got {text.strip()}")
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _verify_row(r: dict) -> list:
    if not r["ok"]:
        result, detail = "BAD", r["error"] or ", ".join(r["bad_regions"][:3]) + (" ..." if len(r["bad_regions"]) > 3 else "")
    elif r["quarantined"]:  # checksums match now, but reads stay refused until the prefix is stored again
        result, detail = "QUARANTINED", r["quarantined"]
    else:
        result, detail = "ok", "-"
    return [r["segment_id"], result, r["regions"], len(r["bad_regions"]), detail]


def cmd_verify(admin, args) -> tuple[object, str, int]:
    """Exit 1 when a segment fails its checksums or is (still) quarantined."""
    if args.prefix and args.all:
        raise InvalidArgument("prefix", "verify takes a PREFIX or --all, not both")
    prefix_id, results = admin.verify(args.prefix)
    num_bad = sum(not r["ok"] or bool(r["quarantined"]) for r in results)
    scope = f"prefix {prefix_id[:SHORT_ID_CHARS]}" if prefix_id else "all prefixes"
    headers = ["SEGMENT", "RESULT", "REGIONS", "BAD", "DETAIL"]
    text = format_table(headers, [_verify_row(r) for r in results], right={0, 2, 3})
    text += f"\n{scope}: {len(results)} segments, {num_bad} bad"
    return {"ok": num_bad == 0, "prefix_id": prefix_id, "segments": results}, text, 1 if num_bad else 0


def cmd_rebuild_index(args) -> tuple[object, str, int]:
    """Runs on the data directory itself, never through a daemon or an opened store."""
    report = rebuild_index(args.data_dir, progress=progress)
    rows = [[pid[:SHORT_ID_CHARS], "restored", "-"] for pid in report.restored]
    rows += [[pid[:SHORT_ID_CHARS], "SKIPPED", why] for pid, why in sorted(report.skipped.items())]
    text = format_table(["PREFIX", "RESULT", "REASON"], rows)
    text += "".join(f"\nsegment {s}: not used ({why})" for s, why in sorted(report.bad_segments.items()))
    text += "".join(f"\nconversation record {name}: SKIPPED ({why})" for name, why in sorted(report.skipped_conversations.items()))
    text += (
        f"\nstore {report.store_id}: {len(report.restored)} prefixes restored, {len(report.skipped)} skipped; "
        f"{len(report.conversations)} conversation records restored, {len(report.skipped_conversations)} skipped; "
        f"old index moved to {report.moved_aside or '-'}; cache scores start from zero"
    )
    return asdict(report), text, 1 if report.skipped or report.skipped_conversations else 0


COMMANDS = {
    "ls": cmd_ls,
    "inspect": cmd_inspect,
    "stats": cmd_stats,
    "delete": cmd_delete,
    "verify": cmd_verify,
    "evict": cmd_evict,
    "compact": cmd_compact,
    "conversations": cmd_conversations,
    "conversation": cmd_conversation,
    "remote": cmd_remote,
    "route": cmd_route,
}


# ------------------------------------------------------------ arguments
CONNECTION_FLAGS = ("--socket-path", "--tcp-address", "--auth-token-file", "--tls-ca-file", "--data-dir")
ALIASES = {"--socket": "socket_path", "--token-file": "auth_token_file", "--address": "tcp_address"}  # older spellings, hidden


def _tcp_address(text: str) -> str:
    try:
        parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    default_dir = StoreConfig().data_dir
    parser = argparse.ArgumentParser(
        prog="kvstore-admin", description="Inspect and maintain a kvstore (daemon or data directory).", formatter_class=HelpFormatter
    )
    cli_flags.add_version(parser)
    parser.add_argument(
        "--socket-path",
        help=f"daemon unix socket (default: ${cli_flags.SOCKET_ENV}, ${cli_flags.SOCKET_PATH_ENV}, {cli_flags.SYSTEM_SOCKET}, "
        f"then {cli_flags.LOCAL_SOCKET}, the first that exists)",
    )
    parser.add_argument("--tcp-address", type=_tcp_address, help="daemon TCP address host:port")
    parser.add_argument("--auth-token-file", help="bearer token for a TCP daemon")
    parser.add_argument("--tls-ca-file", help="CA bundle to check a TLS daemon")
    parser.add_argument("--timeout", type=cli_flags.positive_seconds, default=600.0, help="deadline of each call in seconds")
    parser.add_argument("--data-dir", default=None, help=f"open this data directory directly, without a daemon (default: {default_dir})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_progress_flag(parser)
    cli_flags.add_log_level(parser, "warning")
    for flag, dest in ALIASES.items():
        cli_flags.add_alias(parser, flag, dest, **({"type": _tcp_address} if dest == "tcp_address" else {}))
    common = argparse.ArgumentParser(add_help=False)  # the same options after the subcommand
    for flag in CONNECTION_FLAGS:
        kwargs = {"type": _tcp_address} if flag == "--tcp-address" else {}
        common.add_argument(flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
    for flag, dest in ALIASES.items():
        cli_flags.add_alias(common, flag, dest, **({"type": _tcp_address} if dest == "tcp_address" else {}))
    common.add_argument("--timeout", type=cli_flags.positive_seconds, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    cli_flags.add_log_level(common, None, hidden=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", parents=[common], help="list stored prefixes, and stored pages by namespace and model").add_argument(
        "--batches", action="store_true", help="list each PutPages batch on its own row"
    )
    sub.add_parser("inspect", parents=[common], help="show one prefix and its segments").add_argument(
        "prefix", help="prefix id or a unique leading part of it (8+ hex digits)"
    )
    sub.add_parser("stats", parents=[common], help="store-wide figures")
    sub.add_parser("delete", parents=[common], help="delete one prefix").add_argument("prefix")
    p = sub.add_parser("verify", parents=[common], help="re-read and check every checksum (exit 1 if any fails)")
    p.add_argument("prefix", nargs="?", help="only this prefix's segments")
    p.add_argument("--all", action="store_true", help="every segment of the store (the default)")
    sub.add_parser(
        "rebuild-index",
        parents=[common],
        help="daemon stopped: move the index aside and rebuild it from the segments (exit 1 if a prefix is skipped)",
    )
    p = sub.add_parser("evict", parents=[common], help="evict the lowest-score prefixes not in use down to a size")
    p.add_argument("--to-bytes", type=_non_negative_bytes, required=True, help="segment bytes to keep at most (units: 512MiB, 1GiB, 1GB)")
    sub.add_parser(
        "compact", parents=[common], help="copy the live chunks of mostly-dead segments into new ones; merge small page-batch segments"
    )
    p = sub.add_parser("conversations", parents=[common], help="list conversation records: state, turns, bytes stored and compressed")
    p.add_argument("--namespace", default="", help="only this namespace (default: every one)")
    p = sub.add_parser("conversation", parents=[common], help="show one conversation: its turns, compressed form and strategy")
    p.add_argument("conversation_id")
    p.add_argument("--namespace", default="", help="the conversation's namespace (default: the empty one)")
    add_remote_parsers(sub, common)
    return parser


def _print_quietly(text: str) -> None:
    """Print; a reader that went away (``| head``) ends the output, not the program with a traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's own flush at exit must not fail again


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.data_dir_given = args.data_dir is not None
    args.data_dir = args.data_dir or StoreConfig().data_dir
    set_enabled(args.progress)
    cli_flags.setup_logging(args.log_level)
    from engine_client.client import KVStoreRpcError

    try:
        if args.command == "rebuild-index":
            data, text, status = cmd_rebuild_index(args)
        elif is_direct(args):
            data, text, status = cmd_route_direct(args)
        else:
            admin = connect(args)
            try:
                data, text, status = COMMANDS[args.command](admin, args)
            finally:
                admin.close()
    except (KVStoreError, KVStoreRpcError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_quietly(json.dumps(data, indent=2) if args.json else text)
    return status


if __name__ == "__main__":
    sys.exit(main())
