"""A fake Anthropic Messages API: a real HTTP/1.1 server on a loopback port.

It speaks the wire format of Anthropic's API reference (``POST /v1/messages``: the
request body, the ``message`` answer, the stream's ``event:``/``data:`` sequence
message_start, content_block_start, ping, content_block_delta (text_delta,
input_json_delta), content_block_stop, message_delta, message_stop, and ``error``
events; errors as ``{"type": "error", "error": {"type", "message"}}`` with the status of
each error type) and it checks every request as the real API would, answering 400
``invalid_request_error`` (401 ``authentication_error`` for the key) otherwise: so a
translation bug fails the tests. ``rejected`` keeps what it refused, and why.

The answer: the words of :data:`WORDS` up to ``max_tokens`` (a stop sequence among them
ends the text there); with tools offered and no tool result in the last turn, a call of
the forced tool, else of the first one; after tool results, a text that quotes them.
Faults and reports are chosen per request by directives in the messages' text::

    [[fault status=529]]          answer with that status and Anthropic's error body
    [[fault status=429]]          (with a ``retry-after: 7`` header)
    [[fault status=401 echo=X]]   the error message echoes X (``echo=auth``: the x-api-key
                                  received)
    [[fault reset]]               close the connection before any header
    [[fault delay=2.5]]           wait before answering
    [[fault drop_after=2]]        stream 2 text deltas, then cut the connection
    [[fault error_after=1]]       stream 1 text delta, then an ``error`` event
                                  (overloaded_error)
    [[fault error_first]]         an ``error`` event (overloaded_error) before message_start
    [[fault malformed]]           answer 200 with a body that is not JSON
    [[cache read=100 write=50]]   report that many cache-read and cache-write input tokens
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson
import trio

from gateway.fakes.fake_upstream import WORDS, _send, directives, serve_loopback

VERSION = "2023-06-01"
ERROR_TEXT = "anthropic says no: see https://internal.example/v1/x key sk-ant-abcdefgh12345678"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
#: the request's top-level fields the Messages API knows (of 2023-06-01)
FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
    }
)
#: POST /v1/messages/count_tokens: the body of a message without what only shapes output
COUNT_PATH = b"/v1/messages/count_tokens"
NOT_COUNTED = ("max_tokens", "stream", "stop_sequences", "temperature", "top_p", "top_k",
               "metadata", "service_tier")  # fmt: skip
#: fields the API takes only under a beta (``anthropic-beta``), as Claude Code sends them
BETA_FIELDS = {
    "context_management": "context-management-2025-06-27",
    "output_config": "effort-2025-11-24",
}
#: a tool's ``defer_loading`` (tool search) needs this beta
DEFER_LOADING_BETA = "advanced-tool-use-2025-11-20"
#: a ``system`` message inside ``messages`` (mid-conversation system content, as Claude
#: Code sends it) is taken under this beta; the public reference documents user and
#: assistant turns only, so the fake takes it under a beta Claude Code sends with it
MID_SYSTEM_BETA = "mid-conversation-tool-changes-2026-07-01"
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CACHE = re.compile(r"\[\[cache ([^\]]*)\]\]")


class Invalid(Exception):
    """The request is one the real API refuses (status, message)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class FakeAnthropic:
    #: the x-api-key values it accepts
    keys: set[str] = field(default_factory=set)
    url: str = ""
    #: the loopback port to listen on (0: a free one)
    port: int = 0
    calls: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    #: (status, reason) of each request it refused as invalid
    rejected: list[tuple[int, str]] = field(default_factory=list)
    max_words: int = 6
    #: the answer's text as these pieces (one text delta each), instead of the words
    reply: list[str] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[FakeAnthropic]) -> None:
        def started(port: int) -> None:
            self.url = f"http://127.0.0.1:{port}"
            task_status.started(self)

        await serve_loopback(self._answer, started, self.port)

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        self.calls += 1
        headers = {k.decode(): v.decode() for k, v in request.headers}
        self.headers.append(headers)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        self.bodies.append(body if isinstance(body, dict) else {})
        try:
            self._check(request, headers, body)
        except Invalid as exc:
            self.rejected.append((exc.status, str(exc)))
            await _error(conn, stream, exc.status, str(exc))
            return True
        assert isinstance(body, dict)
        faults = directives(body)
        if "delay" in faults:
            await trio.sleep(float(faults["delay"]))
        if "reset" in faults:
            return False
        if "status" in faults:
            status = int(faults["status"])
            message = ERROR_TEXT
            if "echo" in faults:
                echoed = faults["echo"]
                if echoed == "auth":
                    echoed = headers.get("x-api-key", "")
                message = f"invalid x-api-key: {echoed}. Header was {echoed!r}."
            extra = [("retry-after", "7")] if status == 429 else []
            await _error(conn, stream, status, message, extra)
            return True
        if "malformed" in faults:
            await _send(conn, stream, 200, b"<html>upstream proxy page</html>")
            return True
        if request.target == COUNT_PATH:
            counted = {"input_tokens": _usage(body, [])["input_tokens"]}
            await _send(conn, stream, 200, orjson.dumps(counted))
            return True
        blocks, stop_reason, stop_sequence = _content(body, self.max_words)
        if self.reply is not None:
            blocks = [{"type": "text", "text": "".join(self.reply)}]
        usage = _usage(body, blocks)
        if body.get("stream"):
            ending = (stop_reason, stop_sequence)
            return await _stream_answer(
                conn, stream, body, faults, blocks, usage, ending, self.reply
            )
        answer = {
            "id": "msg_fake01",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }
        await _send(conn, stream, 200, orjson.dumps(answer))
        return True

    def _check(self, request: h11.Request, headers: dict[str, str], body: Any) -> None:
        """Refuse what the real API refuses (the checks the gateway's translation must pass)."""
        if request.method != b"POST" or request.target not in (b"/v1/messages", COUNT_PATH):
            raise Invalid(f"Not found: {request.method.decode()} {request.target.decode()}", 404)
        if headers.get("x-api-key") not in self.keys:
            raise Invalid("invalid x-api-key", 401)
        if headers.get("anthropic-version") != VERSION:
            raise Invalid("anthropic-version: header is required")
        if not headers.get("content-type", "").startswith("application/json"):
            raise Invalid("content-type: must be application/json")
        if not isinstance(body, dict):
            raise Invalid("The request body is not valid JSON.")
        betas = {b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()}
        for name in body:
            if name not in FIELDS and BETA_FIELDS.get(name) not in betas:
                raise Invalid(f"{name}: Extra inputs are not permitted")
        if not isinstance(body.get("model"), str):
            raise Invalid("model: Field required")
        if request.target == COUNT_PATH:
            for name in NOT_COUNTED:
                if name in body:
                    raise Invalid(f"{name}: Extra inputs are not permitted")
            _check_system(body.get("system"))
            _check_messages(body.get("messages"), _check_tools(body.get("tools"),
                            body.get("tool_choice"), betas), MID_SYSTEM_BETA in betas)  # fmt: skip
            return
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise Invalid("max_tokens: Field required")
        for name in ("temperature", "top_p"):
            value = body.get(name)
            if value is not None and not (isinstance(value, int | float) and 0 <= value <= 1):
                raise Invalid(f"{name}: Input should be less than or equal to 1")
        stops = body.get("stop_sequences")
        if stops is not None and not (
            isinstance(stops, list) and all(isinstance(s, str) and s.strip() for s in stops)
        ):
            raise Invalid("stop_sequences: each must be a non-whitespace string")
        if "stream" in body and not isinstance(body["stream"], bool):
            raise Invalid("stream: Input should be a valid boolean")
        _check_system(body.get("system"))
        names = _check_tools(body.get("tools"), body.get("tool_choice"), betas)
        _check_messages(body.get("messages"), names, MID_SYSTEM_BETA in betas)


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list) or not all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in system
    ):
        raise Invalid("system: Input should be a valid string or a list of text blocks")


