"""The operator's first hour (issue 32), on real processes: ``--version``, ``config
example`` and ``config check``, ``org list`` to find the organisation a lost demo key
belonged to, ``db copy`` refusing a database in use, ``serve`` refusing a provider key
variable that is not set, model switches that outlive a restart, and every line of a
``log_format = "json"`` process being one JSON object."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway import __version__
from tests.support.procs import (
    ADMIN_TOKEN,
    assert_one_line_error,
    base_env,
    cli_json,
    run_cli,
    start_server,
)

pytestmark = pytest.mark.processes


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and __version__ in result.stdout, result


def test_config_example_is_checked_valid_and_check_names_the_error(tmp_path: Path) -> None:
    example = run_cli("config", "example")
    assert example.returncode == 0, example.stderr
    path = tmp_path / "gateway.toml"
    path.write_text(example.stdout)
    checked = run_cli("config", "check", str(path))
    assert checked.returncode == 0, checked.stderr
    [line] = checked.stdout.splitlines()  # one line
    assert "valid" in line and "openai" in line, line
    assert "OPENAI_API_KEY is not set" in line  # this shell has no key: said, not refused
    ok = run_cli("config", "check", str(path), env=base_env(OPENAI_API_KEY="sk-x"))
    assert "not set" not in ok.stdout, ok.stdout

    path.write_text(example.stdout.replace('kind = "openai"', 'kind = "openai"\nbanana = 1'))
    refused = run_cli("config", "check", str(path))
    assert refused.returncode == 1
    line = assert_one_line_error(refused, "providers[1].banana: unknown key; allowed: name")
    assert "api_key_env" in line and "max_connections" in line


def test_serve_refuses_a_provider_key_variable_that_is_not_set(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[providers]]\nname = "up"\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "UP_KEY_NOT_SET_HERE"\n'
        '[[models]]\nid = "m"\nprovider = "up"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n'
    )
    result = run_cli("serve", "--port", "0", "--config", str(config), cwd=tmp_path, timeout=15)
    assert result.returncode == 2
    assert_one_line_error(result, "providers[0].api_key_env: UP_KEY_NOT_SET_HERE is not set")
    assert not (tmp_path / "svc-gateway.db").exists()


def test_a_lost_demo_key_is_replaced_through_org_list_and_key_create(tmp_path: Path) -> None:
    first = start_server(tmp_path)
    assert first.token is not None
    assert first.stop() == 0, first.stderr()
    again = start_server(tmp_path)  # the demo key was printed once, and is lost
    try:
        assert again.token is None
        hint = json.loads(again.stdout_lines[0])["message"]
        assert "org list" in hint and "key create" in hint
        [org] = cli_json("org", "list", "--url", again.url)["data"]
        assert org["name"] == "demo"
        text = run_cli("org", "list", "--url", again.url)
        assert f"id={org['id']}" in text.stdout and "name=demo" in text.stdout
        made = cli_json(
            "key", "create", "--org", org["id"], "--name", "demo", "--mode", "sandbox",
            "--keys-manage", "--url", again.url,
        )  # fmt: skip
        assert again.get("/v1/key", made["token"]).status_code == 200
    finally:
        assert again.stop() == 0, again.stderr()


def test_db_copy_refuses_a_database_a_server_holds(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        result = run_cli("db", "copy", "--from", str(tmp_path / "g.db"), "--to", "copy.db")
        line = assert_one_line_error(result, "another svc-gateway server", "stop that server")
        assert f"pid {server.proc.pid}" in line
    finally:
        assert server.stop() == 0, server.stderr()
    assert not (tmp_path / "g.db.lock").exists()


def test_a_model_switch_outlives_a_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    token = server.token
    try:
        cli_json("model", "disable", "gpt-4o", "--url", server.url)
    finally:
        assert server.stop() == 0, server.stderr()
    again = start_server(tmp_path)
    try:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        with again.client(token) as client:
            refused = client.post("/v1/chat/completions", json=body)
            assert refused.json()["error"]["code"] == "model_unavailable"
            cli_json("model", "enable", "gpt-4o", "--url", again.url)
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    finally:
        assert again.stop() == 0, again.stderr()


def test_under_json_logs_every_line_of_stdout_and_stderr_is_one_object(tmp_path: Path) -> None:
    (tmp_path / "gateway.toml").write_text('[server]\nlog_format = "json"\n')
    stderr_path = tmp_path / "stderr"
    command = [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml"]
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [*command, "--port", "0", "--db", "g.db", "--demo"],
            cwd=tmp_path, env=base_env(), stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening" and "sandbox_key" not in listening
        assert "org list" in listening["message"]  # into a pipe: how to get a key instead
        assert httpx.get(f"{listening['url']}/healthz").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    # a refusal after the configuration is read is a JSON line too (the database is held)
    with stderr_path.open("a") as stderr:
        holder = subprocess.Popen(
            [*command, "--port", "0", "--db", "g.db"],
            cwd=tmp_path, env=base_env(), stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        assert holder.stdout is not None
        holder.stdout.readline()
        second = run_cli(*command[3:], "--port", "0", "--db", "g.db", cwd=tmp_path, timeout=15)
        holder.send_signal(signal.SIGTERM)
        rest += holder.communicate(timeout=30)[0]
    assert second.returncode != 0 and second.stdout == ""
    lines = [*rest.splitlines(), *stderr_path.read_text().splitlines(), *second.stderr.splitlines()]
    objects = [json.loads(line) for line in lines if line.strip()]  # every line parses
    assert all(isinstance(item, dict) for item in objects)
    errors = [item for item in objects if item.get("event") == "error"]
    assert errors and "another svc-gateway server" in errors[-1]["message"]
    assert not (tmp_path / "g.db.lock").exists()
    assert ADMIN_TOKEN not in "".join(lines)
