"""The stream window: output guardrails over a text that arrives in pieces.

One window per text of an answer (a choice's content, a tool call's arguments, a content
block). Each piece is appended to what is held, the detectors run over the held text,
and what may leave is released:

- a deny match anywhere in the held text ends the stream (:class:`Denied`) before any
  of its characters left;
- a match that reaches the end of the held text may still grow: the text from its start
  is held;
- otherwise only the last ``hold`` characters are held (the longest text before any
  detector can see a match: an email's local part before its ``@``), and matches that
  start before that point are released redacted (a redaction across two pieces is one
  redaction).

So the added wait before a character leaves is the time the model takes to write
``hold`` more characters (72 for ``pii``, 64 for ``secrets``); :meth:`StreamWindow.flush`
releases the rest at the end of the text. Nothing held is kept after the stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.calls.guardrails.detectors import Match, redact
from gateway.calls.guardrails.rules import Guardrail

#: a match ending this close to the end of the held text may still grow
GROWING = 2
#: held text beyond this is released whatever grows (a private key block's body is ~3 KB)
MAX_HELD = 16_384


class Denied(Exception):
    """A deny guardrail matched held text (which therefore never leaves)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class StreamWindow:
    """One text of an answer under the detector guardrails ``rules`` (webhooks excluded)."""

    __slots__ = ("fired", "held", "hold", "rules")

    def __init__(self, rules: Sequence[Guardrail]) -> None:
        self.rules = rules
        self.hold = max((rule.hold for rule in rules), default=0)
        self.held = ""
        #: the guardrails that matched (redacted or flagged) so far, by name
        self.fired: dict[str, str] = {}

    def feed(self, piece: str) -> str:
        """Take ``piece``; the text that may leave now (Denied: a deny matched)."""
        self.held += piece
        return self._release(final=len(self.held) > MAX_HELD)

    def flush(self) -> str:
        """The end of the text: the rest, redacted (Denied: a deny matched)."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self.held
        if not text:
            return ""
        cut = len(text) if final else max(0, len(text) - self.hold)
        redacting: list[Match] = []
        for rule in self.rules:
            assert rule.detect is not None
            matches = rule.detect(text)
            if not matches:
                continue
            action = rule.config.action
            if action == "deny":
                raise Denied(rule.name)
            self.fired.setdefault(rule.name, action)
            if action == "redact":
                redacting += matches
        done: list[Match] = []
        growing_from = len(text)
        for match in sorted(redacting, key=lambda m: m.start):
            if not final and match.end >= len(text) - GROWING:
                growing_from = min(growing_from, match.start)
            elif not done or match.start >= done[-1].end:
                done.append(match)
        cut = min(cut, growing_from)
        # a match that starts before the cut leaves whole, redacted
        released = [m for m in done if m.start < cut]
        if released:
            cut = max(cut, released[-1].end)
        self.held = text[cut:]
        return redact(text[:cut], released)
