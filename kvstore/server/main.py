"""``kvstore serve``: parse config (TOML + environment + flags) and run the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from .. import logs
from ..cli_flags import add_version
from ..config import ENV_PREFIX, OneLineErrorParser, StoreConfig, add_config_args, load_config
from ..contract.errors import InvalidArgument, KVStoreError, StartupError
from ..remote.config import RemoteConfig
from .config import ServerConfig

log = logging.getLogger(__name__)

SERVE_EPILOG = (
    f"Every option is also a key of the --config file ([store], [server] or [remote], the flag's name with '_') "
    f"and an environment variable ({ENV_PREFIX}<KEY>, e.g. {ENV_PREFIX}IO_QUEUE_DEPTH); "
    "a flag wins over the environment, the environment over the file. "
    "Sizes take units (512MiB, 1GiB, 1GB); booleans are --x or --no-x."
)


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    add_version(parser)
    parser.epilog = SERVE_EPILOG
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [store], [server] and [remote] sections")
    parser.add_argument("--ready-file", help="write 'PID TCP_PORT METRICS_PORT' here once listening (for supervisors and tests)")
    add_config_args(parser, StoreConfig)
    add_config_args(parser, ServerConfig)
    add_config_args(parser, RemoteConfig)


def serve(args: argparse.Namespace) -> int:
    """Run the daemon; a refused start is one stderr line naming the key (a log event with ``json``).

    Exit status 2 for a configuration error: everything that can be wrong
    with it (file syntax, types, unknown keys, token and TLS files, addresses
    in use) is found before anything listens, so a refused start leaves no
    socket behind.  Exit status 1 when what a key names cannot be used
    (``data_dir: /x: permission denied``, a store another daemon holds).
    """
    try:
        store_cfg = load_config(StoreConfig, args.config, "store", args=args)
        server_cfg = load_config(ServerConfig, args.config, "server", args=args)
        remote_cfg = load_config(RemoteConfig, args.config, "remote", args=args)
    except InvalidArgument as exc:
        print(f"kvstore serve: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logs.configure(server_cfg.log_format, server_cfg.log_level)
    try:
        asyncio.run(_run(store_cfg, server_cfg, args.ready_file, remote_cfg))
    except InvalidArgument as exc:
        return _refuse(f"invalid configuration: {exc}", 2)
    except StartupError as exc:
        return _refuse(f"cannot start: {exc}", 1)
    except KVStoreError as exc:
        return _refuse(f"cannot start: {exc}", 1)
    finally:
        logs.close()
    return 0


def _refuse(message: str, status: int) -> int:
    if logs.routing_native_stderr():  # json: the refusal is one event like every other line
        log.error("%s", message)
    else:
        print(f"kvstore serve: {message}", file=sys.stderr)
    return status


async def _run(store_cfg, server_cfg, ready_file, remote_cfg):
    from .app import run

    await run(store_cfg, server_cfg, ready_file, remote_cfg)


def main(argv=None) -> int:
    parser = OneLineErrorParser(prog="kvstore serve", description="run the kvstore daemon")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
