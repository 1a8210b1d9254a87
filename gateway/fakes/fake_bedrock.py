"""A fake Bedrock Runtime: Converse and ConverseStream on a real HTTP/1.1 loopback server.

It speaks the wire format of AWS's API reference: ``POST /model/{modelId}/converse``
answers a ``ConverseResponse`` JSON object, ``/converse-stream`` an
``application/vnd.amazon.eventstream`` body of binary frames (prelude with the total and
headers lengths, its CRC32, string headers ``:event-type``, ``:content-type``,
``:message-type``, a JSON payload, the message CRC32); errors are ``{"message": ...}``
with the type in ``x-amzn-ErrorType``. And it accepts only what AWS would:

- a SigV4 ``Authorization`` it recomputes with botocore from the received request and
  the secret of the access key id (403 ``InvalidSignatureException`` when it differs;
  403 ``UnrecognizedClientException`` for an unknown key id, or a session token missing
  or not the one of the key), scope region and service ``bedrock``;
- a body of Converse's known fields only, messages alternating user/assistant from a
  user turn, non-blank text, images of a known format with base64 bytes, a toolResult
  only after the toolUse of the same id, tool blocks only with a toolConfig
  (400 ``ValidationException`` otherwise).

Faults by a directive in a text block of the messages, ``[[fault ...]]``::

    status=429                  that status, its AWS error type (type=X to choose one)
    echo=X                      the error message quotes X (echo=auth: the Authorization
                                received; echo=token: the session token received)
    reset                       close the connection before any header
    delay=2.5                   wait before answering
    drop_after=N                (stream) send N frames, then cut the connection
    exception=throttlingException [exception_after=N]
                                (stream) an exception frame after N frames (default 0)
    stall_after=N               (stream) N frames, then hang
    malformed                   answer 200 with a body that is not the answer
    bad_crc                     (stream) a frame whose message CRC is wrong
    no_usage                    report no usage
    cache_read=N cache_write=N  usage reports cache reads and writes
    stop_reason=X               the answer's stopReason

``calls`` counts requests; ``bodies``, ``headers``, ``paths`` keep what came in and
``rejections`` the reasons of the requests it refused on signature or body.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import h11
import orjson
import trio
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.fakes.fake_upstream import WORDS, directives, serve_loopback

TOP_LEVEL = {
    "messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
    "additionalModelRequestFields", "promptVariables", "additionalModelResponseFieldPaths",
    "requestMetadata", "performanceConfig",
}  # fmt: skip
BLOCKS = {"text", "image", "document", "video", "toolUse", "toolResult", "guardContent",
          "cachePoint", "reasoningContent", "citationsContent"}  # fmt: skip
INFERENCE = {"maxTokens", "temperature", "topP", "stopSequences"}
ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method. Consult the service "
    "documentation for details."
)
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})"
)


class Rejected(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass
class FakeBedrock:
    url: str = ""
    #: the loopback port to listen on (0: a free one)
    port: int = 0
    calls: int = 0
    #: access key id → (secret access key, session token or None)
    credentials: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    region: str = "us-east-1"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    max_words: int = 6
    #: the answer's text instead of the words (streamed a word a frame)
    reply: list[str] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[FakeBedrock]) -> None:
        def started(port: int) -> None:
            self.url = f"http://127.0.0.1:{port}"
            task_status.started(self)

        await serve_loopback(self._answer, started, self.port)

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        self.calls += 1
        return await self._reply(conn, stream, request, raw)

    async def _reply(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        target = request.target.decode()
        self.headers.append(headers)
        self.paths.append(target)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        self.bodies.append(body if isinstance(body, dict) else {})
        try:
            self._verify_signature(target, headers, raw)
            action = _action(target)
            check_converse(body)
        except Rejected as exc:
            self.rejections.append(exc.message)
            await _error(conn, stream, exc.status, exc.kind, exc.message)
            return True
        assert isinstance(body, dict)
        faults = directives(body)
        if "delay" in faults:
            await trio.sleep(float(faults["delay"]))
        if "reset" in faults:
            return False
        if "status" in faults:
            status = int(faults["status"])
            kind = faults.get("type") or ERROR_TYPES.get(status, "InternalServerException")
            message = "Bedrock says no: see https://internal.example/x"
            if "echo" in faults:
                echoed = faults["echo"]
                echoed = {
                    "auth": headers.get("authorization", ""),
                    "token": headers.get("x-amz-security-token", ""),
                }.get(echoed, echoed)
                message = f"The security token included in the request is invalid: {echoed}"
            await _error(conn, stream, status, kind, message)
            return True
        if "malformed" in faults:
            await _send(conn, stream, 200, "text/html", b"<html>a proxy page</html>")
            return True
        blocks, stop_reason = self._content(body, faults)
        usage = _usage(body, blocks, faults)
        if action == "converse":
            answer: dict[str, Any] = {
                "output": {"message": {"role": "assistant", "content": blocks}},
                "stopReason": stop_reason,
                "metrics": {"latencyMs": 42},
            }
            if usage is not None:
                answer["usage"] = usage
            await _send(conn, stream, 200, "application/json", orjson.dumps(answer))
            return True
        return await self._stream(conn, stream, blocks, stop_reason, usage, faults)

    def _verify_signature(self, target: str, headers: dict[str, str], raw: bytes) -> None:
        match = _AUTH.fullmatch(headers.get("authorization", ""))
        if match is None:
            raise Rejected(
                403, "MissingAuthenticationTokenException", "Missing Authentication Token"
            )
        key_id, day, region, service, signed, signature = match.groups()
        known = self.credentials.get(key_id)
        if known is None:
            raise Rejected(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        secret, token = known
        names = signed.split(";")
        amz_date = headers.get("x-amz-date", "")
        if "host" not in names or "x-amz-date" not in names or amz_date[:8] != day:
            raise Rejected(403, "InvalidSignatureException", BAD_SIGNATURE)
        if (region, service) != (self.region, "bedrock"):
            raise Rejected(
                403,
                "InvalidSignatureException",
                "Credential should be scoped to a valid region and service.",
            )
        if token is not None and (
            "x-amz-security-token" not in names
            or not hmac.compare_digest(headers.get("x-amz-security-token", ""), token)
        ):
            raise Rejected(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        request = AWSRequest(
            method="POST",
            url=f"http://{headers['host']}{target}",
            data=raw,
            headers={name: headers.get(name, "") for name in names},
        )
        request.context["timestamp"] = amz_date
        auth = SigV4Auth(Credentials(key_id, secret, token), "bedrock", self.region)
        canonical = auth.canonical_request(request)
        expected = auth.signature(auth.string_to_sign(request, canonical), request)
        if not hmac.compare_digest(expected, signature):
            raise Rejected(403, "InvalidSignatureException", BAD_SIGNATURE)

    def _content(
        self, body: dict[str, Any], faults: dict[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        tools = {
            t["toolSpec"]["name"]: t["toolSpec"]
            for t in (body.get("toolConfig") or {}).get("tools", [])
        }
        choice = (body.get("toolConfig") or {}).get("toolChoice") or {}
        last = body["messages"][-1]["content"]
        answered = any("toolResult" in block for block in last)
        name = None
        if "tool" in choice:
            name = choice["tool"]["name"]
        elif tools and not answered:
            name = next(iter(tools))
        if name is not None:
            schema = tools[name]["inputSchema"]["json"]
            tool_use = {
                "toolUseId": f"tooluse_{self.calls:04d}abc",
                "name": name,
                "input": sample(schema),
            }
            return [{"toolUse": tool_use}], faults.get("stop_reason", "tool_use")
        limit = int((body.get("inferenceConfig") or {}).get("maxTokens") or 16)
        words = [WORDS[i % len(WORDS)] for i in range(min(limit, self.max_words))]
        if answered:
            words = ["the", "tool", "said", "so"][: max(1, len(words))]
        text = "".join(self.reply) if self.reply is not None else " ".join(words)
        return [{"text": text}], faults.get("stop_reason", "end_turn")

    async def _stream(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        blocks: list[dict[str, Any]],
        stop_reason: str,
        usage: dict[str, int] | None,
        faults: dict[str, str],
    ) -> bool:
        frames = [event("messageStart", {"role": "assistant"})]
        for index, block in enumerate(blocks):
            if "text" in block:
                words = block["text"].split(" ")
                for i, word in enumerate(words):
                    delta = {"text": (" " if i else "") + word}
                    frames.append(
                        event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})
                    )
            else:
                tool_use = block["toolUse"]
                start = {"toolUse": {"toolUseId": tool_use["toolUseId"], "name": tool_use["name"]}}
                frames.append(
                    event("contentBlockStart", {"contentBlockIndex": index, "start": start})
                )
                text = orjson.dumps(tool_use["input"]).decode()
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    delta = {"toolUse": {"input": piece}}
                    frames.append(
                        event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})
                    )
            frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
        frames.append(event("messageStop", {"stopReason": stop_reason}))
        if usage is not None:
            frames.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 42}}))
        if "exception" in faults:
            at = int(faults.get("exception_after", 0))
            kind = faults["exception"]
            message = {"message": f"{kind}: the model stream failed, retry"}
            frames = [*frames[:at], frame(_exception_headers(kind), orjson.dumps(message))]
        if "bad_crc" in faults:
            broken = bytearray(frames[1])
            broken[-1] ^= 0xFF
            frames[1] = bytes(broken)
        head = h11.Response(
            status_code=200,
            headers=[
                ("content-type", "application/vnd.amazon.eventstream"),
                ("transfer-encoding", "chunked"),
                ("x-amzn-requestid", "0f0e0d0c-fake"),
            ],
        )
        await stream.send_all(conn.send(head))
        for index, data in enumerate(frames):
            if "drop_after" in faults and index >= int(faults["drop_after"]):
                return False
            if "stall_after" in faults and index >= int(faults["stall_after"]):
                await trio.sleep_forever()
            await stream.send_all(conn.send(h11.Data(data=data)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True


def _action(target: str) -> str:
    match = re.fullmatch(r"/model/([^/]+)/(converse|converse-stream)", target)
    if match is None or not unquote(match[1]):
        raise Rejected(404, "UnknownOperationException", "The operation does not exist.")
    return match[2]


def check_converse(body: Any) -> None:
    """Raise :class:`Rejected` (400 ValidationException) for a body AWS would refuse."""

    def bad(message: str) -> Rejected:
        return Rejected(400, "ValidationException", message)

    if not isinstance(body, dict):
        raise bad("The request body is not valid JSON.")
    unknown = set(body) - TOP_LEVEL
    if unknown:
        raise bad(f"extraneous key [{sorted(unknown)[0]}] is not permitted")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("A conversation must start with a user message.")
    used: set[str] = set()
    has_tools = bool((body.get("toolConfig") or {}).get("tools"))
    for index, message in enumerate(messages):
        role = message.get("role")
        if role != ("user" if index % 2 == 0 else "assistant"):
            raise bad("A conversation must alternate between user and assistant roles.")
        content = message.get("content")
        if not isinstance(content, list) or not content:
            raise bad(f"messages.{index}.content: must not be empty")
        for block in content:
            if not isinstance(block, dict) or len(block) != 1 or not set(block) <= BLOCKS:
                raise bad(f"messages.{index}: a content block must have exactly one known member")
            if "text" in block and not str(block["text"]).strip():
                raise bad("The text field in the ContentBlock object is blank.")
            if "image" in block:
                image = block["image"]
                if image.get("format") not in ("png", "jpeg", "gif", "webp"):
                    raise bad("The image format is not supported.")
                try:
                    base64.b64decode(image["source"]["bytes"], validate=True)
                except (KeyError, TypeError, binascii.Error):
                    raise bad("The image bytes are not valid base64.") from None
            if ("toolUse" in block or "toolResult" in block) and not has_tools:
                raise bad(
                    "The toolConfig field must be defined when using toolUse and "
                    "toolResult content blocks."
                )
            if "toolUse" in block:
                if role != "assistant" or not isinstance(block["toolUse"].get("input"), dict):
                    raise bad("A toolUse block belongs to an assistant turn, with an input.")
                used.add(block["toolUse"]["toolUseId"])
            if "toolResult" in block and block["toolResult"].get("toolUseId") not in used:
                raise bad(
                    "The toolResult blocks do not match the toolUse blocks of the previous turn."
                )
    for item in body.get("system") or []:
        if set(item) != {"text"} or not item["text"].strip():
            raise bad("A system block takes a non-blank text.")
    if not set(body.get("inferenceConfig") or {}) <= INFERENCE:
        raise bad("inferenceConfig: unknown field")
    config = body.get("toolConfig")
    if config is not None:
        for tool in config.get("tools") or []:
            spec = tool.get("toolSpec") or {}
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", str(spec.get("name"))):
                raise bad("toolSpec.name: must match [a-zA-Z0-9_-]{1,64}")
            if not isinstance((spec.get("inputSchema") or {}).get("json"), dict):
                raise bad("toolSpec.inputSchema.json: required")
        choice = config.get("toolChoice", {"auto": {}})
        if len(choice) != 1 or not set(choice) <= {"auto", "any", "tool"}:
            raise bad("toolChoice: exactly one of auto, any, tool")


def sample(schema: dict[str, Any]) -> Any:
    """A small value of a JSON schema (objects, arrays, strings, numbers, booleans, enums)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {name: sample(sub) for name, sub in props.items()}
    if kind == "array":
        return [sample(schema.get("items") or {"type": "string"})]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return "alpha"


