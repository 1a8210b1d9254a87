"""The walk of one MCP ``tools/call``: the model call's steps, for a tool.

    route (HTTP only)                  this module                         the Call (lifecycle.py)
    -----------------                  -----------                         -----------------------
    1-2 authenticate, scope
        read the body; the JSON-RPC
        message (protocol.py)
                                       call_tool()  3 admit, a slot       ADMITTED
                                                    4 tags (X-Svc-Tags)
                                                    5 validate: name, arguments
                                                    6 resolve: a tool of a server the key
                                                      reaches; org_blocked_tools,
                                                      allowed_tools (tool_catalog.py)
                                                    7 price: the tool's usd_per_call
                                                    8 spend controls, reserve  → RESERVED
                                                    9 the pending row; ask the upstream
                                                      under its timeout_s      → CALLED
                                                   10 settle (Call.finish)     → SETTLED
        answer

Admission, reservation and settlement are the model call's own
(:func:`gateway.calls.pipeline.open_call`, :func:`gateway.calls.admission.reserve`,
:meth:`gateway.calls.lifecycle.Call.finish`): a tool is held as a "model" whose id is its
full name, priced per call. Step 10 by outcome (the settlement table's rows):

    the upstream answered (an isError result too)        PRICED_CALL: its price, billed (live)
    the upstream could not be reached                    PROVIDER_REFUSED: nothing
    timed out, connection lost, an answer not MCP        FULL_RESERVATION: the price counts
                                                         against the caps, billed 0
    refused by the gateway (steps 3-8)                   NOT_CALLED: nothing, no record

A zero_retention key's arguments and results are kept and logged nowhere: none are, for
any key (the record holds the tool's name, cost, status and latency).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.accounts.catalog import Model, usd_to_nanos
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.orgs import Org
from gateway.calls import admission, pipeline
from gateway.calls.lifecycle import CallParts, CallReport, Hold
from gateway.calls.parse.tags import collect_tags
from gateway.calls.policy import check_spend_controls
from gateway.calls.settlement import Ending
from gateway.config.settings import ModelConfig
from gateway.errors import GatewayError
from gateway.providers.base import Provider
from gateway.tools.protocol import failed_call
from gateway.tools.tool_catalog import ResolvedTool, ToolCatalog
from gateway.tools.upstream import UpstreamFailure
from shards import Admission


class ToolCounter(Protocol):
    def tool_called(self, server: str, tool: str, code: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ToolParts:
    """What a tool call uses of the server: a model call's parts, the tools, the count."""

    calls: CallParts
    catalog: ToolCatalog
    metrics: ToolCounter
    #: a Hold names a model provider; a tool call asks none and holds this one, unasked
    unasked: Provider


def _parse(_: Any, record: KeyRecord, params: dict[str, Any]) -> dict[str, Any]:
    """Step 5: the ``tools/call`` params the SDK's schema let through, checked again."""
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise GatewayError("invalid_request", "arguments must be an object.", param="arguments")
    return params


def _no_model_check(org: Org | None, call: Any, model: Model) -> None:
    """A tool has no model capabilities to check."""


#: the endpoint row of a tool call (the record's ``endpoint``; every failure counts)
TOOL_CALLS = pipeline.Endpoint(
    name="mcp",
    scope="inference",
    feature="tools",
    model_kind="tool",
    idempotent=False,
    failures_count=True,
    parse=_parse,
    check=_no_model_check,
)


def tool_model(tool: ResolvedTool) -> Model:
    """The tool as the call holds it: a "model" named for the tool, its server the provider."""
    return Model(
        ModelConfig(id=tool.name, provider=tool.link.name, upstream_id=tool.name, kind="tool")
    )


async def call_tool(
    parts: ToolParts,
    record: KeyRecord,
    request_id: str,
    params: dict[str, Any],
    tags_header: str | None,
    report: CallReport | None = None,
    admitted: Callable[[Admission], None] | None = None,
) -> dict[str, Any]:
    """Steps 3 to 10 of a ``tools/call``: the result to answer (an upstream's failure is
    an ``isError`` result); a refusal raises its GatewayError. ``admitted`` is given the
    admission of step 3 (the route's rate-limit headers)."""
    calls = parts.calls
    org = calls.policy.orgs.get(record.org_id)
    name = str(params.get("name"))
    counted: tuple[str, str] | None = None
    code = "ok"
    try:
        async with pipeline.open_call(calls, record, request_id, TOOL_CALLS, None, report) as call:
            if admitted is not None:
                admitted(call.admission)
            call.tags = collect_tags(tags_header, None, record.default_tags, record.required_tags)
            TOOL_CALLS.parse(calls.policy, record, params)
            tool = parts.catalog.resolve(record, org, name)
            counted = (tool.link.name, tool.tool)
            cost = usd_to_nanos(tool.usd)
            check_spend_controls(org, record, cost)
            reservation = await admission.reserve(
                calls.shards, record, tokens=0, cost=cost, org_cost=cost if call.live else 0
            )
            call.reserved(Hold(tool_model(tool), parts.unasked, reservation, 0, cost))
            await call.start_provider_call()
            try:
                answer = await tool.link.call(tool.tool, _arguments(params))
            except UpstreamFailure as failure:
                code = "upstream_unreachable" if not failure.reached else "upstream_failed"
                ending = Ending.FULL_RESERVATION if failure.reached else Ending.PROVIDER_REFUSED
                await call.finish(ending, error_code="service_unavailable")
                return failed_call(str(failure))
            if answer.get("isError"):
                code = "tool_error"
            await call.finish(Ending.PRICED_CALL)
            return answer
    except GatewayError as refused:
        code = refused.code
        raise
    finally:
        if counted is not None:
            parts.metrics.tool_called(*counted, code)


def _arguments(params: Mapping[str, Any]) -> dict[str, Any] | None:
    arguments = params.get("arguments")
    return dict(arguments) if isinstance(arguments, dict) else None
