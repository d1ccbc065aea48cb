"""The raw data connection's framing, shared by the daemon and its clients.

A TCP client that reads many bytes opens a plain TCP connection to the
daemon's data port (the ``DataChannel`` RPC says which).  The daemon greets
it with one ``HELLO``: a magic, the format version, the connection's id and
a random 16-byte secret.  A ``ReadChunks`` call that names the id and the
secret (``data_channel``, ``data_secret``) gets its extents on that
connection, each as one ``FRAME`` header followed by the extent's bytes,
while the call's stream carries only its header (first) and stats (last).
The client sends nothing on the connection; one call uses it at a time.
Only the holder of the secret can have bytes sent there, and only an
authenticated call, checked against the prefix's namespace like any other
read, can send them.
"""

from __future__ import annotations

import struct

HELLO = struct.Struct("<4sHHQ16s")  # magic, version, reserved, channel id, secret
HELLO_MAGIC = b"KVDC"
FRAME = struct.Struct("<4sIQQ")  # magic, group, chunk, extent bytes that follow
FRAME_MAGIC = b"KVDF"
VERSION = 1
