"""The walk of one model call, steps 3 to 10 of DESIGN.md, in one module.

    route (HTTP only)                 this module                      the Call (lifecycle.py)
    -----------------                 -----------                      -----------------------
    1-2 authenticate, scope
        read the body
                                      open_call()  3 admit, a slot     ADMITTED
                                      prepare()    4 tags
                                                   5 validate (Endpoint.parse)
                                                   6 entitlements, resolve, capabilities,
                                                     web search
                                                   7 estimate
                                                   8 spend controls, reserve  → RESERVED
                                      complete()   9 ask the provider         → CALLED
                                      embed()     10 settle (Call.finish)     → SETTLED
                                      stream()     9 hand to a pump           → HANDED_OFF
                                                  10 the pump settles         → SETTLED
        answer

What differs between the four endpoints is one row of the table below (:data:`CHAT`,
:data:`RESPONSES`, :data:`MESSAGES`, :data:`EMBEDDINGS`): the scope, the entitlement, the
model kind, how the body is parsed and checked against the model, how the answer is shaped.
:func:`open_call` settles, whatever happens, a call its handler still owns
(:meth:`Call.end`): a refusal, a fault of ours, a client that left (the handler
cancelled: recorded ``cancelled``, 499 ``client_closed``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeVar

import trio

from gateway.accounts.catalog import Model
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.orgs import Org
from gateway.calls import admission, cache
from gateway.calls.attempts import Attempts
from gateway.calls.estimate import Counter, worst_case_tokens
from gateway.calls.guardrails.steps import guard_answer, guard_request, guard_stream
from gateway.calls.inflight import STOPPING_MESSAGE
from gateway.calls.lifecycle import Call, CallParts, CallReport, Hold, finish_reasons
from gateway.calls.parse import ChatCall, EmbeddingCall
from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.calls.parse.chat import capability_param, check_capabilities, parse_chat
from gateway.calls.parse.embeddings import check_dimensions, parse_embeddings
from gateway.calls.parse.messages_answer import MessageStreamTranslator, chat_to_message
from gateway.calls.parse.responses import (
    ResponseStreamTranslator,
    chat_to_response,
    parse_responses,
)
from gateway.calls.parse.tags import collect_tags
from gateway.calls.policy import (
    PolicySource,
    check_entitlements,
    check_model,
    check_spend_controls,
    check_web_search,
    open_deployments,
)
from gateway.calls.provider_errors import map_provider_error
from gateway.calls.routing import Route
from gateway.calls.streaming import (
    ChatFormat,
    EventStream,
    MessagesFormat,
    NativeMessagesFormat,
    PerAttemptFormat,
    ResponsesFormat,
    StreamFormat,
    start_stream,
)
from gateway.calls.tokens import count_prompt
from gateway.errors import GatewayError
from gateway.observe.metrics import CLIENT_CLOSED, CLIENT_CLOSED_STATUS
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    MessagesRequest,
    MessagesResult,
    NativeMessages,
    ProviderError,
    ProviderRequest,
    ProviderResult,
    embedding_response,
    native_messages,
)
from gateway.store.claims import Claim, ClaimHeld

T = TypeVar("T")
#: the refusal of a call without a stream that ran out of time
LATE = "The call ran out of time; retry with stream true."


class Parsed(Protocol):
    """What the walk asks of a parsed body (:class:`ChatCall`, :class:`EmbeddingCall`)."""

    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool: ...
    @property
    def needs(self) -> frozenset[str]: ...
    @property
    def output_ceiling(self) -> int: ...
    def prompt_estimate(self, count: Counter = ...) -> int: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-call endpoint: a row of the table."""

    name: str  # the record's endpoint
    scope: str  # the key scope it needs (step 2)
    feature: str  # the organisation plan's entitlement
    model_kind: str  # the catalog kind it calls
    #: honours the Idempotency-Key header
    idempotent: bool
    #: False: every failure after the provider was asked counts nothing
    failures_count: bool
    #: step 5: the body, validated, for this key
    parse: Callable[[PolicySource, KeyRecord, dict[str, Any]], Any]
    #: step 6, once the model is resolved: what the parsed call asks of it
    check: Callable[[Org | None, Any, Model], None]
    #: a chat completion as this endpoint answers it (chat-shaped endpoints)
    answer: Callable[[Call, ChatCall, dict[str, Any]], dict[str, Any]] | None = None
    #: how this endpoint writes a stream (chat-shaped endpoints)
    stream_format: Callable[[Call, ChatCall, dict[str, Any]], StreamFormat] | None = None
    #: the body's ``metadata`` holds tags (Anthropic's holds only ``user_id``)
    metadata_tags: bool = True


