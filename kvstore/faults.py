"""Named crash points for fault-injection tests.

``KVSTORE_CRASH_AT=<step>`` makes the process SIGKILL itself when it reaches
that step, so a test can stop a write at an exact point of its ordering.
``KVSTORE_PAUSE_AT=<step>:<seconds>`` makes the thread that reaches the step
sleep there instead, so a test can act (cancel a call) while it is held.
Read once at import: an unset variable costs one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time

_CRASH_AT = os.environ.get("KVSTORE_CRASH_AT", "")
_PAUSE_AT, _, _PAUSE_S = os.environ.get("KVSTORE_PAUSE_AT", "").rpartition(":")


def armed(step: str) -> bool:
    """Whether ``step`` would crash or pause: lets a hot path skip ``crash_point`` when it would not."""
    return step in (_CRASH_AT, _PAUSE_AT)


def crash_point(step: str) -> None:
    if step == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == _PAUSE_AT:
        time.sleep(float(_PAUSE_S or 1))