def _check_tools(tools: Any, choice: Any, betas: set[str]) -> set[str]:
    if tools is None:
        if choice is not None:
            raise Invalid("tool_choice: may only be specified while providing tools")
        return set()
    if not isinstance(tools, list):
        raise Invalid("tools: Input should be a valid list")
    names: set[str] = set()
    known = {"name", "description", "input_schema", "cache_control"}
    if DEFER_LOADING_BETA in betas:
        known.add("defer_loading")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not set(tool) <= known:
            raise Invalid(f"tools.{index}: Extra inputs are not permitted")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name) or name in names:
            raise Invalid(f"tools.{index}.name: String should match pattern")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise Invalid(f"tools.{index}.input_schema.type: Input should be 'object'")
        names.add(name)
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in (
            "auto",
            "any",
            "tool",
            "none",
        ):
            raise Invalid("tool_choice: Input tag does not match any of the expected tags")
        if not set(choice) <= {"type", "name", "disable_parallel_tool_use"}:
            raise Invalid("tool_choice: Extra inputs are not permitted")
        if choice["type"] == "tool" and choice.get("name") not in names:
            raise Invalid("tool_choice.name: no tool of that name")
    return names


def _check_messages(messages: Any, tools: set[str], mid_system: bool) -> None:
    if not isinstance(messages, list) or not messages:
        raise Invalid("messages: at least one message is required")
    if mid_system:
        # system content after the first turn: text blocks, out of the alternation
        later = [m for m in messages[1:] if isinstance(m, dict) and m.get("role") == "system"]
        for message in later:
            if set(message) != {"role", "content"}:
                raise Invalid("messages: role and content, and nothing else")
            _check_system(message["content"])
        messages = [m for m in messages if not any(m is s for s in later)]
    pending: set[str] = set()  # tool_use ids of the last assistant turn, unanswered
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise Invalid(f"messages.{index}: role and content, and nothing else")
        role = message["role"]
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise Invalid(
                f"messages.{index}.role: roles must alternate between user and assistant, "
                "starting with user"
            )
        content = message["content"]
        if isinstance(content, str):
            if not content and index < len(messages) - 1:
                raise Invalid(f"messages.{index}: content must be non-empty")
            blocks: list[Any] = []
        elif isinstance(content, list) and content:
            blocks = content
        else:
            raise Invalid(f"messages.{index}.content: a string or a non-empty list of blocks")
        answered = {b.get("tool_use_id") for b in blocks if isinstance(b, dict)}
        if role == "user" and pending and not pending <= answered:
            raise Invalid(
                f"messages.{index}: tool_use ids were found without tool_result blocks "
                f"immediately after: {sorted(pending - answered)}"
            )
        pending_now: set[str] = set()
        for position, block in enumerate(blocks):
            where = f"messages.{index}.content.{position}"
            _check_block(block, role, where, pending, tools)
            if block["type"] == "tool_use":
                pending_now.add(block["id"])
        pending = pending_now


