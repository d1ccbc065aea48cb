"""Log lines of the daemon: a timestamp, a level, the logger, one line per event.

``text``: ``2026-11-22T09:05:46.123+0000 WARNING kvstore.server.status: refused ...``;
``json``: one object per line (``ts``, ``level``, ``logger``, ``msg``, and
``exc`` for a traceback) for log collectors.  A traceback stays on the
event's line in both (newlines become `` | `` in text), so a collector that
splits on newlines never sees half an event.

gRPC's C core writes its own lines to file descriptor 2, past Python's
logging.  ``configure`` sets its verbosity before grpc is imported (errors
only, unless the level is debug; no traces), and with ``json`` a thread reads
descriptor 2 through a pipe and logs each of those lines as logger ``grpc``
(``NativeStderr``), so every line is JSON.  Python's own ``sys.stderr`` and
faulthandler then write to the real stderr directly.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import sys
import threading
import time

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
# GRPC_VERBOSITY for each level: gRPC's info lines are per-connection chatter, kept for debug
GRPC_VERBOSITY = {"debug": "INFO", "info": "ERROR", "warning": "ERROR", "error": "ERROR"}


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return line.replace("\n", " | ")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=False)


def configure(log_format: str = "text", level: str = "info") -> None:
    """Route every logger to stderr in ``log_format`` at ``level`` and up (replacing earlier handlers).

    Call before grpc is imported: its C core reads ``GRPC_VERBOSITY`` and
    ``GRPC_TRACE`` once (values an operator set in the environment are kept).
    """
    os.environ.setdefault("GRPC_VERBOSITY", GRPC_VERBOSITY[level])
    os.environ.setdefault("GRPC_TRACE", "")
    if log_format == "json" and _native is None:
        _route_native_stderr()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


# absl's prefix, as gRPC's core writes it: E1127 13:23:19.115024    4106 add_port.cc:83] message
_NATIVE_LINE = re.compile(r"([DIWEF])\d{4} [\d:.]+\s+\d+ ([^\]]+)\] ?(.*)")
_NATIVE_LEVELS = {"D": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}


class NativeStderr:
    """File descriptor 2 as a pipe read by a thread: each line written there becomes a record of logger ``grpc``.

    ``sys.stderr`` (and faulthandler) move to a duplicate of the real stderr,
    so Python's own writes never pass through the pipe.  ``close`` puts the
    real stderr back on descriptor 2 and logs what is left in the pipe.
    """

    def __init__(self, logger: str = "grpc"):
        self.log = logging.getLogger(logger)
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._previous = sys.stderr
        self._faulthandler_was_on = faulthandler.is_enabled()
        sys.stderr = open(os.dup(self._saved_fd), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
        faulthandler.enable(file=sys.stderr)  # a crash's tracebacks never wait on the reader
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), name="native-stderr", daemon=True)
        self._thread.start()

    def _pump(self, read_fd: int) -> None:
        with open(read_fd, "rb") as pipe:
            for raw in pipe:
                self.emit(raw.decode("utf-8", "backslashreplace").rstrip("\n"))

    def emit(self, line: str) -> None:
        if not line.strip():
            return
        m = _NATIVE_LINE.fullmatch(line)
        if m is None:
            self.log.warning("%s", line)
        else:
            self.log.log(_NATIVE_LEVELS[m.group(1)], "%s (%s)", m.group(3), m.group(2))

    def close(self, timeout_s: float = 2.0) -> None:
        os.dup2(self._saved_fd, 2)  # the pipe's last writer closes: the reader drains it and ends
        os.close(self._saved_fd)
        self._thread.join(timeout_s)
        if self._faulthandler_was_on:
            faulthandler.enable(file=self._previous)
        else:
            faulthandler.disable()
        stream, sys.stderr = sys.stderr, self._previous
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                handler.setStream(sys.stderr)
        stream.close()


_native: NativeStderr | None = None


def _route_native_stderr() -> None:
    global _native
    _native = NativeStderr()


def routing_native_stderr() -> bool:
    """Whether descriptor 2 is being read into the log (``json`` format)."""
    return _native is not None


def close() -> None:
    """Undo ``configure``'s routing of descriptor 2 (at exit: the lines still in the pipe are logged first)."""
    global _native
    if _native is not None:
        _native.close()
        _native = None
