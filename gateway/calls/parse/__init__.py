"""Model calls in normalized form: what the validate step (5) hands to the rest of the pipeline.

Both inference endpoints produce a :class:`ChatCall`: the responses endpoint is served
by translating to chat completions and back (:mod:`gateway.calls.parse.responses`), so every
parameter in :attr:`ChatCall.params` carries its chat-completions name on both
endpoints, and ``svc.ignored_parameters`` follows from that. Embeddings produce an
:class:`EmbeddingCall`.

Modules:

- :mod:`gateway.calls.parse.chat` — ``parse_chat`` and ``check_capabilities``
- :mod:`gateway.calls.parse.responses` — ``parse_responses``; the translation back
  (``chat_to_response``, ``ResponseStreamTranslator``) lives in
  :mod:`gateway.calls.parse.translate` and is re-exported there
- :mod:`gateway.calls.parse.anthropic_messages` — ``parse_messages`` (Anthropic's Messages API); the
  translation back lives in :mod:`gateway.calls.parse.messages_answer`
- :mod:`gateway.calls.parse.embeddings` — ``parse_embeddings``
- :mod:`gateway.calls.parse.tags` — ``collect_tags`` (step 4)
- :mod:`gateway.calls.parse.fields` — field checks shared by the two inference endpoints

All of it is pure: parsed JSON in, a call or a :class:`~gateway.errors.GatewayError` out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gateway.calls.estimate import (
    BYTES,
    Counter,
    estimate_embedding_tokens,
    estimate_prompt_tokens,
)


@dataclass(frozen=True, slots=True)
class MessagesSource:
    """A ``/v1/messages`` body as the caller sent it (the gateway's own fields taken
    out), passed through to a deployment that serves the Messages API natively instead
    of the translation; ``betas``: the caller's ``anthropic-beta`` values."""

    body: dict[str, Any]
    betas: tuple[str, ...] = ()
    #: a bound of the prompt tokens passed through that the translation drops (earlier
    #: turns' thinking blocks, which Anthropic counts as input in a tool-use loop)
    unsent_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One chat or responses call, in chat-completions terms.

    ``max_tokens`` is the effective output ceiling (the caller's budget, else the key's
    ``caps.max_output_tokens``); it is always sent upstream, so the reservation bounds the
    bill. ``include_usage`` is what the *caller* asked for on a chat stream; upstream is
    always asked for usage.
    """

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    needs: frozenset[str] = frozenset()
    endpoint: Literal["chat", "responses", "messages"] = "chat"
    #: request fields the translation from the endpoint's shape dropped (messages:
    #: thinking, top_k, ...): named in ``svc.ignored_parameters`` with the provider's own
    dropped: tuple[str, ...] = ()
    #: a Messages call's body as sent, for a native passthrough (messages only)
    native: MessagesSource | None = None

    @property
    def output_ceiling(self) -> int:
        return self.max_tokens

    def prompt_estimate(self, count: Counter = BYTES) -> int:
        """A bound of the prompt tokens of :meth:`body` (step 7) and, for a Messages call,
        of its body as sent (one reservation, whichever way it is served)."""
        unsent = self.native.unsent_tokens if self.native is not None else 0
        return estimate_prompt_tokens(self.body(), count=count) + unsent

    def body(self) -> dict[str, Any]:
        """The chat-completions body to forward (``model`` is the public id; providers swap it)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            **self.params,
        }
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass(frozen=True, slots=True)
class EmbeddingCall:
    """One embeddings call; ``inputs`` is a list of strings or a list of token arrays."""

    model: str
    inputs: list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    #: what the walk asks of every parsed call: an embedding is never streamed, needs no
    #: capability, and produces no output tokens
    stream: ClassVar[bool] = False
    needs: ClassVar[frozenset[str]] = frozenset()
    output_ceiling: ClassVar[int] = 0

    def prompt_estimate(self, count: Counter = BYTES) -> int:
        """A bound of the tokens of the inputs (step 7)."""
        return estimate_embedding_tokens(self.inputs, count)
