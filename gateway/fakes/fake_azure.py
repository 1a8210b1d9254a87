"""A fake Azure OpenAI resource: :class:`FakeUpstream` behind Azure's addressing.

It accepts only what Azure accepts (checked against Azure OpenAI's REST reference):

- the key in the ``api-key`` header; a request without it, with another key, or with an
  ``Authorization`` header (Azure reads a Bearer token as a Microsoft Entra token, which
  a resource key is not) gets Azure's 401;
- with ``api_version`` set, the deployments surface only:
  ``POST /openai/deployments/{deployment}/chat/completions?api-version=<api_version>``
  (and ``/embeddings``); a deployment it does not have gets Azure's 404
  ``DeploymentNotFound``, a missing or other api-version a 404 too;
- without it, the v1 surface only: ``POST /openai/v1/chat/completions`` (and
  ``/embeddings``) with ``model`` naming one of its deployments.

Every request that is not so is also kept in ``refused`` (what was wrong), so a test can
assert the gateway never sent one.

Its answers are Azure's: each carries ``prompt_filter_results`` and each choice
``content_filter_results``; a stream's first chunk carries only the prompt's filter
results (``choices`` empty, ``id`` and ``model`` empty). Besides the faults of
:class:`FakeUpstream`, the directive ``[[fault content_filter]]`` answers Azure's 400
``content_filter`` refusal, and ``[[fault status=429]]`` carries Azure's ``retry-after``
and ``retry-after-ms`` headers and its rate-limit message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import orjson
import trio

from gateway.fakes.fake_upstream import (
    FakeUpstream,
    _completion,
    _event,
    _send,
    directives,
    prompt_tokens,
)

SAFE = {"filtered": False, "severity": "safe"}
FILTERS = {name: SAFE for name in ("hate", "self_harm", "sexual", "violence")}
CONTENT_FILTERED = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
        "content management policy. Please modify your prompt and retry. To learn more about "
        "our content filtering policies please read our documentation: "
        "https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                **FILTERS,
                "violence": {"filtered": True, "severity": "medium"},
            },
        },
    }
}
RATE_LIMITED = {
    "error": {
        "code": "429",
        "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
        "version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing "
        "tier. Please retry after 6 seconds.",
    }
}
ACCESS_DENIED = {
    "error": {
        "code": "401",
        "message": "Access denied due to invalid subscription key or wrong API endpoint. Make "
        "sure to provide a valid key for an active subscription and use a correct regional "
        "API endpoint for your resource.",
    }
}
NOT_FOUND = {
    "error": {
        "code": "DeploymentNotFound",
        "message": "The API deployment for this resource does not exist. If you created the "
        "deployment within the last 5 minutes, please wait a moment and try again.",
    }
}


@dataclass
class FakeAzure(FakeUpstream):
    #: the resource's keys (Azure gives two, and a BYOK organisation has its own)
    keys: frozenset[str] = frozenset()
    #: None: the v1 surface; set: the deployments surface at this api-version
    api_version: str | None = None
    deployments: frozenset[str] = frozenset()
    #: what was wrong with each request it refused as Azure would
    refused: list[str] = field(default_factory=list)
    #: the deployment each accepted request addressed
    addressed: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        """The resource endpoint: the ``base_url`` of an ``azure`` provider."""
        return self.url.removesuffix("/v1")

    def presented_key(self, headers: dict[str, str]) -> str:
        return headers.get("api-key", "")

    def decorate(self, answer: dict[str, Any]) -> dict[str, Any]:
        answer = {**answer, "prompt_filter_results": [_prompt_filter()]}
        answer["choices"] = [
            {**choice, "content_filter_results": FILTERS} for choice in answer["choices"]
        ]
        return answer

    def first_chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        empty = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
        return [{**empty, "prompt_filter_results": [_prompt_filter()]}]

    def _problem(self, request: h11.Request, body: dict[str, Any]) -> tuple[int, str] | None:
        """What Azure would refuse in this request: its status and why; None if nothing."""
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        if "authorization" in headers:
            return 401, "an Authorization header (Azure takes the key in api-key)"
        if headers.get("api-key") not in self.keys:
            return 401, "no api-key, or not the resource's key"
        target = urlsplit(request.target.decode())
        query = parse_qs(target.query)
        parts = target.path.split("/")
        if self.api_version is None:
            if parts[:3] != ["", "openai", "v1"] or "/".join(parts[3:]) not in OPERATIONS:
                return 404, f"not a v1 path: {target.path}"
            deployment = body.get("model")
        else:
            if parts[:3] != ["", "openai", "deployments"] or len(parts) < 5:
                return 404, f"not a deployments path: {target.path}"
            if "/".join(parts[4:]) not in OPERATIONS:
                return 404, f"not an operation: {target.path}"
            if query.get("api-version") != [self.api_version]:
                return 404, f"api-version {query.get('api-version')}"
            deployment = unquote(parts[3])
        if deployment not in self.deployments:
            return 404, f"no deployment {deployment!r}"
        self.addressed.append(str(deployment))
        return None

    async def _reply(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        body = orjson.loads(raw) if raw else {}
        problem = self._problem(request, body)
        if problem is not None:
            status, why = problem
            self.refused.append(why)
            answer = ACCESS_DENIED if status == 401 else NOT_FOUND
            await _send(conn, stream, status, orjson.dumps(answer))
            return True
        faults = directives(body)
        if "content_filter" in faults:
            await _send(conn, stream, 400, orjson.dumps(CONTENT_FILTERED))
            return True
        if faults.get("status") == "429" and "echo" not in faults:
            hints = (("retry-after", "6"), ("retry-after-ms", "6000"))
            await _send(conn, stream, 429, orjson.dumps(RATE_LIMITED), hints)
            return True
        message = _special_message(body)
        if message is None:
            return await super()._reply(conn, stream, request, raw)
        self.bodies.append(body)
        self.headers.append({k.decode(): v.decode() for k, v in request.headers})
        self.auth.append(None)
        return await self._answer_with(conn, stream, body, message)

    async def _answer_with(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        body: dict[str, Any],
        message: dict[str, Any],
    ) -> bool:
        """Answer ``message`` (a tool call, or JSON content), streamed or not."""
        reason = "tool_calls" if "tool_calls" in message else "stop"
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 5, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + 5
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": reason}
            answer = _completion(body, None, usage, "chat.completion", choice)
            await _send(conn, stream, 200, orjson.dumps(self.decorate(answer)))
            return True
        head = h11.Response(
            status_code=200,
            headers=[("content-type", "text/event-stream"), ("transfer-encoding", "chunked")],
        )
        await stream.send_all(conn.send(head))
        for chunk in self.first_chunks(body):
            await _event(conn, stream, chunk)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
        for choice in (
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": reason},
        ):
            chunk = _completion(body, None, None, "chat.completion.chunk", choice)
            await self._chunk(conn, stream, chunk)
        last = {**_completion(body, None, usage, "chat.completion.chunk"), "choices": []}
        await _event(conn, stream, last)
        await stream.send_all(conn.send(h11.Data(data=b"data: [DONE]\n\n")))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True


#: the tool call this fake makes, and the JSON it answers a json_schema request with
TOOL_CALL = {
    "id": "call_azure_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
JSON_ANSWER = {"city": "Paris", "temperature_c": 21}


def _special_message(body: dict[str, Any]) -> dict[str, Any] | None:
    """A tool call when tools are offered and the last message is not a tool result;
    JSON content when a json_schema answer is asked; None: the plain fake's words."""
    messages = body.get("messages") or [{}]
    if body.get("tools") and messages[-1].get("role") != "tool":
        return {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
    if (body.get("response_format") or {}).get("type") == "json_schema":
        return {"role": "assistant", "content": orjson.dumps(JSON_ANSWER).decode()}
    return None


OPERATIONS = frozenset({"chat/completions", "embeddings"})


def _prompt_filter() -> dict[str, Any]:
    return {"prompt_index": 0, "content_filter_results": FILTERS}
