"""Typed configuration: one dataclass per component, from TOML, the environment and CLI flags.

Every field carries its documentation in ``metadata["help"]``; the same
fields generate the command-line flags (``--io-queue-depth``) and the
environment variables (``KVSTORE_IO_QUEUE_DEPTH``), so a TOML key, a flag
and a variable never drift apart.  Precedence: flag > environment > TOML
file > default.  A key that was renamed keeps its old name as a hidden
alias (``RENAMED_KEYS`` of the class: old TOML key and old flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field

from .contract.errors import InvalidArgument

MiB = 1 << 20
GiB = 1 << 30


def _opt(default, help: str, parse=None):
    """A config field: its default, its documentation, and optionally how a flag's or variable's text becomes its value."""
    metadata = {"help": help} if parse is None else {"help": help, "parse": parse}
    return field(default=default, metadata=metadata)


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
    merge_min_segments: int = _opt(
        8, "small page-batch segments of one namespace, model and geometry that are merged into one segment (0 = never merge)"
    )
    merge_small_segment_bytes: int = _opt(4 * MiB, "a page-batch segment smaller than this is small: one a merge may take")
    merge_max_bytes: int = _opt(64 * MiB, "largest merge: the segments merged into one hold at most this many bytes together")

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
        if self.merge_min_segments < 0 or self.merge_min_segments == 1:
            raise InvalidArgument("merge_min_segments", f"must be 0 (never merge) or at least 2, got {self.merge_min_segments}")
        for name in ("merge_small_segment_bytes", "merge_max_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, "must be positive")
        if self.merge_max_bytes < 2 * self.merge_small_segment_bytes:
            raise InvalidArgument(
                "merge_max_bytes",
                f"must be at least twice merge_small_segment_bytes ({self.merge_small_segment_bytes}), got {self.merge_max_bytes}",
            )
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


def _from_text(name: str, kind: type, parse=None):
    """The converter of a command-line value for field ``name`` of type ``kind`` (``parse``: the field's own)."""
    if parse is not None:
        return parse
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


def field_types(cls) -> dict[str, type]:
    """{field name: its type} of dataclass ``cls`` (class variables left out)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_field_types(obj) -> None:
    """Raise InvalidArgument naming the first field of ``obj`` whose value does not have its annotated type."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        coerce_field(f.name, hints[f.name], getattr(obj, f.name))


ENV_PREFIX = "KVSTORE_"


def env_name(key: str) -> str:
    """The environment variable of config key ``key``: ``io_queue_depth`` -> ``KVSTORE_IO_QUEUE_DEPTH``."""
    return ENV_PREFIX + key.upper()


def format_bytes(n: int) -> str:
    """``268435456`` -> ``"256 MiB"``: the largest binary unit that divides ``n`` exactly (``"0"``, ``"4097 bytes"``)."""
    if n == 0:
        return "0"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def format_default(name: str, kind: type, value) -> str | None:
    """A field's default as ``--help`` shows it; None for an empty string (nothing worth showing)."""
    if kind is bool:
        return "true" if value else "false"
    if kind is int and name.endswith("_bytes"):
        return format_bytes(value)
    if kind is str and not value:
        return None
    return str(value)


def parse_host_port(text: str, *, need_host: bool = True) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError unless the port is in 0-65535."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or (need_host and not host):
        raise ValueError(f"expected host:port with a port in 0-65535 (e.g. 127.0.0.1:7420), got {text!r}")
    return host, int(port)


def one_of(*choices: str):
    """The ``parse`` of a string field taking one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


class HelpFormatter(argparse.HelpFormatter):
    """Shows a ``BoolFlag`` as ``--x, --no-x`` (its older ``--x VALUE`` form works but is not advertised)."""

    def _format_action_invocation(self, action):
        if isinstance(action, BoolFlag):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one stderr line naming the flag (exit status 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


class BoolFlag(argparse.Action):
    """A boolean option: ``--x`` sets it, ``--no-x`` clears it; ``--x true|false|yes|no|1|0`` (the older form) still works."""

    def __init__(self, option_strings, dest, default=None, help=None, **kwargs):
        names = [*option_strings, *("--no-" + s[2:] for s in option_strings if s.startswith("--"))]
        super().__init__(names, dest, nargs="?", default=default, help=help, metavar="BOOL")

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            if values is not None:
                raise argparse.ArgumentError(self, f"{option_string} takes no value, got {values!r}")
            value = False
        elif values is None:
            value = True
        else:
            try:
                value = parse_bool(values)
            except ValueError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, value)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class _FlagType:
    """argparse ``type=``: converts, and reports a bad value in one line naming the flag."""

    def __init__(self, name: str, kind: type, parse=None):
        self.conv = _from_text(name, kind, parse)
        self.want = _WANT[kind]

    def __call__(self, text: str):
        try:
            return self.conv(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) if "expected" in str(exc) else f"expected {self.want}, got {text!r}") from None


def renamed_keys(cls) -> dict[str, str]:
    """{old key: its new name} of ``cls`` (a class attribute ``RENAMED_KEYS``; none by default)."""
    return getattr(cls, "RENAMED_KEYS", {})


def add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (default: unset), and hidden ones under renamed keys' old names."""
    hints = field_types(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        help_text = f.metadata.get("help", "")
        default = format_default(f.name, kind, f.default)
        if default is not None:
            help_text += f" (default: {default})"
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            group.add_argument(flag, dest=f"cfg_{f.name}", action=BoolFlag, default=None, help=help_text)
        else:
            conv = _FlagType(f.name, kind, f.metadata.get("parse"))
            group.add_argument(flag, dest=f"cfg_{f.name}", type=conv, default=None, metavar=f.name.upper(), help=help_text)
    parses = {f.name: f.metadata.get("parse") for f in dataclasses.fields(cls)}
    for old, new in renamed_keys(cls).items():
        kind = hints[new]
        kwargs = {"action": BoolFlag} if kind is bool else {"type": _FlagType(new, kind, parses[new])}
        group.add_argument("--" + old.replace("_", "-"), dest=f"cfg_{new}", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def read_toml(path: str) -> dict:
    """The TOML file at ``path``; a missing file or a syntax error is InvalidArgument naming the file."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise InvalidArgument("--config", f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument("--config", f"{path} is not valid TOML: {exc}") from None


def _toml_values(cls, hints: dict, toml_path: str, section: str | None) -> dict:
    data = read_toml(toml_path)
    data = data.get(section, {}) if section else data
    where = f"[{section}]" if section else toml_path
    if not isinstance(data, dict):
        raise InvalidArgument(where, f"must be a table in {toml_path}")
    for old, new in renamed_keys(cls).items():
        if old in data:
            if new in data:
                raise InvalidArgument(f"{where} {old}", f"is the old name of {new}; {toml_path} sets both, keep {new}")
            data = {(new if k == old else k): v for k, v in data.items()}
    unknown = set(data) - set(hints)
    if unknown:
        raise InvalidArgument(f"{where} {sorted(unknown)[0]}", f"unknown key in {toml_path} (known: {', '.join(hints)})")
    return {k: coerce_field(f"{where} {k}", hints[k], v) for k, v in data.items()}


def _env_values(cls, hints: dict, environ) -> dict:
    """{key: value} of the ``KVSTORE_<KEY>`` variables set in ``environ``; a bad value is InvalidArgument naming the variable."""
    values = {}
    for f in dataclasses.fields(cls):
        name, kind, var = f.name, hints[f.name], env_name(f.name)
        if var not in environ:
            continue
        text = environ[var]
        try:
            values[name] = _from_text(name, kind, f.metadata.get("parse"))(text)
        except ValueError as exc:
            msg = str(exc) if "expected" in str(exc) else f"expected {_WANT[kind]}, got {text!r}"
            raise InvalidArgument(var, msg) from None
    return values


def load_config(cls, toml_path: str | None = None, section: str | None = None, args=None, environ=None, **overrides):
    """Build ``cls`` from defaults, an optional TOML file, ``KVSTORE_<KEY>`` variables, parsed flags, overrides.

    ``environ`` defaults to ``os.environ``.  A value the class refuses is
    InvalidArgument naming where it came from when that was a variable.
    """
    hints = field_types(cls)
    values: dict = _toml_values(cls, hints, toml_path, section) if toml_path else {}
    from_env = _env_values(cls, hints, os.environ if environ is None else environ)
    values.update(from_env)
    if args is not None:
        for name in hints:
            val = getattr(args, f"cfg_{name}", None)
            if val is not None:
                values[name] = val
                from_env.pop(name, None)
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)
    try:
        return cls(**values)
    except InvalidArgument as exc:
        if exc.field in from_env and exc.field not in given:
            raise InvalidArgument(env_name(exc.field), str(exc).removeprefix(f"{exc.field}: ")) from None
        raise
