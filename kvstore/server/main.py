"""``kvstore serve``: parse config (TOML + flags) and run the daemon."""

from __future__ import annotations

import argparse
import asyncio
import sys

from .. import logs
from ..cli_flags import add_version
from ..config import OneLineErrorParser, StoreConfig, add_config_args, load_config
from ..errors import InvalidArgument
from .config import ServerConfig


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    add_version(parser)
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [store] and [server] sections")
    parser.add_argument("--ready-file", help="write 'PID TCP_PORT METRICS_PORT' here once listening (for supervisors and tests)")
    add_config_args(parser, StoreConfig)
    add_config_args(parser, ServerConfig)


def serve(args: argparse.Namespace) -> int:
    """Run the daemon; a configuration error is one stderr line and exit status 2.

    Everything that can be wrong with the configuration (file syntax, types,
    unknown keys, token and TLS files, addresses in use) is found before
    anything listens, so a refused start leaves no socket behind.
    """
    try:
        store_cfg = load_config(StoreConfig, args.config, "store", args=args)
        server_cfg = load_config(ServerConfig, args.config, "server", args=args)
        logs.configure(server_cfg.log_format)
        asyncio.run(_run(store_cfg, server_cfg, args.ready_file))
    except InvalidArgument as exc:
        print(f"kvstore serve: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return 0


async def _run(store_cfg, server_cfg, ready_file):
    from .app import run

    await run(store_cfg, server_cfg, ready_file)


def main(argv=None) -> int:
    parser = OneLineErrorParser(prog="kvstore serve", description="run the kvstore daemon")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    logs.configure("text")
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
