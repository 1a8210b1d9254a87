"""Small HTTP helpers shared by the routes: JSON answers, body parsing, the request id.

Bodies are read through the request's :class:`~gateway.edge.bodies.BodyGate` (never Quart's
buffer): only a handler that has authenticated the request reads one.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

import orjson
from quart import Response, current_app, g, request
from werkzeug.datastructures import MultiDict

from gateway.accounts.key_record import new_id
from gateway.accounts.usd_json import plain_amounts
from gateway.edge.bodies import gate_of
from gateway.errors import GatewayError
from gateway.store import StoreError

if TYPE_CHECKING:
    from quart import Request

    from gateway.serving.runtime import Runtime


#: output budgets: an integer too large for 64 bits is still an integer, only over any limit
OUTPUT_BUDGETS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
INT64_MAX = 2**63 - 1


def current_request() -> Request:
    """Quart's ``request`` itself, for a function that reads it several times: each read
    through the proxy costs four function calls (werkzeug's ``LocalProxy``)."""
    return cast("Request", cast(Any, request)._get_current_object())


def request_globals() -> Any:
    """Quart's ``g`` itself (its ``_AppCtxGlobals``), as :func:`current_request`."""
    return cast(Any, g)._get_current_object()


def new_request_id() -> str:
    return new_id("req")


def runtime() -> Runtime:
    return cast("Runtime", current_app.config["RUNTIME"])


async def caught_up() -> None:
    """Before a lookup by id answers 404, and before a list: with several nodes (or
    workers behind one port), what it looks for may have been made through another one
    since this one's last change poll; the poll's step runs now (one read of the change
    counter; a reload if it moved), so a client reads its own writes whichever node it
    reaches. A database away leaves what this node holds."""
    cluster = runtime().cluster
    if cluster is not None:
        with contextlib.suppress(StoreError):
            await cluster.catch_up()


def request_id() -> str:
    return cast(str, g.request_id)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return call_answer(plain_amounts(data), status, headers)


def call_answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A model call's answer, written as it is: it holds no USD amount (its svc block
    has none), and walking it for one was a few % of a call's CPU."""
    return Response(
        orjson.dumps(data),
        status=status,
        headers=headers or {},
        content_type="application/json",
    )


#: the deepest nesting orjson writes, so the deepest a body may be
MAX_DEPTH = 255


async def _read_body() -> bytes | bytearray:
    """The whole request body (408, 413, 503 when it cannot be read: gateway/edge/bodies.py),
    read once: callers keep what they parse of it, never the bytes (a 10 MiB body would
    otherwise stay in memory twice for the whole call)."""
    gate = gate_of(request)
    return await gate.read() if gate is not None else b""


#: the raw body, for a route that parses its own wire format (``/mcp``: JSON-RPC)
read_body = _read_body


async def read_form() -> MultiDict[str, str]:
    """A form body (``application/x-www-form-urlencoded``, as the dashboard posts).
    Read once; later calls get the same form."""
    if "form" not in g:
        text = (await _read_body()).decode("utf-8", "replace")
        g.form = MultiDict(parse_qsl(text, keep_blank_values=True))
    return cast("MultiDict[str, str]", g.form)


async def read_json_object(param: str | None = None, *, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or 400 invalid_request (408, 413, 503 when it
    cannot be read: see gateway/edge/bodies.py). Read once; later calls get the same object.
    ``empty_ok``: a body of nothing but whitespace is an empty object."""
    globals_ = request_globals()
    if "body" not in globals_:
        raw = await _read_body()
        globals_.body = {} if empty_ok and not raw.strip() else _json_object(raw, param)
    return cast(dict[str, Any], globals_.body)


def _json_object(raw: bytes | bytearray, param: str | None) -> dict[str, Any]:
    if not raw:
        raise GatewayError("invalid_request", "The request body must be a JSON object.", param)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise GatewayError(
            "invalid_request", "The request body is not valid JSON.", param
        ) from None
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "The request body must be a JSON object.", param)
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        _refuse_too_deep(body, param)
    if any(_beyond_int64(body.get(name)) for name in OUTPUT_BUDGETS):
        # read again, exactly, only then (a scan of every body for long digit runs cost
        # 0.4 s of blocked event loop on a 10 MB body)
        _exact_output_budgets(raw, body)
    return body


def _refuse_too_deep(body: dict[str, Any], param: str | None) -> None:
    """orjson reads 1024 levels of nesting but writes only 255 (MAX_DEPTH): a body
    deeper than that could be read and then never forwarded, hashed or estimated."""
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise GatewayError(
            "invalid_request",
            f"The request body is nested too deeply (at most {MAX_DEPTH} levels).",
            param,
        ) from None


def _beyond_int64(value: Any) -> bool:
    """An output budget orjson read as a number beyond 64 bits (an int up to 2**64, a
    float past that: then only the exact reading says whether it was sent an integer)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > INT64_MAX


def _exact_output_budgets(raw: bytes | bytearray, body: dict[str, Any]) -> None:
    """orjson reads an integer beyond 64 bits as a float, which would make a huge
    ``max_tokens`` "not an integer" instead of "above the key's limit". Such a budget is
    read exactly and held at ``INT64_MAX`` (over every limit, and still serialisable).
    Other huge integers stay floats, as orjson read them."""
    exact = json.loads(raw)
    for name in OUTPUT_BUDGETS:
        value = exact.get(name)
        if type(value) is int and value > INT64_MAX:
            body[name] = INT64_MAX
