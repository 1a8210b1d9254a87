"""``log_format = "json"`` on a real ``svc-gateway serve`` process: every line of its log
parses, one ``request`` line per request with the contract's fields, and no secret or
content anywhere in it."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import ADMIN_TOKEN, start_server

pytestmark = pytest.mark.processes

REQUEST_FIELDS = {
    "ts",
    "request_id",
    "method",
    "path",
    "status",
    "code",
    "key_id",
    "org_id",
    "model",
    "stream",
    "latency_ms",
    "ttfb_ms",
    "input_tokens",
    "output_tokens",
    "settled_usd",
}
PROMPT = "Describe the violet lighthouse of Quillford in detail."
TRACE = "0af7651916cd43dd8448eb211c80319c"


def lines_of(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def test_json_logs_have_one_request_line_per_request_and_no_secret(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[server]\nlog_format = "json"\nlog_level = "info"\n')
    server = start_server(tmp_path, "--config", str(config), "--demo")
    assert server.token is not None
    secrets = [server.token, ADMIN_TOKEN, "svc_test_wrongwrongwrongwrong"]
    contents = [PROMPT, "violet lighthouse"]
    sent: list[httpx.Response] = []
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": PROMPT}]}
    try:
        with server.client(server.token) as client:
            sent.append(client.get("/v1/key"))
            answer = client.post(
                "/v1/chat/completions",
                json=body,
                headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01"},
            )
            sent.append(answer)
            contents.append(answer.json()["choices"][0]["message"]["content"])
            streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
            sent.append(streamed)
            sent.append(client.post("/v1/chat/completions", json={**body, "model": "nope"}))
        with server.client(ADMIN_TOKEN) as admin:
            org_id = sent[0].json()["org_id"]
            created = admin.post(
                "/admin/keys", json={"org_id": org_id, "name": "second", "mode": "sandbox"}
            )
            sent.append(created)
        secrets.append(created.json()["token"])
        with server.client(created.json()["token"]) as client:
            sent.append(
                client.post(
                    "/v1/embeddings", json={"model": "text-embedding-3-small", "input": PROMPT}
                )
            )
        with server.client(secrets[2]) as client:
            sent.append(client.get("/v1/key"))
        with server.client() as client:
            sent += [client.get("/healthz"), client.get("/readyz"), client.get("/metrics")]
    finally:
        status = server.stop(signal.SIGTERM)
    assert status == 0
    statuses = [response.status_code for response in sent]
    assert statuses == [200, 200, 200, 404, 201, 200, 401, 200, 200, 200]

    log = server.stderr()
    lines = lines_of(log)  # every line parses
    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) == len(sent)
    by_id = {line["request_id"]: line for line in requests}
    for response in sent:
        line = by_id[response.headers["X-Request-Id"]]
        assert set(line) >= REQUEST_FIELDS, REQUEST_FIELDS - set(line)
        assert line["status"] == response.status_code
        expected_code = "ok" if response.status_code < 400 else response.json()["error"]["code"]
        assert line["code"] == expected_code
        assert line["path"] == response.request.url.path
        assert line["latency_ms"] >= 0 and line["level"] == "info"
    chat = by_id[sent[1].headers["X-Request-Id"]]
    assert chat["trace_id"] == TRACE
    assert chat["model"] == "gpt-4o-mini" and chat["stream"] is False
    assert chat["key_id"] == sent[0].json()["id"] and chat["org_id"] == sent[0].json()["org_id"]
    assert chat["input_tokens"] > 0 and chat["output_tokens"] > 0 and chat["settled_usd"] > 0
    stream = by_id[sent[2].headers["X-Request-Id"]]
    assert stream["stream"] is True and stream["ttfb_ms"] <= stream["latency_ms"]
    assert stream["output_tokens"] > 0
    refused = by_id[sent[6].headers["X-Request-Id"]]
    assert (refused["key_id"], refused["code"]) == (None, "invalid_api_key")

    events = [line["event"] for line in lines]
    for name in ("starting", "ready", "signal", "shutdown", "stopped"):
        assert name in events, name
    assert any(line["logger"] == "hypercorn.error" for line in lines)
    for secret in [*secrets, *contents]:
        assert secret not in log, secret


def test_text_logs_carry_the_request_line_too(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        with server.client(server.token) as client:
            request_id = client.get("/v1/key").headers["X-Request-Id"]
    finally:
        assert server.stop(signal.SIGTERM) == 0
    log = server.stderr()
    [line] = [line for line in log.splitlines() if f"request_id={request_id}" in line]
    assert " INFO gateway.request: GET /v1/key 200 ok " in line
    assert server.token is not None and server.token not in log
