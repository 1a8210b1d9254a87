"""A fake Gemini API: a real HTTP/1.1 server on a loopback port speaking Gemini's wire format.

Shapes from Google's API reference (v1beta): ``models/{model}:generateContent`` answers a
``GenerateContentResponse`` (``candidates[].content.parts``, ``finishReason``,
``usageMetadata`` with ``promptTokenCount`` counting ``cachedContentTokenCount``,
``candidatesTokenCount``, ``thoughtsTokenCount``, ``totalTokenCount``, ``modelVersion``,
``responseId``); ``:streamGenerateContent?alt=sse`` the same objects as ``data:`` events
ended by CRLF CRLF, each with the usage so far, the stream ended by the body's end (no
``[DONE]``); ``:batchEmbedContents`` ``{"embeddings": [{"values": [...]}]}``; errors
``{"error": {"code", "message", "status", "details"}}``.

Every request is VALIDATED as the real API would, and refused 400 INVALID_ARGUMENT
otherwise, so a translation bug fails the tests (``refusals`` keeps why):
``x-goog-api-key`` equal to the key it was given; known top-level fields only; contents
of roles user/model that alternate, parts of one known kind each; a functionCall only
from the model, with the thoughtSignature the fake gave it (as Gemini 3 wants), a
functionResponse only from the user right after the model's turn that
called that function (as many responses as calls); ``generationConfig`` of known
fields; schemas (tool parameters, responseSchema) of Gemini's subset only, upper-case
types, an object's properties non-empty; ``toolConfig`` modes.

Directives in the last user turn's text choose faults and reports, per request::

    [[fault status=429]]          that status, Gemini's error body (429: RetryInfo 7s)
    [[fault status=400 echo=key]] the message echoes the key received (or echo=X: X)
    [[fault reset]]               close the connection before any header
    [[fault delay=2.5]]           wait before answering
    [[fault drop_after=2]]        stream 2 events, then cut the connection
    [[fault error_after=2]]       stream 2 events, then an error event, then end
    [[fault no_usage]]            report no usageMetadata
    [[fault cached=N]]            report N cached tokens (cachedContentTokenCount)
    [[fault thoughts=N]]          report N thinking tokens (thoughtsTokenCount)
    [[fault finish=SAFETY]]       end with that finishReason
    [[fault malformed]]           answer 200 with a body that is not JSON
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson
import trio

from gateway.fakes.fake_upstream import WORDS, _send, serve_loopback
from gateway.providers.gemini.gemini_schema import SCHEMA_FIELDS as SCHEMA
from gateway.providers.gemini.gemini_schema import TYPES

_DIRECTIVE = re.compile(r"\[\[fault ([^\]]*)\]\]")
TOP_LEVEL = frozenset(
    {
        "contents",
        "tools",
        "toolConfig",
        "safetySettings",
        "systemInstruction",
        "generationConfig",
        "cachedContent",
    }
)
GENERATION_CONFIG = frozenset(
    {
        "stopSequences",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "candidateCount",
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseLogprobs",
        "logprobs",
        "thinkingConfig",
    }
)
PART_KINDS = frozenset({"text", "inlineData", "fileData", "functionCall", "functionResponse"})
FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,63}$")
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
ERROR_TEXT = "Gemini says no: see https://internal.example/v1beta/x key AIzaSyA1b2C3d4E5f6G7h8I9j0"
MODEL_VERSION = "gemini-fake-001"
#: the thought signature of the fake's function calls, wanted back with each call
SIGNATURE = "c2lnbmVkIGJ5IHRoZSBmYWtl"
#: a 1x1 PNG as a data URL, and a function tool (with members Gemini's schemas refuse)
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "city": {"type": "string", "format": "email"},
                "unit": {"type": ["string", "null"], "enum": ["c", "f"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


class Invalid(ValueError):
    """What the real API would refuse with 400 INVALID_ARGUMENT."""


def error_body(status: int, message: str) -> dict[str, Any]:
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": STATUS_NAMES.get(status, "UNKNOWN"),
    }
    if status == 429:
        error["details"] = [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}
        ]
    return {"error": error}


def directives(body: dict[str, Any]) -> dict[str, str]:
    """The directives of the last user turn's text parts."""
    found: dict[str, str] = {}
    users = [c for c in body.get("contents") or [] if c.get("role") == "user"]
    texts = [p.get("text", "") for p in (users[-1]["parts"] if users else []) if "text" in p]
    for text in texts:
        for match in _DIRECTIVE.finditer(text):
            for item in match.group(1).split():
                name, _, value = item.partition("=")
                found[name] = value
    return found