def _parse_chat(_: PolicySource, record: KeyRecord, body: dict[str, Any]) -> ChatCall:
    return parse_chat(body, record.caps.max_output_tokens)


def _parse_responses(_: PolicySource, record: KeyRecord, body: dict[str, Any]) -> ChatCall:
    return parse_responses(body, record.caps.max_output_tokens)


def _parse_messages(_: PolicySource, record: KeyRecord, body: dict[str, Any]) -> ChatCall:
    return parse_messages(body, record.caps.max_output_tokens)


def _parse_embeddings(
    policy: PolicySource, record: KeyRecord, body: dict[str, Any]
) -> EmbeddingCall:
    named = body.get("model")
    if isinstance(named, str) and policy.catalog.get(named) is None:
        # a model that does not exist is 404 model_not_found (decision unknown_model)
        # on every endpoint; 400 model_not_allowed is for a model of the catalog that
        # is not the served embedding model
        check_model(policy, record, named, "embedding")
    served = policy.catalog.embedding_model()
    return parse_embeddings(body, served.id if served else None)


def _check_chat(org: Org | None, chat: ChatCall, model: Model) -> None:
    check_capabilities(chat, model)
    if "web_search" in chat.needs:
        check_web_search(org, model, capability_param(chat, "web_search"))


def _check_embeddings(_: Org | None, call: EmbeddingCall, model: Model) -> None:
    check_dimensions(call, model)


def response_id(call: Call) -> str:
    """The Responses API id of a call: its request id under the resp_ prefix."""
    return "resp_" + call.request_id.removeprefix("req_")


def message_id(call: Call) -> str:
    """The Messages API id of a call: its request id under the msg_ prefix."""
    return "msg_" + call.request_id.removeprefix("req_")


def _chat_shaped(name: str, feature: str, **row: Any) -> Endpoint:
    """A row of an endpoint served as a chat completion."""
    return Endpoint(
        name=name,
        scope="inference",
        feature=feature,
        model_kind="chat",
        idempotent=True,
        failures_count=True,
        check=_check_chat,
        **row,
    )


CHAT = _chat_shaped(
    "chat",
    "chat_completions",
    parse=_parse_chat,
    answer=lambda call, chat, completion: completion,
    # a cache hit holds no model: its replay names the served one (served_by)
    stream_format=lambda call, chat, svc: ChatFormat(
        call.hold.model.id if call.hold else chat.model, chat.include_usage, svc
    ),
)
RESPONSES = _chat_shaped(
    "responses",
    "responses",
    parse=_parse_responses,
    answer=lambda call, chat, completion: chat_to_response(completion, chat, response_id(call)),
    stream_format=lambda call, chat, svc: ResponsesFormat(
        ResponseStreamTranslator(
            chat, response_id(call), created_at=int(call.parts.clock.now()), svc=svc
        )
    ),
)


def _known_input_tokens(call: Call) -> int:
    """A Messages stream's input tokens at its start: the reservation's count, or what a
    cache hit's original was billed for (a hit reserves nothing)."""
    return call.hold.prompt_estimate if call.hold is not None else cache.hit_input_tokens(call)


MESSAGES = _chat_shaped(
    "messages",
    "messages",
    parse=_parse_messages,
    answer=lambda call, chat, completion: chat_to_message(completion, chat, message_id(call)),
    stream_format=lambda call, chat, svc: MessagesFormat(
        MessageStreamTranslator(chat, message_id(call), svc, _known_input_tokens(call))
    ),
    metadata_tags=False,
)
EMBEDDINGS = Endpoint(
    name="embeddings",
    scope="embeddings",
    feature="embeddings",
    model_kind="embedding",
    idempotent=False,
    failures_count=False,
    parse=_parse_embeddings,
    check=_check_embeddings,
)


