"""Typed configuration: one dataclass per component, from TOML and CLI flags.

Every field carries its documentation in ``metadata["help"]``; the same
fields generate the command-line flags (``--io-queue-depth``), so a TOML key
and a flag never drift apart.  Precedence: defaults < TOML file < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
import typing
from dataclasses import dataclass, field

from .errors import InvalidArgument

MiB = 1 << 20
GiB = 1 << 30


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class StoreConfig:
    data_dir: str = _opt(".kvstore/data", "directory holding segment files and the LMDB index")
    backend: str = _opt(
        "auto",
        "I/O backend: auto (kvikio when a CUDA driver is present, else posix), posix, uring (io_uring, batched submission), kvikio",
    )
    io_queue_depth: int = _opt(16, "I/O requests kept in flight by the backend")
    direct_io: bool = _opt(True, "bypass the page cache with O_DIRECT (falls back, with a warning, where unsupported)")
    max_read_run_bytes: int = _opt(8 * MiB, "largest single read when adjacent extents are coalesced")
    write_piece_bytes: int = _opt(8 * MiB, "size of the parallel write requests of one segment")
    index_map_bytes: int = _opt(1 * GiB, "initial LMDB map size; grown by doubling when full")
    index_max_map_bytes: int = _opt(1 << 40, "largest LMDB map size the index may grow to")
    max_prefix_tokens: int = _opt(1 << 20, "longest prefix accepted, in tokens")
    min_free_bytes: int = _opt(64 * MiB, "free space kept on the data file system; puts beyond it fail as full")
    read_only: bool = _opt(False, "open the store read-only (maintenance): writes fail with FAILED_PRECONDITION")
    max_disk_bytes: int = _opt(0, "bytes of segment files the store may hold; 0 = unlimited (only min_free_bytes applies)")
    disk_high_watermark: float = _opt(0.95, "fraction of max_disk_bytes a put may not cross without evicting first")
    disk_low_watermark: float = _opt(0.85, "fraction of max_disk_bytes eviction brings the usage down to")
    compact_live_fraction: float = _opt(0.5, "a segment whose referenced chunks span less than this fraction of it is compacted")

    def __post_init__(self) -> None:
        from .io import BACKENDS

        check_field_types(self)

        if self.backend not in BACKENDS:
            raise InvalidArgument("backend", f"must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("io_queue_depth", "max_read_run_bytes", "write_piece_bytes", "index_map_bytes", "max_prefix_tokens"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, "must be positive")
        if self.min_free_bytes < 0:
            raise InvalidArgument("min_free_bytes", "must not be negative")
        for name in ("max_read_run_bytes", "write_piece_bytes"):
            if getattr(self, name) % 4096:
                raise InvalidArgument(name, "must be a multiple of 4096")
        if self.max_disk_bytes < 0:
            raise InvalidArgument("max_disk_bytes", "must not be negative (0 = unlimited)")
        if not 0 < self.disk_low_watermark < self.disk_high_watermark <= 1:
            raise InvalidArgument(
                "disk_low_watermark",
                f"watermarks must satisfy 0 < disk_low_watermark < disk_high_watermark <= 1, "
                f"got {self.disk_low_watermark} and {self.disk_high_watermark}",
            )
        if not 0 < self.compact_live_fraction <= 1:
            raise InvalidArgument("compact_live_fraction", f"must be in (0, 1], got {self.compact_live_fraction}")
        if self.index_max_map_bytes < self.index_map_bytes:
            raise InvalidArgument("index_max_map_bytes", "must be at least index_map_bytes")


_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
# Binary: K/KiB, M/MiB, G/GiB, T/TiB; SI: kB, MB, GB, TB. Case-insensitive.
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
_WANT = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string"}


def parse_bytes(text: str) -> int:
    """``"512MiB"`` -> 536870912; ``"64k"`` -> 65536; ``"1GB"`` -> 10**9; ``"4096"`` -> 4096."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if unit not in SIZE_UNITS:
        raise ValueError(f"expected a byte size such as 4096, 64KiB, 512MiB, 1GiB or 1GB, got {text!r}")
    return int(m.group(1)) * SIZE_UNITS[unit]


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise ValueError(f"expected true/false/yes/no/1/0, got {text!r}")


def _from_text(name: str, kind: type):
    """The converter of a command-line value for field ``name`` of type ``kind``."""
    if kind is bool:
        return parse_bool
    if kind is int and name.endswith("_bytes"):
        return parse_bytes
    return kind


def coerce_field(name: str, kind: type, value):
    """``value`` from a TOML file as field ``name``'s type; no silent coercion.

    bool must be a TOML bool, int a TOML integer (``*_bytes`` also a string
    with a unit), float a TOML number, str a TOML string.
    """
    if kind is int and name.endswith("_bytes") and isinstance(value, str):
        try:
            return parse_bytes(value)
        except ValueError as exc:
            raise InvalidArgument(name, str(exc)) from None
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise InvalidArgument(name, f"expected {_WANT[kind]}, got {value!r}")
    return value


def check_field_types(obj) -> None:
    """Raise InvalidArgument naming the first field of ``obj`` whose value does not have its annotated type."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        coerce_field(f.name, hints[f.name], getattr(obj, f.name))


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one stderr line naming the flag (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


class _FlagType:
    """argparse ``type=``: converts, and reports a bad value in one line naming the flag."""

    def __init__(self, name: str, kind: type):
        self.conv = _from_text(name, kind)
        self.want = _WANT[kind]

    def __call__(self, text: str):
        try:
            return self.conv(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) if "expected" in str(exc) else f"expected {self.want}, got {text!r}") from None


def add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (default: unset)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"cfg_{f.name}",
            type=_FlagType(f.name, kind),
            default=None,
            metavar=f.name.upper() if kind is not bool else "BOOL",
            help=f"{f.metadata.get('help', '')} (default: {f.default})",
        )


def read_toml(path: str) -> dict:
    """The TOML file at ``path``; a missing file or a syntax error is InvalidArgument naming the file."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise InvalidArgument("--config", f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument("--config", f"{path} is not valid TOML: {exc}") from None


def load_config(cls, toml_path: str | None = None, section: str | None = None, args=None, **overrides):
    """Build ``cls`` from defaults, an optional TOML file, parsed flags, overrides."""
    values: dict = {}
    hints = typing.get_type_hints(cls)
    if toml_path:
        data = read_toml(toml_path)
        data = data.get(section, {}) if section else data
        where = f"[{section}]" if section else toml_path
        if not isinstance(data, dict):
            raise InvalidArgument(where, f"must be a table in {toml_path}")
        unknown = set(data) - set(hints)
        if unknown:
            raise InvalidArgument(f"{where} {sorted(unknown)[0]}", f"unknown key in {toml_path} (known: {', '.join(hints)})")
        values.update({k: coerce_field(f"{where} {k}", hints[k], v) for k, v in data.items()})
    if args is not None:
        for name in hints:
            val = getattr(args, f"cfg_{name}", None)
            if val is not None:
                values[name] = val
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)
