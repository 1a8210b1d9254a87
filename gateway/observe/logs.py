"""Logging: one handler on stderr, text or JSON lines, and events with named fields.

``[server] log_format = "json"`` writes one JSON object per line: ``ts`` (UTC, ISO 8601),
``level``, ``logger``, ``event``, ``message``, and the event's own fields. An event is a
log call made with ``extra=event("name", field=value, ...)``; any other log line (ours,
Quart's, hypercorn's error log) is the event ``log``. ``"text"`` (the default) writes the
classic ``time level logger: message`` line, with the event's fields appended as
``name=value``.

Every logger of the process goes through the one handler set up by :func:`configure`,
hypercorn's included (its error log is the ``hypercorn.error`` logger; its access log is
replaced by our ``request`` event, see :mod:`gateway.edge.exchange`). Nothing that could hold a
token, a prompt or a completion is ever a field.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

_EVENT = "svc_event"
_FIELDS = "svc_fields"


def event(name: str, **fields: Any) -> dict[str, Any]:
    """The ``extra`` of a log call that is the event ``name`` with ``fields``."""
    return {_EVENT: name, _FIELDS: fields}


def _timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (orjson never writes a newline)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, _EVENT, "log"),
            "message": record.getMessage(),
        }
        line.update(getattr(record, _FIELDS, ()))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``; a traceback on the lines after."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, _FIELDS, None)
        if not fields:
            return text
        head, newline, rest = text.partition("\n")
        pairs = " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)
        return f"{head} {pairs}{newline}{rest}"


def configure(log_format: str, level: str, stream: TextIO | None = None) -> None:
    """Route every logger of the process to one stderr handler in ``log_format``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # neither format writes a record's thread or process: not looked up for each record
    # (a few function calls of every request's line)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    for name in ("hypercorn.error", "hypercorn.access"):
        # hand their lines to the root handler, in the same format
        named = logging.getLogger(name)
        for old in list(named.handlers):
            named.removeHandler(old)
        named.propagate = True