@asynccontextmanager
async def open_call(
    parts: CallParts,
    record: KeyRecord,
    request_id: str,
    endpoint: Endpoint,
    claim: Claim | None = None,
    report: CallReport | None = None,
) -> AsyncIterator[Call]:
    """Step 3: count the request and take an in-flight slot; the call is settled on the
    way out, whatever happened, unless it settled itself or was handed to a pump.
    ``report`` hears of the call's opening and settlement (the request's line)."""
    admitted = await admission.admit(parts.shards, record, take_slot=True)
    call = Call(
        claim=claim,
        parts=parts,
        record=record,
        request_id=request_id,
        endpoint=endpoint.name,
        admission=admitted,
        started=parts.clock.now(),
        deadline=trio.current_time() + parts.request_timeout_s,
        failures_count=endpoint.failures_count,
        report=report,
    )
    parts.inflight.add(call)
    if report is not None:
        report.opened()
    try:
        yield call
    except trio.Cancelled:
        # the handler was cancelled: the client went away. The provider call is cut;
        # the record says so, settled by the table's row for an ending without usage
        call.client_left()
        await call.end(http_status=CLIENT_CLOSED_STATUS, error_code=CLIENT_CLOSED)
        raise
    except Exception as exc:
        if not isinstance(exc, (GatewayError, ClaimHeld)):
            # a fault of ours (answered 500 internal_error): the record must not say 200
            await call.end(http_status=500, error_code="internal_error")
        raise
    finally:
        await call.end()


async def prepare(
    call: Call,
    endpoint: Endpoint,
    body: dict[str, Any],
    tags_header: str | None,
    cache_control: str | None = None,
) -> Any:
    """Steps 4 to 8: tags, validate, resolve, (the response cache,) estimate, reserve;
    the parsed call (a cache hit reserves nothing)."""
    parts, record = call.parts, call.record
    sent = body if endpoint.metadata_tags else {**body, "metadata": None}
    call.tags = collect_tags(tags_header, sent, record.default_tags, record.required_tags)
    parsed: Parsed = endpoint.parse(parts.policy, record, body)
    call.stream = parsed.stream
    features = [endpoint.feature] + ["streaming"] * parsed.stream + sorted(parsed.needs)
    org = parts.policy.orgs.get(record.org_id)
    check_entitlements(org, record, features)
    model = check_model(parts.policy, record, parsed.model, endpoint.model_kind)
    provider = parts.provider_for(record, model)
    if not open_deployments(parts.policy, record, model):
        raise GatewayError(
            "model_not_allowed",
            f"No deployment of {model.id} may serve this key (the contract's providers,"
            " residency, data mode or provider keys); ask your administrator.",
            param="model",
        )
    endpoint.check(org, parsed, model)
    parsed = await guard_request(call, parsed)  # 5b: a deny holds nothing; redactions sent
    # the response cache (calls/cache.py); a guarded call neither reads nor stores an
    # entry (the answer it would replay or keep is not the one its guardrails passed)
    if parts.cache is not None and not call.guards:
        ticket = await parts.cache.look(call, body, model, parsed.output_ceiling, cache_control)
        if ticket.result == cache.HIT:
            return parsed
    prompt, output = await count_prompt(parsed, model.config), parsed.output_ceiling
    cost = model.cost_nanos(prompt, output)
    check_spend_controls(org, record, cost)
    reservation = await admission.reserve(
        parts.shards,
        record,
        tokens=worst_case_tokens(prompt, output),
        cost=cost,
        org_cost=cost if call.live else 0,
    )
    call.reserved(Hold(model, provider, reservation, prompt, cost))
    return parsed


def _attempts(call: Call, endpoint: Endpoint, parsed: Parsed) -> Attempts:
    """The routes of a reserved call: its model's deployments, then its fallbacks."""
    hold = call.held
    tokens = worst_case_tokens(hold.prompt_estimate, parsed.output_ceiling)
    return Attempts(call, hold.model, tokens, partial(_fallback, call, endpoint, parsed))


async def _fallback(call: Call, endpoint: Endpoint, parsed: Parsed, name: str) -> Model | None:
    """The fallback model ``name`` as this key would call it directly, its worst case
    reserved; None when the key could not call it (every check of steps 6 to 8: catalog,
    allowed models, contract and organisation rules, data mode, BYOK, price, what the
    request needs, its context window) or the reservation cannot be topped up to it. A
    fallback never widens access."""
    parts, record = call.parts, call.record
    org = parts.policy.orgs.get(record.org_id)
    output = parsed.output_ceiling
    try:
        model = check_model(parts.policy, record, name, endpoint.model_kind)
        parts.provider_for(record, model)
        endpoint.check(org, parsed, model)
        # counted with the fallback's own tokenizer: another vocabulary, another bound
        prompt = await count_prompt(parsed, model.config)
        window = model.config.context_window
        if window is not None and prompt + output > window:
            return None
        if not open_deployments(parts.policy, record, model):
            return None
        cost = model.cost_nanos(prompt, output)
        check_spend_controls(org, record, cost)
        await call.top_up(model, cost)
    except GatewayError:
        return None
    call.fallback_from = call.fallback_from or call.held.model.id
    return model


