"""Bad input to the `svc-gateway` command: one line naming the problem, a non-zero exit,
no traceback, and nothing on disk overwritten.

Every case runs the real command as a subprocess. The CLI's own error line starts with
``svc-gateway:``; logging lines of the server may surround it, so the assertions count
only those lines.

Bad or odd bodies sent to a running gateway (the real server of tests/conftest.py, on a
loopback port 0) come last: every refusal is a documented 4xx, and an odd but valid body
is served; neither is ever a 5xx.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import Gateway
from tests.providers.test_mock_provider import HUGE_NUMBER_SCHEMAS, RECURSIVE_SCHEMAS
from tests.support.procs import assert_one_line_error, base_env, run_cli, start_server

pytestmark = pytest.mark.processes

PROVIDER_MOCK = '[[providers]]\nname = "mock"\nkind = "mock"\n'

# (id, config file text, expected exit status, text the error line must contain)
CONFIG_CASES = [
    ("not-toml", "[server\nport = 1\n", 2, "{file}"),
    ("unknown-key", "[server]\nprot = 8080\n", 2, "server.prot"),
    ("wrong-type", '[server]\nport = "x"\n', 2, "server.port"),
    ("port-range", "[server]\nport = 70000\n", 2, "server.port"),
    ("unknown-top-level", "[sever]\nport = 1\n", 2, "sever"),
    (
        "unknown-provider",
        PROVIDER_MOCK + '[[models]]\nid = "m"\nprovider = "nope"\n',
        2,
        "models[0].provider",
    ),
    (
        "openai-without-base-url",
        '[[providers]]\nname = "o"\nkind = "openai"\n[[models]]\nid = "m"\nprovider = "o"\n',
        2,
        "providers[0].base_url",
    ),
]


def serve(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli("serve", *args, cwd=tmp_path, env=env, timeout=20)


@pytest.mark.parametrize(
    ("text", "status", "needle"),
    [case[1:] for case in CONFIG_CASES],
    ids=[case[0] for case in CONFIG_CASES],
)
def test_bad_config_file(tmp_path: Path, text: str, status: int, needle: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    db = tmp_path / "g.db"
    result = serve(tmp_path, "--config", str(config), "--port", "0", "--db", str(db))
    assert result.returncode == status, result.stderr
    assert_one_line_error(result, needle.format(file=config))
    assert config.read_text() == text
    assert not db.exists()
    assert result.stdout == ""


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = serve(tmp_path, "--config", str(missing), "--port", "0")
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, str(missing), "not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "env_extra", "needle"),
    [
        (("--port", "70000"), {}, "server.port"),
        (("--port", "0"), {"SVC_SERVER_SHARDS": "many"}, "SVC_SERVER_SHARDS"),
        ((), {"SVC_SERVER_PORT": "-3"}, "server.port"),
        (("--port", "0"), {"SVC_CONFIG": "/nonexistent-svc-config.toml"}, "not found"),
    ],
    ids=["flag-port-range", "env-not-an-int", "env-port-range", "env-config-missing"],
)
def test_bad_flags_and_environment(
    tmp_path: Path, args: tuple[str, ...], env_extra: dict[str, str], needle: str
) -> None:
    db = tmp_path / "g.db"
    result = serve(tmp_path, *args, "--db", str(db), env=base_env(**env_extra))
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, needle)
    assert not db.exists()


def test_missing_database_directory(tmp_path: Path) -> None:
    missing_dir = tmp_path / "nonexistent-dir-xyz"
    result = serve(tmp_path, "--port", "0", "--db", str(missing_dir / "g.db"))
    line = assert_one_line_error(result, "does not exist", str(missing_dir))
    assert "directory" in line
    assert not missing_dir.exists()
    assert result.stdout == ""


def test_database_path_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    result = serve(tmp_path, "--port", "0", "--db", str(folder))
    assert_one_line_error(result, "directory", str(folder))
    assert list(folder.iterdir()) == []


def test_database_that_is_not_sqlite_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    content = b"these are my precious notes, not a database\n" * 20
    db.write_bytes(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = serve(tmp_path, "--port", "0", "--db", str(db))
    assert_one_line_error(result, "not an SQLite database", str(db))
    assert db.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -wal / -shm beside it
    assert result.stdout == ""


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = serve(tmp_path, "--port", str(port), "--db", str(tmp_path / "g.db"))
    assert_one_line_error(result, str(port))
    assert "svc-gateway listening" not in result.stdout
    assert "svc_test_" not in result.stdout


def test_port_in_use_does_not_swallow_the_sandbox_key(tmp_path: Path) -> None:
    """The demo sandbox key is shown once; a start that fails must not consume it."""
    db = tmp_path / "g.db"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        result = serve(tmp_path, "--port", str(taken.getsockname()[1]), "--db", str(db))
    assert result.returncode != 0
    # the operator frees the port (here: any free port) and starts again
    srv = start_server(tmp_path, db=db)
    try:
        assert srv.token is not None, (
            "the first successful start printed no sandbox key:\n" + "\n".join(srv.stdout_lines)
        )
        assert srv.get("/v1/key", srv.token).status_code == 200
    finally:
        assert srv.stop(signal.SIGTERM) == 0, srv.stderr()


def test_policy_file_that_is_not_json(tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    policy.write_text("{not json")
    # no server is needed: the file is refused before any call
    result = run_cli("org", "policy", "org_x", "--file", str(policy), "--url", "http://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, str(policy), "not valid JSON")
    assert policy.read_text() == "{not json"


def test_tag_option_without_equals(tmp_path: Path) -> None:
    result = run_cli(
        "key", "create", "--org", "org_x", "--name", "n", "--mode", "sandbox",
        "--required-tag", "team", "--url", "http://127.0.0.1:1",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, "--required-tag", "team")


def test_unreachable_gateway(tmp_path: Path) -> None:
    result = run_cli("key", "list", "--org", "org_x", "--url", "http://127.0.0.1:1")
    assert_one_line_error(result, "cannot reach", "http://127.0.0.1:1")


# ---------------------------------------------------------------- bodies over HTTP

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
MODEL = "gpt-4o-mini"
USER = [{"role": "user", "content": "hi"}]

# response_format shapes chat completions refuses, as /v1/responses refuses text.format:
# json_schema an object with a string name and, if sent, an object schema
BAD_RESPONSE_FORMATS = {
    "json_schema a string": {"type": "json_schema", "json_schema": "x"},
    "json_schema an array": {"type": "json_schema", "json_schema": [1]},
    "json_schema null": {"type": "json_schema", "json_schema": None},
    "no json_schema": {"type": "json_schema"},
    "no name": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
    "name a number": {"type": "json_schema", "json_schema": {"name": 1, "schema": {}}},
    "schema a string": {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}},
    "schema an array": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
}

# Valid schemas the sandbox once answered with a 500 (a 503 "The stream failed." when
# streamed) or never answered: recursion without end, numbers beyond 64 bits. A few of the
# mock's own cases, each served over HTTP on every endpoint.
ODD_SCHEMAS = {
    name: {**RECURSIVE_SCHEMAS, **HUGE_NUMBER_SCHEMAS}[name]
    for name in (
        "$ref to the root",
        "allOf of the root",
        "anyOf of the root",
        "required self-recursive $defs",
        "allOf of a $ref to itself",
        "integer minimum 1e300",
        "integer exclusiveMinimum 10**30",
    )
}


def assert_refused(response: Any, code: str, param: str | None) -> None:
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), response.text


@pytest.mark.parametrize("response_format", BAD_RESPONSE_FORMATS.values(), ids=BAD_RESPONSE_FORMATS)
async def test_chat_response_format_of_a_bad_shape_is_refused(
    gateway: Gateway, response_format: dict[str, Any]
) -> None:
    body = {"model": MODEL, "messages": USER, "response_format": response_format}
    with trio.fail_after(10):
        async with gateway.client(gateway.token) as client:
            response = await client.post(CHAT, json=body)
            streamed = await client.post(CHAT, json={**body, "stream": True})
    assert response.status_code == 400, response.text
    assert_refused(response, "invalid_request", "response_format")
    assert streamed.status_code == 400, streamed.text
    assert_refused(streamed, "invalid_request", "response_format")


async def test_json_schema_refusals_match_across_endpoints(gateway: Gateway) -> None:
    """No name: refused on both endpoints with the same code and param; a name and no
    schema (OpenAI's schema is optional on chat completions) is served."""
    nameless = {"type": "json_schema", "schema": {"type": "object"}}
    chat = {"model": MODEL, "messages": USER}
    with trio.fail_after(10):
        async with gateway.client(gateway.token) as client:
            on_responses = await client.post(
                RESPONSES, json={"model": MODEL, "input": "hi", "text": {"format": nameless}}
            )
            on_chat = await client.post(
                CHAT,
                json={**chat, "response_format": {"type": "json_schema", "json_schema": nameless}},
            )
            schemaless = await client.post(
                CHAT,
                json={
                    **chat,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
                },
            )
    assert (on_responses.status_code, on_chat.status_code) == (400, 400), on_chat.text
    assert_refused(on_responses, "invalid_request", "response_format")
    assert_refused(on_chat, "invalid_request", "response_format")
    assert schemaless.status_code == 200, schemaless.text


@pytest.mark.parametrize("schema", ODD_SCHEMAS.values(), ids=ODD_SCHEMAS)
async def test_odd_schema_is_served_on_every_endpoint(
    gateway: Gateway, schema: dict[str, Any]
) -> None:
    """Structured output (chat and responses, whole and streamed) and tool parameters."""
    chat_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    chat = {"model": MODEL, "messages": USER, "response_format": chat_format}
    text = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
    responses = {"model": MODEL, "input": "hi", "text": text}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with trio.fail_after(20):
        async with gateway.client(gateway.token) as client:
            answers = {
                "chat": await client.post(CHAT, json=chat),
                "chat streamed": await client.post(CHAT, json={**chat, "stream": True}),
                "responses": await client.post(RESPONSES, json=responses),
                "responses streamed": await client.post(
                    RESPONSES, json={**responses, "stream": True}
                ),
                "chat tool": await client.post(
                    CHAT, json={"model": MODEL, "messages": USER, "tools": [tool]}
                ),
            }
    for name, answer in answers.items():
        assert answer.status_code == 200, f"{name}: {answer.text}"
    assert answers["chat streamed"].text.endswith("data: [DONE]\n\n")
    assert '"error"' not in answers["chat streamed"].text
    assert "response.failed" not in answers["responses streamed"].text
    (call,) = answers["chat tool"].json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "f"


@pytest.mark.parametrize("depth", [200, 300, 1000])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"])
async def test_a_body_nested_too_deep_is_400(gateway: Gateway, path: str, depth: int) -> None:
    # written by hand: JSON encoders (orjson, json) refuse to write such a body
    raw = (
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], '
        b'"input": "hi", "probe": ' + b"[" * depth + b'"x"' + b"]" * depth + b"}"
    )
    headers = {"Idempotency-Key": f"d{depth}", "Content-Type": "application/json"}
    async with gateway.client(gateway.token) as client:
        response = await client.post(path, content=raw, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if depth > 255:
        assert error["code"] == "invalid_request" and "nested too deeply" in error["message"]
    else:  # read, then refused for the unknown field like any other body
        assert "nested" not in error["message"]
