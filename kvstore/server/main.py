"""``kvstore serve``: parse config (TOML + flags) and run the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging

from ..config import StoreConfig, add_config_args, load_config
from ..errors import KVStoreError
from .config import ServerConfig


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [store] and [server] sections")
    parser.add_argument("--ready-file", help="write 'PID TCP_PORT' here once listening (for supervisors and tests)")
    add_config_args(parser, StoreConfig)
    add_config_args(parser, ServerConfig)


def serve(args: argparse.Namespace) -> int:
    try:
        store_cfg = load_config(StoreConfig, args.config, "store", args=args)
        server_cfg = load_config(ServerConfig, args.config, "server", args=args)
    except KVStoreError as exc:
        logging.getLogger("kvstore").error("invalid configuration: %s", exc)
        return 2
    asyncio.run(_run(store_cfg, server_cfg, args.ready_file))
    return 0


async def _run(store_cfg, server_cfg, ready_file):
    from .app import run

    await run(store_cfg, server_cfg, ready_file)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore serve", description="run the kvstore daemon")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