async def _ask(
    call: Call, attempts: Attempts, ask: Callable[[Route], Awaitable[T]], late: str
) -> T:
    """Step 9 without a stream: ask the provider under the call's deadline, over the
    call's routes (``ask`` asks the attempt's: its provider is the call's, its trace the
    call's once the attempt started); a failure is settled here and raised as the
    answer's error."""
    try:
        with call.watch(trio.move_on_after(call.remaining())) as scope:
            result = await attempts.run(ask)
    except ProviderError as exc:
        error, failure = map_provider_error(exc, byok=call.record.byok)
        ending = call.ending(failure=failure, usage=exc.usage)
        await call.finish(ending, usage=exc.usage, http_status=error.status, error_code=error.code)
        raise error from None
    if scope.cancelled_caught and call.cut_short:
        # a graceful stop ran out of grace: the answer is a 503 the client may retry
        await call.finish(call.ending(), http_status=503, error_code="service_unavailable")
        raise GatewayError("service_unavailable", STOPPING_MESSAGE)
    if scope.cancelled_caught:
        await call.finish(call.ending(), http_status=504, error_code="request_timeout")
        raise GatewayError("request_timeout", late)
    return result


def _provider_request(call: Call, chat: ChatCall) -> ProviderRequest:
    """The upstream request of a chat call's attempt under way (its deployment)."""
    hold = call.held
    upstream_id = hold.model.config.upstream_id
    return ProviderRequest(
        upstream_model=upstream_id,
        body={**chat.body(), "model": upstream_id},
        api_key=call.parts.provider_key(call.record, hold.model),
        trace=call.trace,
        request_id=call.request_id,
    )


def _ignored(call: Call, chat: ChatCall) -> list[str]:
    """The parameters of a chat call its provider ignores (the attempt's deployment's)."""
    hold = call.held
    body = {**chat.body(), "model": hold.model.config.upstream_id}
    return [*chat.dropped, *hold.provider.ignored_parameters(body)]


def svc_block(call: Call, ignored: list[str]) -> dict[str, Any]:
    """The svc block of a successful answer; ``fallback_model`` when a fallback served."""
    svc: dict[str, Any] = {"request_id": call.request_id, "ignored_parameters": ignored}
    if call.fallback_from is not None:
        svc["fallback_model"] = call.held.model.id
    return svc


def _native(call: Call, chat: ChatCall) -> tuple[NativeMessages, MessagesRequest] | None:
    """The passthrough of a ``/v1/messages`` call, when the provider of the attempt
    (its deployment's kind: ``anthropic``) serves the Messages API natively; None: the
    call is served by translation. Decided per attempt, on the attempt's provider."""
    provider = native_messages(call.held.provider) if chat.native is not None else None
    if provider is None or chat.native is None:
        return None
    hold = call.held
    request = MessagesRequest(
        body={**chat.native.body, "model": hold.model.config.upstream_id},
        betas=chat.native.betas,
        api_key=call.parts.provider_key(call.record, hold.model),
        trace=call.trace,
    )
    return provider, request


async def _ask_attempt(call: Call, chat: ChatCall) -> ProviderResult | MessagesResult:
    """The attempt under way of a call without a stream: passed through (a Messages call
    on a deployment that speaks the Messages API) or asked as a chat completion."""
    native = _native(call, chat)
    if native is not None:
        provider, request = native
        return await provider.messages(request)
    return await call.held.provider.complete(_provider_request(call, chat))


