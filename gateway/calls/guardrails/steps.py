"""The guardrail steps of a model call's walk (gateway/calls/pipeline.py):

    prepare():  5b guard_request   the request's texts, after validation and before any
                                   reservation: a deny refuses the call (no record);
                                   a redaction changes what the provider is sent
    complete(): 10a guard_answer   the answer's texts, before it is shaped: a deny is
                                   answered 400 content_blocked, billed on the usage
    stream():   9a guard_stream    the stream's format wrapped: texts pass windows; the
                                   upstream's items held for the output webhooks

Which guardrails apply: the organisation's policy ``guardrails``, the key's own
``guardrails`` setting and its ancestors' (a sub-key inherits and may add, never remove).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, TypeVar

from gateway.calls.guardrails import texts
from gateway.calls.guardrails.guarded_stream import (
    GuardedFormat,
    GuardedItems,
    OnceNoted,
    StreamFormat,
)
from gateway.calls.guardrails.rules import Guardrail, Verdict, blocked
from gateway.calls.guardrails.webhook_stream import HeldForWebhooks
from gateway.calls.lifecycle import Call
from gateway.calls.parse import ChatCall, EmbeddingCall
from gateway.calls.streaming import OpenStream
from gateway.errors import GatewayError

T = TypeVar("T")
Rewrite = Callable[[texts.Edit], T]


def guards_of(call: Call) -> tuple[Guardrail, ...]:
    """The guardrails of the call's organisation, key and the key's ancestors."""
    parts, record = call.parts, call.record
    org = parts.policy.orgs.get(record.org_id)
    names: list[list[str] | None] = [org.policy.get("guardrails") if org else None]
    names.append(list(record.guardrails))
    parent_id = record.parent_id
    while parent_id is not None:
        parent = parts.policy.keyring.get(parent_id)
        if parent is None:
            break
        names.append(list(parent.guardrails))
        parent_id = parent.parent_id
    return parts.guardrails.of(*names)


def _note(call: Call, verdicts: list[Verdict]) -> None:
    call.verdicts += [v.row() for v in verdicts if v.verdict != "allow"]


async def _guard(call: Call, direction: str, value: T, rewrite: Rewrite[T]) -> tuple[T, str | None]:
    """``value`` checked by the call's guardrails of ``direction``: as it goes on
    (redacted, or itself), and the guardrail that denied it if one did."""
    found = texts.collect(rewrite)
    if not found:
        return value, None
    checked = await call.parts.guardrails.check(call.guards, direction, found)
    _note(call, checked.verdicts)
    if checked.denied is not None:
        return value, checked.denied
    if checked.texts == found:
        return value, None
    return texts.put_back(rewrite, checked.texts), None


def _chat_rewrite(chat: ChatCall) -> Rewrite[ChatCall]:
    def rewrite(edit: texts.Edit) -> ChatCall:
        native = chat.native
        if native is not None:
            native = replace(native, body=texts.anthropic_body(native.body, edit))
        return replace(chat, messages=texts.chat_messages(chat.messages, edit), native=native)

    return rewrite


def _embedding_rewrite(call: EmbeddingCall) -> Rewrite[EmbeddingCall]:
    def rewrite(edit: texts.Edit) -> EmbeddingCall:
        inputs: Any = [edit(item) if isinstance(item, str) else item for item in call.inputs]
        return replace(call, inputs=inputs)

    return rewrite


async def guard_request(call: Call, parsed: T) -> T:
    """Step 5b: the request's texts under the input guardrails; a deny raises
    ``content_blocked`` (the call holds nothing yet: no money, no record)."""
    call.guards = guards_of(call)
    if not any(g.config.applies("input") for g in call.guards):
        return parsed
    rewrite: Any
    if isinstance(parsed, ChatCall):
        rewrite = _chat_rewrite(parsed)
    elif isinstance(parsed, EmbeddingCall):
        rewrite = _embedding_rewrite(parsed)
    else:
        return parsed
    checked, denied = await _guard(call, "input", parsed, rewrite)
    if denied is not None:
        raise blocked(denied, "input")
    return checked


def _applies_to_output(call: Call) -> bool:
    return any(g.config.applies("output") for g in call.guards)


async def guard_answer(
    call: Call, answer: dict[str, Any], passed_through: bool
) -> tuple[dict[str, Any], GatewayError | None]:
    """Step 10a: a chat completion's (or a passed-through Anthropic message's) texts
    under the output guardrails: the answer to shape, and the ``content_blocked``
    refusal of a deny."""
    if not _applies_to_output(call):
        return answer, None
    shape = texts.anthropic_message if passed_through else texts.chat_completion
    checked, denied = await _guard(call, "output", answer, lambda edit: shape(answer, edit))
    return checked, (blocked(denied, "output") if denied is not None else None)


def guard_stream(
    call: Call, fmt: StreamFormat, open_stream: OpenStream
) -> tuple[StreamFormat, OpenStream]:
    """Step 9a: the stream's format, its texts passing the output guardrails' windows
    (the detector kinds), and the opener of each attempt's upstream, whose items the
    output webhooks hold until they allowed their text (:mod:`.webhook_stream`)."""
    rules = tuple(g for g in call.guards if g.config.applies("output"))
    if not rules:
        return fmt, open_stream
    guardrails = call.parts.guardrails
    count = guardrails.count

    def counted(name: str, verdict: str) -> None:
        if verdict != "allow":
            call.verdicts.append(Verdict(name, "output", verdict).row())
        if count is not None:
            count(name, "output", verdict)

    note = OnceNoted(counted)
    detectors = tuple(g for g in rules if g.detect is not None)
    guarded = GuardedFormat(fmt, GuardedItems(detectors, note), rules, note)
    webhooks = tuple(g for g in rules if g.detect is None)
    if not webhooks:
        return guarded, open_stream

    def held_open() -> AsyncIterator[dict[str, Any]]:
        return HeldForWebhooks(webhooks, guardrails, note).items(open_stream())

    return guarded, held_open
