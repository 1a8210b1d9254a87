"""A streamed miss's upstream items, kept as the pump reads them, to store once the
stream completed (its entry: chat chunks, or Anthropic's events on a passthrough)."""

from __future__ import annotations

from typing import Any

from gateway.calls.streaming import PerAttemptFormat, StreamFormat
from gateway.errors import GatewayError
from gateway.providers.base import Usage


class Recording:
    """A stream format that keeps every upstream item of a miss (the pump reads each
    one's usage first), to store once the stream completed."""

    def __init__(self, fmt: StreamFormat, svc: dict[str, Any]) -> None:
        self.fmt = fmt
        self.keepalive = fmt.keepalive
        self.svc = svc
        self.items: list[dict[str, Any]] = []

    def entry(self, model: str) -> dict[str, Any]:
        """What the stream read, as an entry: Anthropic's events when the attempt that
        served passed the call through, else chat chunks."""
        fmt = self.fmt
        native = isinstance(fmt, PerAttemptFormat) and fmt.current is fmt.native
        form = "events" if native else "chunks"
        ignored = self.svc.get("ignored_parameters", [])
        return {"form": form, form: self.items, "ignored": ignored, "model": model}

    def usage(self, item: dict[str, Any]) -> Usage | None:
        self.items.append(item)
        return self.fmt.usage(item)

    def output(self, item: dict[str, Any]) -> bool:
        return self.fmt.output(item)

    def answered(self, item: dict[str, Any]) -> tuple[Any, list[str]]:
        return self.fmt.answered(item)

    def chunk(self, item: dict[str, Any]) -> list[bytes]:
        return self.fmt.chunk(item)

    def finish(self) -> list[bytes]:
        return self.fmt.finish()

    def error(self, error: GatewayError) -> list[bytes]:
        return self.fmt.error(error)

    def served_by(self, model_id: str) -> None:
        self.fmt.served_by(model_id)