async def complete(call: Call, endpoint: Endpoint, chat: ChatCall) -> dict[str, Any]:
    """Steps 9-10 of a chat-shaped call without a stream: the answer, settled."""
    assert endpoint.answer is not None
    if cache.is_hit(call):
        return await cache.answer_hit(call, endpoint, chat)
    result = await _ask(
        call, _attempts(call, endpoint, chat), lambda route: _ask_attempt(call, chat), LATE
    )
    checked, refusal = await guard_answer(  # 10a: the answer's texts, before they leave
        call,
        result.message if isinstance(result, MessagesResult) else result.completion,
        passed_through=isinstance(result, MessagesResult),
    )
    if refusal is not None:  # billed on the provider's usage, recorded as blocked
        ending = call.ending(answered=True, usage=result.usage)
        await call.finish(ending, usage=result.usage, http_status=400, error_code=refusal.code)
        raise refusal
    if isinstance(result, MessagesResult):
        return await _relay(call, replace(result, message=checked))
    result = replace(result, completion=checked)
    ignored = _ignored(call, chat)
    cache.keep(call, "completion", result.completion, ignored, call.held.model.id)
    if call.fallback_from is not None:
        chat = replace(chat, model=call.held.model.id)  # the answer names the served model
    if call.attempt is not None:
        completion = result.completion
        call.attempt.answered(completion.get("model"), finish_reasons(completion))
    ending = call.ending(answered=True, usage=result.usage)
    try:
        answer = endpoint.answer(call, chat, {**result.completion, "model": call.held.model.id})
        answer["svc"] = svc_block(call, ignored)
    except Exception:
        # a fault of ours with the answer in hand: settled as the provider's answer
        # says, recorded as the 500 the client gets
        await call.finish(ending, usage=result.usage, http_status=500, error_code="internal_error")
        raise
    await call.finish(ending, usage=result.usage, answer=answer)
    return answer


async def _relay(call: Call, result: MessagesResult) -> dict[str, Any]:
    """Step 10 of a Messages call passed through: the upstream's message as it came
    (its stop sequence, cache usage and any block kind included), under the gateway's
    message id and the public (served) model id, with the svc block; settled from its
    usage."""
    message = result.message
    cache.keep(call, "message", message, [], call.held.model.id)
    if call.attempt is not None:
        reason = message.get("stop_reason")
        call.attempt.answered(message.get("model"), [reason] if isinstance(reason, str) else [])
    answer = {
        **message,
        "id": message_id(call),
        "model": call.held.model.id,
        "svc": svc_block(call, []),
    }
    await call.finish(
        call.ending(answered=True, usage=result.usage), usage=result.usage, answer=answer
    )
    return answer


async def stream(call: Call, endpoint: Endpoint, chat: ChatCall) -> EventStream:
    """Step 9 of a streamed call: hand it to a pump (which settles it), answer the stream."""
    assert endpoint.stream_format is not None
    if cache.is_hit(call):
        return await cache.replay_hit(call, endpoint, chat)
    svc = svc_block(call, _ignored(call, chat))
    translated = endpoint.stream_format(call, chat, svc)
    per_attempt = None
    if chat.native is not None:
        relay = NativeMessagesFormat(message_id(call), call.held.model.id, svc)
        per_attempt = PerAttemptFormat(translated, relay)

    def open_attempt() -> AsyncIterator[dict[str, Any]]:
        # the svc block is sent with the first chunk: it names the attempt's deployment's
        # ignored parameters (none on a passthrough), and the fallback that serves
        native = _native(call, chat)
        svc.update(svc_block(call, [] if native is not None else _ignored(call, chat)))
        if per_attempt is not None:
            per_attempt.passing_through(native is not None)
        if native is not None:
            provider, request = native
            return provider.messages_stream(request)
        return call.held.provider.stream(_provider_request(call, chat))

    fmt = cache.recording(call, per_attempt or translated, svc)
    # 9a: the answer's texts in windows, held for webhooks (never a cached call)
    fmt, opener = guard_stream(call, fmt, open_attempt)
    return await start_stream(call, _attempts(call, endpoint, chat), opener, fmt)


async def embed(call: Call, parsed: EmbeddingCall) -> dict[str, Any]:
    """Steps 9-10 of an embeddings call: the answer, settled."""
    if cache.is_hit(call):
        return await cache.answer_hit(call, EMBEDDINGS, parsed)

    def ask(route: Route) -> Awaitable[EmbeddingResult]:
        hold = call.held
        api_key = call.parts.provider_key(call.record, hold.model)
        return hold.provider.embed(
            EmbeddingRequest(
                hold.model.config.upstream_id, parsed.inputs, parsed.dimensions, api_key, call.trace
            )
        )

    result = await _ask(call, _attempts(call, EMBEDDINGS, parsed), ask, "The call ran out of time.")
    answer = embedding_response(result, call.held.model.id, parsed.encoding_format)
    cache.keep(call, "embedding", answer, [], call.held.model.id)
    await call.finish(call.ending(answered=True, usage=result.usage), usage=result.usage)
    # the svc block of every successful call; no forwarded parameter is ignored here
    # (fields other than model, input, encoding_format, dimensions are not forwarded)
    answer["svc"] = svc_block(call, [])
    return answer
