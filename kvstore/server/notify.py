"""systemd's readiness protocol (``Type=notify``) without a dependency: one datagram to ``$NOTIFY_SOCKET``.

``READY=1`` once every listener serves, ``STOPPING=1`` when draining starts.
Outside systemd (no ``$NOTIFY_SOCKET``) nothing is sent; a socket that
cannot be reached is logged, never fatal.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str, environ=os.environ) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``, ...) to the service manager; whether it was sent."""
    path = environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    if path.startswith("@"):  # an abstract socket
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(path)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not notify the service manager at %s (%s): %s", environ["NOTIFY_SOCKET"], state, exc)
        return False
    return True
