"""Flags every command line shares: one name per thing, old spellings as hidden aliases.

The names (``kvstore serve``, ``kvstore-demo``, ``kvstore-admin``, ``kvstore-bench``):

    --socket-path PATH       the daemon's unix socket   (old: --socket, --target unix:PATH)
    --tcp-address HOST:PORT  the daemon's TCP address   (old: kvstore-admin --address)
    --auth-token-file FILE   bearer token(s) for TCP     (old: --token-file; serve: --auth-tokens-file)
    --tls-ca-file FILE       CA bundle of the TLS peer   (old: serve --tls-client-ca-file)
    --data-dir DIR           data / work directory       (old: --directory)
    --budgets F,F,...        budget fractions            (old: --budget F, repeated)
    --max-read-run-bytes N   largest coalesced read      (old: kvstore-bench io --max-read-run)
    --io-queue-depth N       requests in flight          (old: --iodepth; ``kvstore-bench io`` keeps
                                                          --iodepth as its name, like every option of
                                                          its fio-style job, and takes this as an alias)
    --x / --no-x             booleans                    (old: --x true|false|yes|no|1|0, still taken)
    --no-progress            no progress bars            (before or after a subcommand)
    --log-level LEVEL        debug, info, warning, error
    --version

An alias is a second option with the same ``dest``, hidden from ``--help``
and with no default of its own, so it changes nothing unless it is given.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

from . import __version__
from .config import env_name
from .logs import LEVELS
from .server.config import ServerConfig

# Where kvstore-admin looks for a daemon: $KVSTORE_SOCKET, $KVSTORE_SOCKET_PATH (the daemon's own
# variable), the system path, then the default of `kvstore serve` in this directory.
SOCKET_ENV = "KVSTORE_SOCKET"
SOCKET_PATH_ENV = env_name("socket_path")
SYSTEM_SOCKET = "/run/kvstore/kvstore.sock"  # deploy/kvstore.toml, the systemd unit and the DaemonSet
LOCAL_SOCKET = ServerConfig.socket_path  # `kvstore serve` / `make demo` in a checkout
LOG_LEVELS = LEVELS


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def add_log_level(parser, default: str | None, hidden: bool = False) -> None:
    """``--log-level``: the least severe log lines a command writes (``default``; None: leave it to an earlier one)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS if default is None else default,
        help=argparse.SUPPRESS if hidden else f"least severe log lines written (default: {default})",
    )


def setup_logging(level: str) -> None:
    """Log lines of a command line tool: ``L logger: message`` on stderr from ``level`` up."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(levelname).1s %(name)s: %(message)s", force=True)


def default_socket(environ=os.environ) -> str:
    """The socket ``kvstore serve`` listens on unless told otherwise: ``$KVSTORE_SOCKET_PATH``, else ServerConfig's default.

    ``$KVSTORE_SOCKET`` (the clients' variable) is honoured after it.
    """
    return environ.get(SOCKET_PATH_ENV) or environ.get(SOCKET_ENV) or LOCAL_SOCKET


def add_alias(parser, flag: str, dest: str, **kwargs) -> None:
    """``flag`` sets ``dest`` like its new name does, unlisted in ``--help``."""
    parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


class AppendAlias(argparse.Action):
    """A repeated one-value alias of a list option (``--budget F`` for ``--budgets``):
    the first replaces the default list, the next ones add to it."""

    def __call__(self, parser, namespace, value, option_string=None):
        marker = f"_{self.dest}_appended"
        current = list(getattr(namespace, self.dest) or []) if getattr(namespace, marker, False) else []
        setattr(namespace, marker, True)
        setattr(namespace, self.dest, current + [value])


def unix_target(text: str) -> str:
    """``PATH`` or ``unix:PATH`` -> ``unix:/abs/PATH`` (a gRPC target)."""
    path = text.removeprefix("unix:")
    if not path:
        raise argparse.ArgumentTypeError("expected a socket path")
    return f"unix:{os.path.abspath(path)}"


def socket_candidates(environ=os.environ) -> list[tuple[str, str]]:
    """(path, where it came from), in the order kvstore-admin tries them."""
    out = []
    for var in (SOCKET_ENV, SOCKET_PATH_ENV):
        if environ.get(var):
            out.append((environ[var], f"${var}"))
    out.append((SYSTEM_SOCKET, "system default"))
    out.append((os.path.abspath(LOCAL_SOCKET), "this directory"))
    return out


def find_socket(environ=os.environ) -> tuple[str | None, str]:
    """The first candidate socket that exists, and a sentence saying where it looked."""
    candidates = socket_candidates(environ)
    for path, _ in candidates:
        if os.path.exists(path):
            return path, ""
    return None, "looked at " + ", ".join(f"{path} ({why})" for path, why in candidates)


def fractions_arg(text: str) -> list[float]:
    """``--budgets 0.05,0.25``: comma-separated fractions in (0, 1]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions, got {text!r}") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"fractions must be in (0, 1], got {text!r}")
    return values


def one_fraction_arg(text: str) -> float:
    """``--budget F``, the older one-value spelling of ``--budgets``."""
    values = fractions_arg(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"--budget takes one fraction (--budgets takes a list), got {text!r}")
    return values[0]


def positive_seconds(text: str) -> float:
    """``--timeout S``: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
