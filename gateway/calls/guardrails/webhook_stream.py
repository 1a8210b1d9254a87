"""Output ``webhook`` guardrails on a stream: the upstream's items held until the
operator's service has seen their text.

    upstream items ──► held, in order ──► the held texts reach ``stream_chars`` (the
                                          smallest of the webhooks'), or the upstream ends
                   ──► one check (each webhook in turn, as a non-streamed answer's texts)
                   ──► allow: the held items released as they came
                       redact: released carrying the service's texts
                       deny: the :func:`denied` marker, then the held and the remaining
                             items unchecked (the pump reads them only for their usage:
                             after a deny it sends nothing more)

The first item yielded is the :data:`OPENED` marker, as soon as the upstream's first
item came: the attempt got its first byte then (the router's latency and the fallback's
first-byte timeout measure the provider, not the webhook). Both markers are read by
:class:`gateway.calls.guardrails.guarded_stream.GuardedFormat`, which wraps the format of
every stream such an iterator feeds.

The texts are a chat chunk's ``delta.content``, ``delta.reasoning_content`` and tool-call
arguments, an Anthropic ``content_block_delta``'s ``text``, ``thinking`` and
``partial_json``; one text per choice and field (per block and field), the held pieces
joined. A redacted text is carried by the first held item that had a piece of it; the
later ones carry an empty piece.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from gateway.calls.guardrails.rules import Guardrail, Guardrails

#: the key of the markers an iterator of this module yields among the upstream's items
MARK = "svc_guardrail"
#: the upstream's first item came (not part of the answer)
OPENED: dict[str, Any] = {MARK: ""}
#: a text piece's place in an item: (choice index, field) or (choice index, "tool", call
#: index) in a chat chunk; (block index, field) in an Anthropic event
Key = tuple[Any, ...]
#: what a verdict reaches: guardrail, verdict (the direction is ``output``)
NoteVerdict = Callable[[str, str], None]


def denied(name: str) -> dict[str, Any]:
    """The marker of a deny by the guardrail ``name``."""
    return {MARK: name}


class HeldForWebhooks:
    """The webhook guardrails of one stream's answer, and the items they hold."""

    def __init__(self, rules: Sequence[Guardrail], guardrails: Guardrails, note: NoteVerdict):
        self.rules = rules
        self.guardrails = guardrails
        self.note = note
        self.limit = min(rule.config.stream_chars for rule in rules)
        #: held items with their text pieces, and the pieces' length
        self.held: list[tuple[dict[str, Any], list[tuple[Key, str]]]] = []
        self.size = 0

    async def items(self, upstream: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """``upstream``'s items, each released once the webhooks allowed its text."""
        try:
            opened = False
            async for item in upstream:
                if not opened:
                    opened = True
                    yield OPENED
                pieces = texts_of(item)
                self.held.append((item, pieces))
                self.size += sum(len(piece) for _, piece in pieces)
                if self.size < self.limit:
                    continue
                name = await self._check()
                if name is not None:
                    yield denied(name)
                    break
                for released, _ in self._release():
                    yield released
            else:
                name = await self._check()
                if name is not None:
                    yield denied(name)
                for released, _ in self._release():
                    yield released
                return
            # denied: what is left is read only for its usage, never sent
            for held, _ in self._release():
                yield held
            async for item in upstream:
                yield item
        finally:
            aclose = getattr(upstream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _release(self) -> list[tuple[dict[str, Any], list[tuple[Key, str]]]]:
        held, self.held, self.size = self.held, [], 0
        return held

    async def _check(self) -> str | None:
        """The held texts to the webhooks: the guardrail that denied, if one did; a
        redaction rewrites the held items."""
        keys: list[Key] = []
        joined: dict[Key, str] = {}
        for _, pieces in self.held:
            for key, piece in pieces:
                if key not in joined:
                    keys.append(key)
                    joined[key] = ""
                joined[key] += piece
        if not keys:
            return None
        found = [joined[key] for key in keys]
        checked = await self.guardrails.decide(self.rules, "output", found)
        for verdict in checked.verdicts:
            if verdict.verdict != "allow":
                self.note(verdict.guardrail, verdict.verdict)
        if checked.denied is not None:
            return checked.denied
        if checked.texts != found:
            self._rewrite(dict(zip(keys, checked.texts, strict=True)))
        return None

    def _rewrite(self, texts: dict[Key, str]) -> None:
        """Each text's first held piece carries its new text, the later ones nothing."""
        carried: set[Key] = set()
        for i, (item, pieces) in enumerate(self.held):
            if not pieces:
                continue
            new: dict[Key, str] = {}
            for key, _ in pieces:
                new[key] = "" if key in carried else texts[key]
                carried.add(key)
            self.held[i] = (with_texts(item, new), pieces)


def texts_of(item: dict[str, Any]) -> list[tuple[Key, str]]:
    """The text pieces an upstream item carries (a chat chunk or an Anthropic event)."""
    if item.get("type") == "content_block_delta":
        delta = item.get("delta") or {}
        for field in BLOCK_FIELDS:
            piece = delta.get(field)
            if isinstance(piece, str):
                return [((item.get("index"), field), piece)] if piece else []
        return []
    found: list[tuple[Key, str]] = []
    for choice in item.get("choices") or ():
        index = choice.get("index", 0)
        delta = choice.get("delta") or {}
        for field in CHOICE_FIELDS:
            piece = delta.get(field)
            if isinstance(piece, str) and piece:
                found.append(((index, field), piece))
        for call in delta.get("tool_calls") or ():
            arguments = _arguments(call)
            if arguments:
                found.append(((index, "tool", call.get("index", 0)), arguments))
    return found


def with_texts(item: dict[str, Any], texts: dict[Key, str]) -> dict[str, Any]:
    """``item`` carrying ``texts`` in the places :func:`texts_of` found."""
    if item.get("type") == "content_block_delta":
        delta = dict(item.get("delta") or {})
        for (_, field), text in texts.items():
            delta[field] = text
        return {**item, "delta": delta}
    choices = []
    for choice in item.get("choices") or ():
        index = choice.get("index", 0)
        delta = dict(choice.get("delta") or {})
        for field in CHOICE_FIELDS:
            if (index, field) in texts:
                delta[field] = texts[(index, field)]
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [_with_arguments(index, call, texts) for call in calls]
        choices.append({**choice, "delta": delta})
    return {**item, "choices": choices}


CHOICE_FIELDS = ("content", "reasoning_content")
BLOCK_FIELDS = ("text", "thinking", "partial_json")


def _arguments(call: Any) -> str | None:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else None


def _with_arguments(index: Any, call: Any, texts: dict[Key, str]) -> Any:
    key = (index, "tool", call.get("index", 0) if isinstance(call, dict) else 0)
    if key not in texts or _arguments(call) is None:
        return call
    return {**call, "function": {**call["function"], "arguments": texts[key]}}
