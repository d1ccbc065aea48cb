"""Typed configuration: one dataclass per component, from TOML and CLI flags.

Every field carries its documentation in ``metadata["help"]``; the same
fields generate the command-line flags (``--io-queue-depth``), so a TOML key
and a flag never drift apart.  Precedence: defaults < TOML file < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field

MiB = 1 << 20
GiB = 1 << 30


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class StoreConfig:
    data_dir: str = _opt(".kvstore/data", "directory holding segment files and the LMDB index")
    backend: str = _opt("auto", "I/O backend: auto (kvikio when a CUDA driver is present, else posix), posix, kvikio")
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
        from .errors import InvalidArgument
        from .io import BACKENDS

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


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (default: unset)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        conv = _parse_bool if kind is bool else kind
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"cfg_{f.name}",
            type=conv,
            default=None,
            metavar=f.name.upper() if kind is not bool else "BOOL",
            help=f"{f.metadata.get('help', '')} (default: {f.default})",
        )


def load_config(cls, toml_path: str | None = None, section: str | None = None, args=None, **overrides):
    """Build ``cls`` from defaults, an optional TOML file, parsed flags, overrides."""
    values: dict = {}
    names = {f.name for f in dataclasses.fields(cls)}
    if toml_path:
        with open(toml_path, "rb") as fh:
            data = tomllib.load(fh)
        if section:
            data = data.get(section, {})
        unknown = set(data) - names
        if unknown:
            from .errors import InvalidArgument

            raise InvalidArgument(section or "config", f"unknown keys {sorted(unknown)} in {toml_path}")
        values.update(data)
    if args is not None:
        for name in names:
            val = getattr(args, f"cfg_{name}", None)
            if val is not None:
                values[name] = val
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)