def _usage(
    body: dict[str, Any], blocks: list[dict[str, Any]], faults: dict[str, str]
) -> dict[str, int] | None:
    if "no_usage" in faults:
        return None
    texts = [b.get("text", "") for m in body["messages"] for b in m["content"]]
    texts += [item["text"] for item in body.get("system") or []]
    read, written = int(faults.get("cache_read", 0)), int(faults.get("cache_write", 0))
    # inputTokens excludes the cache reads and writes, as AWS counts them
    tokens = max(1, sum(len(str(text).split()) for text in texts) - read - written)
    output = sum(len(b["text"].split()) if "text" in b else 3 for b in blocks)
    usage = {
        "inputTokens": tokens,
        "outputTokens": output,
        "totalTokens": tokens + read + written + output,
    }
    if read or written:
        usage |= {"cacheReadInputTokens": read, "cacheWriteInputTokens": written}
    return usage


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude, its CRC32, string headers, payload, CRC32."""
    encoded = b"".join(
        bytes([len(name)])
        + name.encode()
        + b"\x07"
        + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(kind: str, payload: dict[str, Any]) -> bytes:
    """An event frame; AWS pads payloads with a ``p`` member of filler letters."""
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, orjson.dumps({**payload, "p": "abcdefghijklmnop"[: len(kind)]}))


def _exception_headers(kind: str) -> dict[str, str]:
    return {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }


async def _error(
    conn: h11.Connection, stream: trio.SocketStream, status: int, kind: str, message: str
) -> None:
    data = orjson.dumps({"message": message})
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(data))),
        ("x-amzn-errortype", f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        ("x-amzn-requestid", "0f0e0d0c-fake"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=data)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def _send(
    conn: h11.Connection, stream: trio.SocketStream, status: int, kind: str, data: bytes
) -> None:
    headers = [("content-type", kind), ("content-length", str(len(data)))]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=data)))
    await stream.send_all(conn.send(h11.EndOfMessage()))
