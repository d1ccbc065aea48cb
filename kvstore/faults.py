"""Named crash points for fault-injection tests, off unless ``KVSTORE_FAULTS=1``.

``KVSTORE_CRASH_AT=<step>`` makes the process SIGKILL itself when it reaches
that step, so a test can stop a write at an exact point of its ordering.
``KVSTORE_PAUSE_AT=<step>:<seconds>`` makes the thread that reaches the step
sleep there instead, so a test can act (cancel a call) while it is held.
Both are ignored (the daemon logs that it ignores them) unless
``KVSTORE_FAULTS=1`` is set too: a variable left in a production
environment cannot kill or stall the daemon.  Read once at import: an unset
variable costs one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time

SWITCH = "KVSTORE_FAULTS"
VARIABLES = ("KVSTORE_CRASH_AT", "KVSTORE_PAUSE_AT")

ENABLED = os.environ.get(SWITCH) == "1"
# variables that are set but ignored for want of the switch (the daemon says so at start)
IGNORED = () if ENABLED else tuple(v for v in VARIABLES if os.environ.get(v))

_CRASH_AT = os.environ.get("KVSTORE_CRASH_AT", "") if ENABLED else ""
_PAUSE_AT, _, _PAUSE_S = (os.environ.get("KVSTORE_PAUSE_AT", "") if ENABLED else "").rpartition(":")


def armed(step: str) -> bool:
    """Whether ``step`` would crash or pause: lets a hot path skip ``crash_point`` when it would not."""
    return bool(step) and step in (_CRASH_AT, _PAUSE_AT)


def crash_point(step: str) -> None:
    if step == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == _PAUSE_AT:
        time.sleep(float(_PAUSE_S or 1))
