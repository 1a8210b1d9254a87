"""Output guardrails on a stream: the upstream's items pass through stream windows
before the endpoint's format writes them.

Items are chat chunks (every provider but a Messages passthrough) or Anthropic's own
events (a passthrough). Each text of the answer has its window: a chat choice's
``delta.content``, ``delta.reasoning_content`` and each tool call's arguments; an
Anthropic content block's ``text``, ``thinking`` or ``partial_json`` deltas. A text's
window is flushed at its end (the choice's ``finish_reason``; the block's
``content_block_stop``), the released rest sent in that item (chat) or in a delta
event just before it (Anthropic). A deny raises :class:`Denied` from :meth:`chunk`:
the pump ends the stream with ``content_blocked``, then reads the upstream on for its
usage (:func:`read_on`). The output webhooks hold the items before they come here
(:mod:`gateway.calls.guardrails.webhook_stream`); :class:`GuardedFormat` reads their
markers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from gateway.calls.guardrails.rules import Guardrail, blocked
from gateway.calls.guardrails.webhook_stream import BLOCK_FIELDS, CHOICE_FIELDS, MARK, NoteVerdict
from gateway.calls.guardrails.window import Denied, StreamWindow
from gateway.errors import GatewayError
from gateway.providers.base import ProviderError, Usage


class OnceNoted:
    """The verdicts of one stream's output guardrails, each guardrail's noted once: its
    first that is not an allow, or an allow at the stream's end."""

    def __init__(self, note: NoteVerdict) -> None:
        self.note = note
        self.noted: set[str] = set()

    def __call__(self, name: str, verdict: str) -> None:
        if name not in self.noted:
            self.noted.add(name)
            self.note(name, verdict)

    def ended(self, rules: Sequence[Guardrail]) -> None:
        """The stream ended: the guardrails that never matched allowed it."""
        for rule in rules:
            self(rule.name, "allow")


class GuardedItems:
    """The windows of one streamed answer, and the rewriting of its items."""

    def __init__(self, rules: Sequence[Guardrail], note: NoteVerdict) -> None:
        self.rules = rules
        self.note = note
        self.windows: dict[tuple[Any, ...], StreamWindow] = {}

    def _window(self, key: tuple[Any, ...]) -> StreamWindow:
        window = self.windows.get(key)
        if window is None:
            window = self.windows[key] = StreamWindow(self.rules)
        return window

    def _pass(self, key: tuple[Any, ...], piece: str, end: bool) -> str:
        window = self._window(key)
        try:
            out = window.feed(piece)
            if end:
                out += window.flush()
                del self.windows[key]
        except Denied as denied:
            self.note(denied.name, "deny")
            raise
        for name, verdict in window.fired.items():
            self.note(name, verdict)
        return out

    # -- chat chunks

    def chat_chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        choices = chunk.get("choices")
        if not choices:
            return chunk
        return {**chunk, "choices": [self._choice(choice) for choice in choices]}

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        index = choice.get("index", 0)
        end = choice.get("finish_reason") is not None
        delta = choice.get("delta") or {}
        out = dict(delta)
        for field in CHOICE_FIELDS:
            piece = delta.get(field)
            if isinstance(piece, str) or (end and (index, field) in self.windows):
                out[field] = self._pass((index, field), piece or "", end)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = [self._tool_call(index, call, end) for call in calls]
        if end:
            # tool calls whose arguments are still held: their rest, in this chunk
            rests = [
                {"index": key[2], "function": {"arguments": self._pass(key, "", True)}}
                for key in list(self.windows)
                if key[0] == index and key[1] == "tool"
            ]
            if rests:
                out["tool_calls"] = [*out.get("tool_calls", []), *rests]
        return {**choice, "delta": out}

    def _tool_call(self, index: Any, call: Any, end: bool) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            return call
        key = (index, "tool", call.get("index", 0))
        arguments = self._pass(key, function["arguments"], end)
        return {**call, "function": {**function, "arguments": arguments}}

    # -- Anthropic events

    def anthropic_events(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            for field in BLOCK_FIELDS:
                piece = delta.get(field)
                if isinstance(piece, str):
                    key = (event.get("index"), field)
                    return [{**event, "delta": {**delta, field: self._pass(key, piece, False)}}]
            return [event]
        if kind == "content_block_stop":
            index = event.get("index")
            flushed = [
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": _DELTA_TYPES[key[1]], key[1]: self._pass(key, "", True)},
                }
                for key in list(self.windows)
                if key[0] == index
            ]
            return [*flushed, event]
        return [event]


_DELTA_TYPES = {
    "text": "text_delta",
    "thinking": "thinking_delta",
    "partial_json": "input_json_delta",
}


class StreamFormat(Protocol):
    """What :class:`GuardedFormat` asks of the format it wraps
    (:class:`gateway.calls.streaming.StreamFormat`)."""

    @property
    def keepalive(self) -> bytes: ...
    def usage(self, item: dict[str, Any]) -> Any: ...
    def output(self, item: dict[str, Any]) -> bool: ...
    def answered(self, item: dict[str, Any]) -> tuple[Any, list[str]]: ...
    def chunk(self, item: dict[str, Any]) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...
    def error(self, error: GatewayError) -> list[bytes]: ...
    def served_by(self, model_id: str) -> None: ...


class GuardedFormat:
    """An endpoint's stream format whose items pass the output guardrails first: the
    detectors' windows (:class:`GuardedItems`), and the markers of the webhooks' holding
    (:mod:`gateway.calls.guardrails.webhook_stream`). A deny is raised as the
    ``content_blocked`` error that ends the stream."""

    def __init__(
        self, inner: StreamFormat, items: GuardedItems, rules: Sequence[Guardrail], note: OnceNoted
    ) -> None:
        self.inner = inner
        self.items = items
        #: every output guardrail of the stream, and where their verdicts go
        self.rules = rules
        self.note = note
        self.keepalive = inner.keepalive
        self.usage = inner.usage
        self.answered = inner.answered
        self.error = inner.error
        self.served_by = inner.served_by

    def output(self, item: dict[str, Any]) -> bool:
        if MARK in item:
            return bool(item[MARK])  # a deny goes on to chunk(); the opening is not output
        return self.inner.output(item)

    def finish(self) -> list[bytes]:
        self.note.ended(self.rules)
        return self.inner.finish()

    def chunk(self, item: dict[str, Any]) -> list[bytes]:
        if MARK in item:
            raise blocked(item[MARK], "output")
        if not self.items.rules:
            return self.inner.chunk(item)
        try:
            if "choices" in item:
                return self.inner.chunk(self.items.chat_chunk(item))
            events = self.items.anthropic_events(item)
        except Denied as denied:
            raise blocked(denied.name, "output") from None
        return [data for event in events for data in self.inner.chunk(event)]


async def read_on(
    items: AsyncIterator[dict[str, Any]],
    usage_of: Callable[[dict[str, Any]], Usage | None],
    usage: Usage | None,
) -> Usage | None:
    """After an output deny: the rest of the upstream read (nothing of it is sent) for
    the usage the provider reports at its end, which settles the call. An upstream that
    fails first leaves the usage reported so far (its error's, if it carries one); the
    call's deadline bounds the reading (the pump's scope), leaving ``usage``."""
    try:
        async for item in items:
            usage = usage_of(item) or usage
    except ProviderError as exc:
        return usage or exc.usage
    return usage
