"""The small calibration files kept next to a model's checkpoint: read with a clear error, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_text_atomic(path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename: a reader sees the old file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class ProfileError(ValueError):
    """A calibration file kept with a model (streaming heads, stand-in layers) that is missing, malformed or made for another model."""


def read_profile_text(path, what: str) -> str:
    """The text of ``path``; ``ProfileError("no <what> file at <path>")`` when there is none."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ProfileError(f"no {what} file at {path}") from None


PACKAGED = Path(__file__).with_name("calibrations")  # calibrations shipped with the package, ``<model>-<dtype>.<kind>.json``


def packaged_path(pattern: str, fingerprint: str) -> Path | None:
    """The shipped calibration file matching ``pattern`` (a glob in ``PACKAGED``) made for the model of
    ``fingerprint``, or None; files that cannot be read as JSON are passed over (the loader says why)."""
    for path in sorted(PACKAGED.glob(pattern)):
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and raw.get("model_fingerprint") == fingerprint:
            return path
    return None
