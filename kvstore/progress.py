"""Progress bars for long runs (verify, rebuild-index, compaction, benchmark prefills).

``progress(iterable, desc)`` is a tqdm bar on stderr when stderr is a
terminal and bars are enabled, else the iterable itself (no output, no
import of tqdm); ``bar(total, desc)`` the same for work counted by hand
(``update(n)``, ``close()``).  Commands turn bars off with
``--no-progress`` (``set_enabled(False)``); pipes and log files never get
them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

_enabled = True


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    return _enabled and sys.stderr.isatty()


def progress(iterable: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it") -> Iterable[T]:
    if not enabled():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, *, unit: str = "it"):
    """A bar advanced by ``update(n)`` and ended by ``close()``; one that prints nothing when bars are off."""
    if not enabled():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)


def add_progress_flag(parser) -> None:
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bars (off anyway when stderr is not a terminal)"
    )
