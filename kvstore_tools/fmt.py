"""Text output of the console tools: byte sizes, times and aligned tables."""

from __future__ import annotations

import time


def human_bytes(nbytes: float) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_table(headers: list[str] | None, rows: list[list], right: set[int] | None = None) -> str:
    """Aligned text table (no header line when ``headers`` is None); columns
    whose index is in ``right`` are right-aligned."""
    right = right or set()
    cells = ([[str(c) for c in headers]] if headers else []) + [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def when(ts: float) -> str:
    """A UNIX time as local ``YYYY-MM-DD HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