def prompt_tokens(body: dict[str, Any]) -> int:
    """Words of the contents and system instruction: at most the gateway's estimate."""
    text = orjson.dumps([body.get("systemInstruction"), body.get("contents")]).decode()
    return max(1, len(text.split()))


@dataclass
class FakeGemini:
    key: str
    url: str = ""
    #: the loopback port to listen on (0: a free one)
    port: int = 0
    calls: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    #: why each refused request was refused (a translation bug shows here)
    refusals: list[str] = field(default_factory=list)
    max_words: int = 6
    #: the answer's text as these pieces (one stream event each), instead of the words
    reply: list[str] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[FakeGemini]) -> None:
        def started(port: int) -> None:
            self.url = f"http://127.0.0.1:{port}"
            task_status.started(self)

        await serve_loopback(self._reply, started, self.port)

    async def _reply(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        self.calls += 1
        path = request.target.decode()
        self.paths.append(path)
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        key = headers.get("x-goog-api-key")
        self.keys.append(key)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return await self._refuse(conn, stream, "Invalid JSON payload received.")
        self.bodies.append(body)
        match = re.fullmatch(
            r"/v1beta/models/([\w.\-]+):(generateContent|streamGenerateContent\?alt=sse|"
            r"batchEmbedContents)",
            path,
        )
        if match is None:
            await _send(conn, stream, 404, orjson.dumps(error_body(404, f"No route {path}")))
            return True
        model, method = match.groups()
        faults = directives(body) if method != "batchEmbedContents" else {}
        if "status" in faults:
            status = int(faults["status"])
            message = ERROR_TEXT
            if "echo" in faults:
                echoed = key or "" if faults["echo"] == "key" else faults["echo"]
                message = f"API key not valid. Please pass a valid API key. Got {echoed!r}."
            await _send(conn, stream, status, orjson.dumps(error_body(status, message)))
            return True
        if key != self.key:
            return await self._refuse(
                conn, stream, "API key not valid. Please pass a valid API key."
            )
        try:
            if method == "batchEmbedContents":
                _check_embeddings(body, model)
            else:
                _check_generate(body)
        except Invalid as exc:
            return await self._refuse(conn, stream, str(exc))
        if "delay" in faults:
            await trio.sleep(float(faults["delay"]))
        if "reset" in faults:
            return False
        if "malformed" in faults:
            await _send(conn, stream, 200, b"<html>upstream proxy page</html>")
            return True
        if method == "batchEmbedContents":
            return await self._embed(conn, stream, body)
        events = _answer(body, faults, self.max_words, self.reply)
        if method == "generateContent":
            await _send(conn, stream, 200, orjson.dumps(_whole(events)))
            return True
        return await self._stream(conn, stream, events, faults)

    async def _refuse(self, conn: h11.Connection, stream: trio.SocketStream, why: str) -> bool:
        self.refusals.append(why)
        await _send(conn, stream, 400, orjson.dumps(error_body(400, why)))
        return True

    async def _stream(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        events: list[dict[str, Any]],
        faults: dict[str, str],
    ) -> bool:
        head = h11.Response(
            status_code=200,
            headers=[("content-type", "text/event-stream"), ("transfer-encoding", "chunked")],
        )
        await stream.send_all(conn.send(head))
        for index, event in enumerate(events):
            if "drop_after" in faults and index >= int(faults["drop_after"]):
                return False
            if "error_after" in faults and index >= int(faults["error_after"]):
                error = error_body(500, ERROR_TEXT)
                await stream.send_all(conn.send(h11.Data(data=_sse(error))))
                break
            await stream.send_all(conn.send(h11.Data(data=_sse(event))))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True

    async def _embed(
        self, conn: h11.Connection, stream: trio.SocketStream, body: dict[str, Any]
    ) -> bool:
        embeddings = []
        for item in body["requests"]:
            size = int(item.get("outputDimensionality") or 4)
            embeddings.append({"values": [1.0] + [0.0] * (size - 1)})
        await _send(conn, stream, 200, orjson.dumps({"embeddings": embeddings}))
        return True


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\r\n\r\n"


# -- validation, as the real API refuses ------------------------------------------------


def _check_generate(body: dict[str, Any]) -> None:
    unknown = set(body) - TOP_LEVEL
    if unknown:
        raise Invalid(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}"')
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Invalid("* GenerateContentRequest.contents: contents is not specified")
    declared = _check_tools(body.get("tools"))
    previous: dict[str, Any] | None = None
    for index, content in enumerate(contents):
        role = content.get("role")
        if role not in ("user", "model"):
            raise Invalid(f"contents[{index}].role: Please use a valid role: user, model.")
        if previous is not None and previous["role"] == role:
            raise Invalid("Please ensure that multiturn requests alternate between user and model.")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise Invalid(f"contents[{index}].parts: must not be empty")
        for part in parts:
            _check_part(part, role, index, declared)
        responses = [p["functionResponse"]["name"] for p in parts if "functionResponse" in p]
        if responses:
            calls = [
                p["functionCall"]["name"]
                for p in (previous or {}).get("parts", [])
                if "functionCall" in p
            ]
            if sorted(responses) != sorted(calls):
                raise Invalid(
                    "Please ensure that the number of function response parts is equal to the "
                    "number of function call parts of the function call turn."
                )
        previous = content
    system = body.get("systemInstruction")
    if system is not None:
        parts = system.get("parts") if isinstance(system, dict) else None
        if not parts or not all(set(p) == {"text"} for p in parts):
            raise Invalid("systemInstruction: only text parts are allowed")
    config = body.get("generationConfig") or {}
    unknown = set(config) - GENERATION_CONFIG
    if unknown:
        raise Invalid(f"Unknown name \"{sorted(unknown)[0]}\" at 'generation_config'")
    if "responseSchema" in config:
        if config.get("responseMimeType") != "application/json":
            raise Invalid("responseSchema needs responseMimeType application/json")
        _check_schema(config["responseSchema"], "generation_config.response_schema")
    stops = config.get("stopSequences")
    if stops is not None and (not isinstance(stops, list) or len(stops) > 5):
        raise Invalid("stopSequences: at most 5 strings")
    tool_config = body.get("toolConfig")
    if tool_config is not None:
        calling = tool_config.get("functionCallingConfig") or {}
        if set(tool_config) != {"functionCallingConfig"} or calling.get("mode") not in (
            "AUTO",
            "ANY",
            "NONE",
            "VALIDATED",
        ):
            raise Invalid("toolConfig.functionCallingConfig.mode: invalid value")
        if "allowedFunctionNames" in calling and calling["mode"] != "ANY":
            raise Invalid("allowedFunctionNames can be set only when the mode is ANY")


def _check_part(part: Any, role: str, index: int, declared: set[str]) -> None:
    kinds = set(part) & PART_KINDS if isinstance(part, dict) else set()
    extra = set(part) - PART_KINDS - {"thought", "thoughtSignature"} if kinds else set()
    if len(kinds) != 1 or extra:
        raise Invalid(f"contents[{index}].parts: each part must have exactly one data field")
    kind = kinds.pop()
    value = part[kind]
    if kind == "text" and not isinstance(value, str):
        raise Invalid(f"contents[{index}].parts.text: must be a string")
    if kind == "inlineData":
        try:
            base64.b64decode(value["data"], validate=True)
        except (KeyError, TypeError, ValueError):
            raise Invalid(f"contents[{index}].parts.inline_data: invalid base64 data") from None
        if not str(value.get("mimeType", "")).startswith("image/"):
            raise Invalid(f"contents[{index}].parts.inline_data.mime_type: unsupported")
    if kind == "fileData" and not isinstance(value.get("fileUri"), str):
        raise Invalid(f"contents[{index}].parts.file_data.file_uri: required")
    if kind == "functionCall":
        if role != "model":
            raise Invalid("function_call parts are only allowed in model turns")
        if not isinstance(value.get("args", {}), dict) or value.get("name") not in declared:
            raise Invalid(f"contents[{index}].parts.function_call: unknown function")
        if part.get("thoughtSignature") != SIGNATURE:
            raise Invalid(
                f"Function call is missing a thought_signature in functionCall parts "
                f"(contents[{index}]); send back the signature the model gave"
            )
    if kind == "functionResponse":
        if role != "user":
            raise Invalid("function_response parts are only allowed in user turns")
        if not isinstance(value.get("response"), dict) or set(value) != {"name", "response"}:
            raise Invalid(f"contents[{index}].parts.function_response: invalid")


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    names: set[str] = set()
    for tool in tools:
        if set(tool) != {"functionDeclarations"}:
            raise Invalid(f"Unknown name \"{sorted(tool)[0]}\" at 'tools[0]'")
        for declaration in tool["functionDeclarations"]:
            if set(declaration) - {"name", "description", "parameters"}:
                raise Invalid("tools.function_declarations: unknown field")
            if not FUNCTION_NAME.match(str(declaration.get("name"))):
                raise Invalid("tools.function_declarations.name: invalid function name")
            if "parameters" in declaration:
                _check_schema(declaration["parameters"], "function_declarations.parameters")
                if declaration["parameters"].get("type") != "OBJECT":
                    raise Invalid("function_declarations.parameters: type must be OBJECT")
            names.add(declaration["name"])
    return names


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise Invalid(f"{where}: must be an object")
    unknown = set(schema) - SCHEMA
    if unknown:
        raise Invalid(
            f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}" at {where}'
        )
    if "type" in schema and schema["type"] not in TYPES:
        raise Invalid(f"{where}.type: invalid value {schema['type']!r}")
    if "properties" in schema:
        if not schema["properties"]:
            raise Invalid(f"{where}.properties: should be non-empty for OBJECT type")
        for name, value in schema["properties"].items():
            _check_schema(value, f"{where}.properties[{name}]")
        if not set(schema.get("required", [])) <= set(schema["properties"]):
            raise Invalid(f"{where}.required: names a property that is not defined")
    if "enum" in schema and not all(isinstance(v, str) for v in schema["enum"]):
        raise Invalid(f"{where}.enum: must be strings")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items")
    for alternative in schema.get("anyOf", []):
        _check_schema(alternative, f"{where}.anyOf")