def _check_block(block: Any, role: str, where: str, pending: set[str], tools: set[str]) -> None:
    if not isinstance(block, dict):
        raise Invalid(f"{where}: Input should be an object")
    kind = block.get("type")
    allowed = {
        "text": {"type", "text", "cache_control"},
        "image": {"type", "source", "cache_control"},
        "tool_use": {"type", "id", "name", "input", "cache_control"},
        "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    }
    if kind not in allowed or not set(block) <= allowed[kind]:
        raise Invalid(f"{where}: Input tag {kind!r} or its fields are not expected")
    if kind == "text" and not (isinstance(block.get("text"), str) and block["text"]):
        raise Invalid(f"{where}.text: text content blocks must be non-empty")
    if kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64":
            if source.get("media_type") not in IMAGE_TYPES or not source.get("data"):
                raise Invalid(f"{where}.source: a base64 source needs media_type and data")
        elif source.get("type") != "url" or not str(source.get("url", "")).startswith("http"):
            raise Invalid(f"{where}.source: Input tag does not match base64 or url")
    if kind == "tool_use":
        if role != "assistant":
            raise Invalid(f"{where}: tool_use blocks only in assistant messages")
        if not isinstance(block.get("id"), str) or not isinstance(block.get("input"), dict):
            raise Invalid(f"{where}: tool_use needs an id and an object input")
        if block.get("name") not in tools:
            raise Invalid(f"{where}.name: Requests which include tool_use blocks must define tools")
    if kind == "tool_result":
        if role != "user":
            raise Invalid(f"{where}: tool_result blocks only in user messages")
        if block.get("tool_use_id") not in pending:
            raise Invalid(
                f"{where}: unexpected tool_use_id found in tool_result blocks: "
                f"{block.get('tool_use_id')}. Each tool_result block must have a "
                "corresponding tool_use block in the previous message."
            )


def _text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return " ".join(str(b.get("text") or "") for b in content if b.get("type") == "text")


def _content(body: dict[str, Any], max_words: int) -> tuple[list[dict[str, Any]], str, Any]:
    """The answer's content blocks, its stop_reason and stop_sequence."""
    last = body["messages"][-1]
    results = (
        [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        if isinstance(last["content"], list)
        else []
    )
    tools = body.get("tools") or []
    choice = body.get("tool_choice") or {"type": "auto"}
    if tools and not results and choice["type"] != "none":
        tool = next((t for t in tools if t["name"] == choice.get("name")), tools[0])
        call = {
            "type": "tool_use",
            "id": f"toolu_{len(body['messages']):02d}fake",
            "name": tool["name"],
            "input": _value(tool["input_schema"]),
        }
        return [call], "tool_use", None
    limit = min(body["max_tokens"], max_words)
    words = [WORDS[i % len(WORDS)] for i in range(limit)]
    stop_reason, stop_sequence = (
        ("max_tokens" if body["max_tokens"] < max_words else "end_turn"),
        None,
    )
    for stop in body.get("stop_sequences") or []:
        if stop in words:
            words = words[: words.index(stop)]
            stop_reason, stop_sequence = "stop_sequence", stop
            break
    text = " ".join(words)
    if results:
        quoted = " ".join(str(r.get("content")) for r in results)
        text = f"the tool said {quoted}"
    return [{"type": "text", "text": text}], stop_reason, stop_sequence


def _value(schema: Any) -> Any:
    """A value of a (simple) JSON schema: every property, required or not."""
    if not isinstance(schema, dict):
        return "alpha"
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _value(sub) for name, sub in properties.items()}
    if "enum" in schema:
        return schema["enum"][0]
    return {"integer": 7, "number": 1.5, "boolean": True, "array": [], "null": None}.get(
        str(kind), "alpha"
    )


def _usage(body: dict[str, Any], blocks: list[dict[str, Any]]) -> dict[str, int]:
    """input_tokens: the words of the messages (at most the gateway's byte-based estimate);
    output_tokens: the words of the answer; cache tokens as the directive says."""
    cache: dict[str, str] = {}
    for message in body["messages"]:
        for match in _CACHE.finditer(_text_of(message)):
            cache.update(item.partition("=")[::2] for item in match.group(1).split())
    output = sum(len(orjson.dumps(b.get("input") or b.get("text") or "").split()) for b in blocks)
    return {
        "input_tokens": max(1, len(orjson.dumps(body["messages"]).decode().split())),
        "output_tokens": max(1, output),
        "cache_creation_input_tokens": int(cache.get("write", 0)),
        "cache_read_input_tokens": int(cache.get("read", 0)),
    }


async def _error(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    message: str,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    error = {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
        "request_id": "req_fake01",
    }
    data = orjson.dumps(error)
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    headers += extra or []
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=data)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def _event(conn: h11.Connection, stream: trio.SocketStream, event: dict[str, Any]) -> None:
    frame = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
    await stream.send_all(conn.send(h11.Data(data=frame)))


async def _stream_answer(
    conn: h11.Connection,
    stream: trio.SocketStream,
    body: dict[str, Any],
    faults: dict[str, str],
    blocks: list[dict[str, Any]],
    usage: dict[str, int],
    ending: tuple[str, Any],
    reply: list[str] | None = None,
) -> bool:
    head = h11.Response(
        status_code=200,
        headers=[("content-type", "text/event-stream"), ("transfer-encoding", "chunked")],
    )
    await stream.send_all(conn.send(head))
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": ERROR_TEXT}}
    if "error_first" in faults:
        await _event(conn, stream, overloaded)
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True
    start_usage = {**usage, "output_tokens": 1}
    message = {
        "id": "msg_fake01",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    await _event(conn, stream, {"type": "message_start", "message": message})
    deltas = 0
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            await _event(
                conn,
                stream,
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            await _event(conn, stream, {"type": "ping"})
            words = block["text"].split(" ")
            pieces = [(" " if i else "") + word for i, word in enumerate(words)]
            pieces = reply if reply is not None else pieces
            delta_kind, field_name = "text_delta", "text"
        else:
            start = {**block, "input": {}}
            await _event(
                conn,
                stream,
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            encoded = orjson.dumps(block["input"]).decode()
            cut = len(encoded) // 2
            pieces = ["", encoded[:cut], encoded[cut:]]  # an empty first fragment, as the API sends
            delta_kind, field_name = "input_json_delta", "partial_json"
        for piece in pieces:
            if "drop_after" in faults and deltas >= int(faults["drop_after"]):
                return False
            if "error_after" in faults and deltas >= int(faults["error_after"]):
                await _event(conn, stream, overloaded)
                await stream.send_all(conn.send(h11.EndOfMessage()))
                return True
            delta = {"type": delta_kind, field_name: piece}
            await _event(
                conn, stream, {"type": "content_block_delta", "index": index, "delta": delta}
            )
            deltas += 1
        await _event(conn, stream, {"type": "content_block_stop", "index": index})
    final = {
        "type": "message_delta",
        "delta": {"stop_reason": ending[0], "stop_sequence": ending[1]},
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    await _event(conn, stream, final)
    await _event(conn, stream, {"type": "message_stop"})
    await stream.send_all(conn.send(h11.EndOfMessage()))
    return True
