"""``kvstore`` console script: ``serve`` (the daemon) and ``health`` (its probe).

The demo is ``kvstore-demo`` (``kvstore_tools/demo.py``): it is a client of the
daemon, and nothing in this package imports the client.
"""

from __future__ import annotations

import argparse
import sys

from . import cli_flags
from .config import OneLineErrorParser
from .contract.errors import KVStoreError


def _serve(args) -> int:
    from .server.main import serve

    return serve(args)


def _health(args) -> int:
    from . import logs
    from .health import check

    logs.configure("text", args.log_level)  # before grpc is imported: its core's verbosity follows the level
    return check(args.socket_path, args.service, args.timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="kvstore", description="Storage tier for LLM prefix KV caches.")
    cli_flags.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    from .server.main import add_serve_args

    serve = sub.add_parser("serve", help="run the gRPC daemon (unix socket, optional TCP with TLS or token)")
    add_serve_args(serve)
    serve.set_defaults(func=_serve)
    health = sub.add_parser("health", help="gRPC health check of a daemon (exit 0 when SERVING), for liveness/readiness probes")
    health.add_argument(
        "--socket-path",
        default=cli_flags.default_socket(),
        help=f"the daemon's socket (default: ${cli_flags.SOCKET_PATH_ENV}, ${cli_flags.SOCKET_ENV}, "
        f"else where `kvstore serve` listens by default: {cli_flags.LOCAL_SOCKET})",
    )
    cli_flags.add_alias(health, "--socket", "socket_path")
    health.add_argument("--service", default="", help="service name to check ('' = the whole daemon)")
    health.add_argument("--timeout", type=cli_flags.positive_seconds, default=5.0, help="seconds")
    cli_flags.add_log_level(health, "warning")
    cli_flags.add_version(health)
    health.set_defaults(func=_health)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (KVStoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