def _check_embeddings(body: dict[str, Any], model: str) -> None:
    if set(body) != {"requests"} or not body["requests"]:
        raise Invalid("BatchEmbedContentsRequest.requests: required")
    for item in body["requests"]:
        if item.get("model") != f"models/{model}":
            raise Invalid("requests[].model: must be the model of the URL")
        if set(item) - {"model", "content", "taskType", "title", "outputDimensionality"}:
            raise Invalid("requests[]: unknown field")
        parts = (item.get("content") or {}).get("parts")
        if not parts or not all(isinstance(p.get("text"), str) for p in parts):
            raise Invalid("requests[].content.parts: text required")


# -- answers ------------------------------------------------------------------------------


def _answer(
    body: dict[str, Any], faults: dict[str, str], max_words: int, reply: list[str] | None = None
) -> list[dict[str, Any]]:
    """The stream events of the answer (the whole answer is them merged); ``reply``: a
    text answer's pieces."""
    config = body.get("generationConfig") or {}
    last_parts = body["contents"][-1]["parts"]
    mode = (body.get("toolConfig") or {}).get("functionCallingConfig", {}).get("mode", "AUTO")
    tools = [d for t in body.get("tools") or [] for d in t["functionDeclarations"]]
    answered_tool = any("functionResponse" in p for p in last_parts)
    pieces: list[dict[str, Any]]
    if tools and mode != "NONE" and not answered_tool:
        declaration = tools[0]
        args = _value(declaration.get("parameters") or {"type": "OBJECT"})
        call = {"name": declaration["name"], "args": args}
        pieces = [{"functionCall": call, "thoughtSignature": SIGNATURE}]
        output = 5
    elif config.get("responseMimeType") == "application/json":
        value = _value(config.get("responseSchema") or {"type": "OBJECT"})
        text = orjson.dumps(value).decode()
        half = len(text) // 2
        pieces = [{"text": text[:half]}, {"text": text[half:]}]
        output = max(1, len(text.split()))
    else:
        limit = int(config.get("maxOutputTokens") or 16)
        words = [WORDS[i % len(WORDS)] for i in range(min(limit, max_words))]
        if answered_tool:
            words = ["done", *words[1:]]
        pieces = [{"text": (" " if i else "") + word} for i, word in enumerate(words)]
        output = len(words)
        if reply is not None:
            pieces = [{"text": piece} for piece in reply]
            output = len("".join(reply).split())
    prompt = prompt_tokens(body)
    cached = min(int(faults.get("cached", 0)), prompt)
    thoughts = int(faults.get("thoughts", 0))
    events = []
    for index, part in enumerate(pieces):
        done = index == len(pieces) - 1
        candidate: dict[str, Any] = {"content": {"parts": [part], "role": "model"}, "index": 0}
        if done:
            candidate["finishReason"] = faults.get("finish", "STOP")
        event: dict[str, Any] = {
            "candidates": [candidate],
            "modelVersion": MODEL_VERSION,
            "responseId": "fakeResponse01",
        }
        if "no_usage" not in faults:
            meta: dict[str, Any] = {
                "promptTokenCount": prompt,
                "candidatesTokenCount": output if done else index + 1,
                "totalTokenCount": prompt + (output if done else index + 1) + thoughts,
            }
            if cached:
                meta["cachedContentTokenCount"] = cached
            if thoughts:
                meta["thoughtsTokenCount"] = thoughts
            event["usageMetadata"] = meta
        events.append(event)
    return events


def _whole(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The generateContent answer: the events' parts in one candidate, the last usage."""
    last = events[-1]
    parts: list[dict[str, Any]] = []
    for event in events:
        for part in event["candidates"][0]["content"]["parts"]:
            if "text" in part and parts and "text" in parts[-1]:
                parts[-1] = {"text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(part)
    candidate = {**last["candidates"][0], "content": {"parts": parts, "role": "model"}}
    return {**last, "candidates": [candidate]}


def _value(schema: dict[str, Any]) -> Any:
    """A value the (Gemini) schema accepts."""
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _value(schema["anyOf"][0])
    kind = schema.get("type", "OBJECT")
    if kind == "OBJECT":
        return {name: _value(sub) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "ARRAY":
        return [_value(schema.get("items") or {"type": "STRING"})]
    return {"STRING": "alpha", "INTEGER": 1, "NUMBER": 1.5, "BOOLEAN": True, "NULL": None}[kind]
