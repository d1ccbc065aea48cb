"""Ownership of the daemon's unix socket paths (the gRPC socket and ``.shm``).

Before binding, ``claim`` makes sure the path can be taken without harming
anyone: a live listener there (another daemon) or anything that is not a
socket is a refusal naming the key; a socket nobody answers on is a stale
one from a crashed run and is removed.  The run directory is created 0750
only when it does not exist; an existing directory's mode is never changed.
After binding, ``identity`` records the socket's inode, and ``release``
removes the path at exit only if it still is that inode (a socket someone
else bound there since is left alone).  ``private_path`` and ``publish``
bind gRPC's socket under a name of its own and link it into place, so that
neither a race at start nor gRPC's own clean-up replaces another's socket.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct

from ..contract.errors import InvalidArgument
from ..file_modes import DIR_MODE, make_dirs

PROBE_TIMEOUT_S = 2.0


def claim(path: str, key: str) -> None:
    """Make ``path`` free for a new socket, or raise InvalidArgument(key)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        try:
            make_dirs(directory)
        except OSError as exc:
            raise InvalidArgument(key, f"cannot create {directory}: {exc.strerror}") from None
        os.chmod(directory, DIR_MODE)  # ours: undo the umask, nothing else
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InvalidArgument(key, f"{path} exists and is not a socket; refusing to replace it")
    live, pid = _probe(path)
    if live:
        who = f"pid {pid}" if pid else "another process"
        raise InvalidArgument(key, f"{path} is in use: a live daemon ({who}) answers on it; stop it or choose another path")
    os.unlink(path)  # stale: left by a run that did not exit cleanly


def _probe(path: str) -> tuple[bool, int]:
    """(someone answers on ``path``, their pid or 0)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PROBE_TIMEOUT_S)
    try:
        sock.connect(path)
    except ConnectionRefusedError:
        return False, 0
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False, 0
        return True, 0  # cannot tell (permissions, a full backlog): do not take it
    else:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return True, struct.unpack("3i", creds)[0]
    finally:
        sock.close()


def private_path(path: str) -> str:
    """Where to bind before ``publish``: next to ``path``, named for this process.

    gRPC unlinks its unix socket by path when its listener closes; bound at
    a private name and linked to ``path``, it can only remove that name.
    """
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{os.getpid()}")


def publish(bound: str, path: str, key: str) -> tuple[int, int]:
    """Link the socket bound at ``bound`` to ``path`` (never replacing anything); its identity."""
    try:
        os.link(bound, path)
    except FileExistsError:
        raise InvalidArgument(key, f"{path} was taken by another process while this daemon started") from None
    finally:
        os.unlink(bound)
    return identity(path)


def identity(path: str) -> tuple[int, int]:
    """(device, inode) of the socket just bound at ``path``."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def release(path: str, ident: tuple[int, int] | None) -> None:
    """Remove ``path`` if it is still the socket recorded by ``identity``."""
    if ident is None:
        return
    try:
        if identity(path) == ident:
            os.unlink(path)
    except FileNotFoundError:
        pass


def check_tcp_free(address: str, key: str = "tcp_address") -> None:
    """InvalidArgument(key) if ``host:port`` cannot be bound now (in use, not local, bad form).

    gRPC logs its own bind failure in several lines; checking first keeps a
    port in use to the daemon's one-line refusal.  Port 0 (any) is not checked.
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise InvalidArgument(key, f"expected host:port, got {address!r}")
    if int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgument(key, f"cannot resolve {address}: {exc.strerror}") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(addr)
            except OSError as exc:
                raise InvalidArgument(key, f"cannot listen on {address}: {exc.strerror}") from None
