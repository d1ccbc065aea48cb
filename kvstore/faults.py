"""Named crash points for fault-injection tests.

``KVSTORE_CRASH_AT=<step>`` makes the process SIGKILL itself when it reaches
that step, so a test can stop a write at an exact point of its ordering.
Read once at import: an unset variable costs one comparison per step.
"""

from __future__ import annotations

import os
import signal

_CRASH_AT = os.environ.get("KVSTORE_CRASH_AT", "")


def crash_point(step: str) -> None:
    if step == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)
