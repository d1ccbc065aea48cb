"""Log lines of the daemon: a timestamp, a level, the logger, one line per event.

``text``: ``2026-11-22T09:05:46.123+0000 WARNING kvstore.server.status: refused ...``;
``json``: one object per line (``ts``, ``level``, ``logger``, ``msg``, and
``exc`` for a traceback) for log collectors.  A traceback stays on the
event's line in both (newlines become `` | `` in text), so a collector that
splits on newlines never sees half an event.
"""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")


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


def configure(log_format: str = "text", level: int = logging.INFO) -> None:
    """Route every logger to stderr in ``log_format`` (replacing earlier handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
