"""The operator contract of DESIGN.md, end to end: real `svc-gateway` processes.

A real `serve` subprocess on a loopback port chosen by the OS, a real SQLite file in a
temp dir, the CLI verbs as separate processes talking to it over real HTTP, and plain
httpx calls with the tokens the CLI hands out.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import (
    ADMIN_TOKEN,
    Server,
    assert_one_line_error,
    base_env,
    cli_json,
    run_cli,
    start_server,
)

pytestmark = pytest.mark.processes

# (verb words, a word its description must contain)
VERBS: list[tuple[tuple[str, ...], str]] = [
    (("serve",), r"run"),
    (("org",), r"organi[sz]ation"),
    (("org", "create"), r"create"),
    (("org", "credits"), r"credit"),
    (("org", "policy"), r"polic"),
    (("org", "byok"), r"provider key|byok"),
    (("key",), r"key"),
    (("key", "create"), r"create"),
    (("key", "rotate"), r"new key|rotat"),
    (("key", "revoke"), r"revoke"),
    (("key", "disable"), r"disable"),
    (("key", "enable"), r"enable"),
    (("key", "list"), r"list"),
    (("org", "list"), r"list"),
    (("config",), r"config"),
    (("config", "example"), r"example"),
    (("config", "check"), r"check|load"),
    (("model",), r"stored"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One gateway with the admin API enabled, shared by the contract tests below."""
    srv = start_server(tmp_path_factory.mktemp("cli-server"))
    try:
        yield srv
    finally:
        status = srv.stop(signal.SIGTERM)
        assert status == 0, srv.stderr()


def url_args(server: Server) -> tuple[str, ...]:
    return ("--url", server.url)


def new_org(server: Server, name: str = "acme", credits: str = "5") -> str:
    data = cli_json("org", "create", name, "--credits", credits, *url_args(server))
    assert isinstance(data["id"], str) and data["id"]
    return data["id"]


def api_org(server: Server, name: str) -> str:
    """An organisation made through the admin API: setup for a test of another verb (a
    CLI process costs ~0.3 s; ``org create`` itself is tested through the CLI above)."""
    with server.client(ADMIN_TOKEN) as client:
        response = client.post("/admin/orgs", json={"name": name})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def api_key_count(server: Server, org_id: str) -> int:
    """How many keys the organisation has, as the admin API lists them."""
    with server.client(ADMIN_TOKEN) as client:
        response = client.get("/admin/keys", params={"org_id": org_id})
    assert response.status_code == 200, response.text
    return len(response.json()["data"])


def new_key(server: Server, org_id: str, *extra: str) -> dict:
    return cli_json(
        "key", "create", "--org", org_id, "--name", "n", "--mode", "sandbox",
        *extra, *url_args(server),
    )  # fmt: skip


def assert_invalid_key(server: Server, token: str) -> None:
    response = server.get("/v1/key", token)
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["type"] == "authentication_error"
    assert error["param"] is None


# -- help -------------------------------------------------------------------------------


def test_top_level_help_lists_the_verbs() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage:")
    commands = result.stdout.split("Commands:", 1)[1]
    for verb in ("serve", "org", "key"):
        assert re.search(rf"^\s+{verb}\s+\S", commands, re.M), result.stdout


@pytest.mark.parametrize(("verb", "described"), VERBS, ids=[" ".join(v) for v, _ in VERBS])
def test_every_verb_has_help(verb: tuple[str, ...], described: str) -> None:
    result = run_cli(*verb, "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Usage:"), result.stdout
    assert " ".join(verb) in lines[0], lines[0]
    # a description paragraph between the usage line and the options
    description = result.stdout.split("\n\n", 2)[1]
    assert not description.lstrip().startswith("Options:"), result.stdout
    assert re.search(described, description, re.I), description


# -- the admin verbs against a running server ----------------------------------------------


def test_demo_sandbox_key_printed_at_start_works(server: Server) -> None:
    assert server.token is not None and server.token.startswith("svc_test_")
    response = server.get("/v1/key", server.token)
    assert response.status_code == 200, response.text
    assert response.json()["mode"] == "sandbox"


def test_org_verbs_print_one_json_object(server: Server, tmp_path: Path) -> None:
    created = cli_json("org", "create", "acme", "--credits", "5", *url_args(server))
    org_id = created["id"]
    assert org_id
    assert created["balance_usd"] == pytest.approx(5.0)

    credits = cli_json("org", "credits", org_id, "--add", "2", *url_args(server))
    assert credits["balance_usd"] == pytest.approx(7.0)

    policy = {
        "contract_blocked_models": ["gpt-4o"],
        "max_cost_per_request_usd": 0.5,
        "budget_usd_month": 100,
        "org_rpm": 30,
    }
    policy_file = tmp_path / "p.json"
    policy_file.write_text(json.dumps(policy))
    echoed = cli_json("org", "policy", org_id, "--file", str(policy_file), *url_args(server))
    assert echoed == policy

    byok = cli_json(
        "org", "byok", org_id, "--provider", "mock", "--api-key-env", "X", *url_args(server)
    )
    assert byok["provider"] == "mock"
    assert byok["api_key_env"] == "X"


def test_org_create_without_json_is_not_json(server: Server) -> None:
    result = run_cli("org", "create", "plain", *url_args(server))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^id: org_\S+$", result.stdout, re.M), result.stdout
    assert re.search(r"^residency: null$", result.stdout, re.M), result.stdout
    assert "None" not in result.stdout


def test_key_create_disable_enable_list(server: Server) -> None:
    org_id = new_org(server)
    created = new_key(server, org_id, "--rpm", "5")
    assert {"id", "prefix", "token"} <= created.keys()
    token = created["token"]
    assert token.startswith("svc_test_")
    assert created["prefix"] == token.removeprefix("svc_test_").split("_", 1)[0]
    assert created["status"] == "active"

    response = server.get("/v1/key", token)
    assert response.status_code == 200, response.text
    assert response.json()["caps"]["rpm"] == 5
    assert response.json()["id"] == created["id"]

    disabled = cli_json("key", "disable", created["id"], *url_args(server))
    assert disabled["status"] == "disabled"
    assert_invalid_key(server, token)

    enabled = cli_json("key", "enable", created["id"], *url_args(server))
    assert enabled["status"] == "active"
    assert server.get("/v1/key", token).status_code == 200

    listed = cli_json("key", "list", "--org", org_id, *url_args(server))
    assert [row["id"] for row in listed["data"]] == [created["id"]]
    assert "token" not in listed["data"][0]


def test_key_revoke_is_immediate_and_final(server: Server) -> None:
    org_id = new_org(server)
    created = new_key(server, org_id)
    token = created["token"]
    assert server.get("/v1/key", token).status_code == 200

    revoked = cli_json("key", "revoke", created["id"], *url_args(server))
    assert revoked["status"] == "revoked"
    assert_invalid_key(server, token)

    result = run_cli("key", "enable", created["id"], "--json", *url_args(server))
    assert_one_line_error(result, "key_revoked")
    assert json.loads(result.stdout)["error"]["code"] == "key_revoked"
    assert_invalid_key(server, token)

    listed = cli_json("key", "list", "--org", org_id, *url_args(server))
    assert [(row["id"], row["status"]) for row in listed["data"]] == [(created["id"], "revoked")]


def test_key_rotate_gives_a_new_token_and_keeps_the_old(server: Server) -> None:
    org_id = new_org(server)
    old = new_key(server, org_id, "--rpm", "7")
    new = cli_json("key", "rotate", old["id"], *url_args(server))
    assert {"id", "prefix", "token"} <= new.keys()
    assert new["id"] != old["id"]
    assert new["token"] != old["token"]
    assert new["token"].startswith("svc_test_")
    # the family code (first six characters of the prefix) survives rotation
    assert new["prefix"][:6] == old["prefix"][:6]

    for token, key_id in ((old["token"], old["id"]), (new["token"], new["id"])):
        response = server.get("/v1/key", token)
        assert response.status_code == 200, response.text
        assert response.json()["id"] == key_id
        assert response.json()["caps"]["rpm"] == 7

    listed = cli_json("key", "list", "--org", org_id, *url_args(server))
    assert {row["id"] for row in listed["data"]} == {old["id"], new["id"]}


def test_key_create_with_settings(server: Server) -> None:
    org_id = new_org(server)
    created = new_key(
        server, org_id,
        "--scopes", "inference,usage:read", "--usd-day", "1.5", "--tpm", "1000",
        "--max-output-tokens", "256", "--allowed-models", "gpt-4o-mini",
        "--required-tag", "team=a", "--default-tag", "env=ci", "--environment", "test",
        "--allowed-tools", "search__lookup,mock__*",
    )  # fmt: skip
    response = server.get("/v1/key", created["token"])
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["scopes"] == ["inference", "usage:read"]
    assert view["caps"]["usd_day"] == pytest.approx(1.5)
    assert view["caps"]["tpm"] == 1000
    assert view["caps"]["max_output_tokens"] == 256
    assert view["allowed_model_keys"] == ["gpt-4o-mini"]
    assert view["allowed_tools"] == ["search__lookup", "mock__*"]
    assert view["required_tags"] == {"team": "a"}
    assert view["default_tags"] == {"env": "ci"}
    assert view["environment"] == "test"


def test_admin_refusals_are_one_line_errors(server: Server) -> None:
    result = run_cli("org", "credits", "org_nope", "--add", "1", *url_args(server))
    assert_one_line_error(result, "404", "org_nope")
    result = run_cli(
        "key", "create", "--org", "org_nope", "--name", "n", "--mode", "live", *url_args(server)
    )
    assert_one_line_error(result, "404")
    wrong = base_env(admin_token="not-the-admin-token")
    result = run_cli("key", "list", "--org", "x", *url_args(server), env=wrong)
    assert_one_line_error(result, "401")
    result = run_cli("key", "list", "--org", "x", *url_args(server), env=base_env(None))
    assert_one_line_error(result, "SVC_ADMIN_TOKEN")


def test_under_json_an_error_is_also_one_json_object_on_stdout(server: Server) -> None:
    result = run_cli("key", "revoke", "key_nope", "--json", *url_args(server))
    assert_one_line_error(result, "404")
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "not_found" and "key_nope" in error["message"]
    assert error["exit_status"] == 1


def test_key_list_of_an_unknown_organisation_is_404(server: Server) -> None:
    assert_one_line_error(run_cli("key", "list", "--org", "org_nope", *url_args(server)), "404")


@pytest.mark.parametrize(
    "args",
    [
        ("org", "create", "x", "--credits", "nan"),
        ("org", "create", "x", "--credits", "1e30"),
        ("org", "credits", "ORG", "--add", "inf"),
        ("key", "create", "--org", "ORG", "--name", "n", "--mode", "sandbox", "--usd-day", "nan"),
        (
            "key",
            "create",
            "--org",
            "ORG",
            "--name",
            "n",
            "--mode",
            "sandbox",
            "--usd-month",
            "1e400",
        ),
        ("key", "create", "--org", "ORG", "--name", "n", "--mode", "sandbox", "--tpm", "9" * 23),
        ("key", "create", "--org", "ORG", "--name", "n", "--mode", "sandbox", "--rpm", "-1"),
    ],
    ids=lambda args: " ".join(args[:2] + args[-2:]),
)
def test_out_of_range_amounts_and_counts_are_usage_errors(server: Server, args: tuple) -> None:
    """nan would have been sent as null (no cap at all); huge ones crashed the CLI."""
    org_id = api_org(server, "bounds")
    before = api_key_count(server, org_id)
    result = run_cli(*(org_id if a == "ORG" else a for a in args), *url_args(server))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert api_key_count(server, org_id) == before


def test_the_server_refuses_amounts_its_store_cannot_hold(server: Server) -> None:
    """Through the admin API (no CLI check in between): a 400, and nothing created."""
    with server.client(ADMIN_TOKEN) as client:
        count = len(client.get("/admin/orgs").json()["data"])
        response = client.post("/admin/orgs", json={"name": "huge", "credits_usd": 1e30})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "credits_usd"
        assert len(client.get("/admin/orgs").json()["data"]) == count
        org_id = client.post("/admin/orgs", json={"name": "fine"}).json()["id"]
        response = client.post(f"/admin/orgs/{org_id}/credits", json={"add_usd": 1e30})
        assert response.json()["error"]["param"] == "add_usd"
        response = client.put(f"/admin/orgs/{org_id}/policy", json={"budget_usd_month": 1e30})
        assert response.json()["error"]["param"] == "budget_usd_month"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("org", "byok", "ORG", "--provider", "nope", "--api-key-env", "X"), "provider"),
        (("org", "byok", "ORG", "--provider", "mock", "--api-key-env", "bad name"), "api_key_env"),
    ],
    ids=["unknown provider", "not a variable name"],
)
def test_settings_that_could_never_work_are_refused(
    server: Server, args: tuple, needle: str
) -> None:
    org_id = api_org(server, "never")
    result = run_cli(*(org_id if a == "ORG" else a for a in args), *url_args(server))
    assert_one_line_error(result, "400", needle)


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:notaport"])
def test_a_malformed_gateway_url_is_a_one_line_error(url: str) -> None:
    assert_one_line_error(run_cli("key", "list", "--org", "o", "--url", url), "URL")


def test_something_else_at_the_url_is_a_one_line_error(tmp_path: Path) -> None:
    """Not the gateway (here a static file server): one line, not the page."""
    page = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert page.stdout is not None
        port = re.search(r"port (\d+)", page.stdout.readline()).group(1)  # type: ignore[union-attr]
        result = run_cli("key", "list", "--org", "o", "--url", f"http://127.0.0.1:{port}")
        assert_one_line_error(result, "without the gateway's error shape")
    finally:
        page.terminate()
        page.wait(timeout=10)
        page.stdout.close()


def test_no_such_endpoint_names_the_url_and_what_to_check(server: Server) -> None:
    """A URL ending in /v1 is not the admin API being off: say what is known."""
    result = run_cli("org", "create", "x", "--json", "--url", f"{server.url}/v1")
    line = assert_one_line_error(
        result, "no such endpoint", f"{server.url}/v1/admin/orgs", "--url", "without /v1",
        "SVC_ADMIN_TOKEN",
    )  # fmt: skip
    assert "not enabled" not in line
    assert result.returncode == 1
    error = json.loads(result.stdout)["error"]
    assert error["exit_status"] == 1 and "no such endpoint" in error["message"]
    # org webhook takes the gateway's address as --gateway-url: the hint names that flag
    args = ("org", "webhook", "o", "--url", "http://127.0.0.1:9/h")
    result = run_cli(*args, "--gateway-url", f"{server.url}/v1")
    assert_one_line_error(result, "no such endpoint", "--gateway-url")


ODD_IDS = ["a?b", "a/b", "a#b", "a&b=c", "a b", "a%2Fb", "..", "."]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_an_id_is_sent_as_one_path_segment(server: Server, odd: str, tmp_path: Path) -> None:
    """Ids reach the server as typed: its answer is about that id, not another path."""
    policy = tmp_path / "p.json"
    policy.write_text("{}")
    for args, what in (
        (("org", "credits", odd, "--add", "1"), "organization"),
        (("org", "policy", odd, "--file", str(policy)), "organization"),
        (("org", "webhook", odd, "--url", "http://127.0.0.1:9/h"), "organization"),
        (("key", "revoke", odd), "key"),
        (("key", "list", "--org", odd), "organization"),
        (("model", "disable", odd), "model"),
    ):
        if args[0] == "org" and args[1] == "webhook":
            result = run_cli(*args, "--json", "--gateway-url", server.url)
        else:
            result = run_cli(*args, "--json", *url_args(server))
        assert_one_line_error(result, "404", f"No {what} {odd}.")
        assert json.loads(result.stdout)["error"]["code"] == "not_found"


def test_an_org_id_cannot_inject_query_parameters(server: Server) -> None:
    org_id = api_org(server, "injected")
    new_key(server, org_id)
    result = run_cli("key", "list", "--org", f"{org_id}&x=1", "--json", *url_args(server))
    assert_one_line_error(result, "404", f"{org_id}&x=1")
    assert "data" not in json.loads(result.stdout)


def test_an_empty_id_is_a_usage_error(server: Server) -> None:
    result = run_cli("key", "revoke", "", "--json", *url_args(server))
    assert_one_line_error(result, "empty")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["exit_status"] == 2


@pytest.mark.parametrize("token", ["jeton-\u00e9t\u00e9", "a\nb", "\u4ee4\u724c"])
def test_an_admin_token_that_cannot_be_sent_is_a_one_line_error(server: Server, token: str) -> None:
    result = run_cli(
        "key", "list", "--org", "o", "--json", *url_args(server), env=base_env(admin_token=token)
    )
    assert_one_line_error(result, "SVC_ADMIN_TOKEN", "ASCII")
    assert json.loads(result.stdout)["error"]["exit_status"] == result.returncode


@pytest.mark.parametrize(
    "args",
    [
        ("org", "credits", "ORG", "--add", "-5"),
        ("org", "credits", "ORG"),
        ("org", "create", "x", "--credits", "nan"),
        ("key", "create", "--org", "o", "--name", "n", "--mode", "sandbox", "--rpm", "-1"),
        ("key", "create", "--org", "o", "--name", "n", "--mode", "bogus"),
        ("key", "create", "--org", "o", "--name", "n"),
        ("org", "policy", "ORG", "--file", "missing.json"),
        ("key", "list", "--org", "o", "--bogus"),
        ("serve", "--port", "abc"),
        ("bogus",),
    ],
    ids=" ".join,
)
def test_under_json_a_usage_error_is_also_one_json_object(args: tuple[str, ...]) -> None:
    """click's own refusals, before any verb runs: the same object as the CLI's own."""
    result = run_cli(*args, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "Error: " in result.stderr  # click's message and usage hint stay on stderr
    data = json.loads(result.stdout)  # the whole stdout: one object
    assert set(data) == {"error"}
    assert set(data["error"]) == {"message", "code", "exit_status"}
    assert data["error"]["exit_status"] == 2
    assert data["error"]["message"] and data["error"]["message"] in result.stderr
    # without --json, stdout stays empty
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""


# -- the server URL ----------------------------------------------------------------------


def test_gateway_url_from_environment(server: Server) -> None:
    env = base_env(SVC_GATEWAY_URL=server.url)
    data = cli_json("org", "create", "from-env", env=env)
    assert data["id"]
    # the flag wins over the variable
    env = base_env(SVC_GATEWAY_URL="http://127.0.0.1:1")
    assert cli_json("org", "create", "from-flag", *url_args(server), env=env)["id"]
    # and the variable really is what is used without the flag
    result = run_cli("org", "create", "nowhere", env=env)
    assert_one_line_error(result, "http://127.0.0.1:1")


# -- server lifecycle -----------------------------------------------------------------------


def test_admin_api_absent_without_admin_token(tmp_path: Path) -> None:
    srv = start_server(tmp_path, env=base_env(admin_token=None))
    try:
        for method, path in (("POST", "/admin/orgs"), ("GET", "/admin/keys")):
            with srv.client(ADMIN_TOKEN) as client:
                response = client.request(method, path, json={"name": "x"})
            assert response.status_code == 404, response.text
        # the CLI (which has a token) names the missing endpoint and SVC_ADMIN_TOKEN
        result = run_cli("org", "create", "x", "--json", "--url", srv.url)
        line = assert_one_line_error(result, "no such endpoint", "SVC_ADMIN_TOKEN")
        assert "SVC_ADMIN_TOKEN" in json.loads(result.stdout)["error"]["message"], line
        # the rest of the server works
        assert srv.get("/v1/key", srv.token).status_code == 200
    finally:
        status = srv.stop(signal.SIGTERM)
    assert status == 0, srv.stderr()


SLASHED_CONFIG = """
[[providers]]
name = "mock"
kind = "mock"

[[models]]
id = "meta/llama-x"
provider = "mock"
input_usd_per_mtok = 0.1
output_usd_per_mtok = 0.2

[[models]]
id = "plain"
provider = "mock"
input_usd_per_mtok = 0.1
output_usd_per_mtok = 0.2
"""


def test_a_model_id_with_a_slash_is_switched_off_and_on(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(SLASHED_CONFIG)
    srv = start_server(tmp_path, "--config", str(config), "--demo")
    try:
        assert srv.token is not None
        chat = {"model": "meta/llama-x", "messages": [{"role": "user", "content": "hi"}]}

        def call() -> httpx.Response:
            with srv.client(srv.token) as client:
                return client.post("/v1/chat/completions", json=chat)

        assert call().status_code == 200
        off = cli_json("model", "disable", "meta/llama-x", "--url", srv.url)
        assert (off["id"], off["enabled"]) == ("meta/llama-x", False)
        response = call()
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "model_unavailable"
        listed = cli_json("model", "list", "--url", srv.url)["data"]
        assert {row["id"]: row["enabled"] for row in listed} == {
            "meta/llama-x": False,
            "plain": True,
        }
        on = cli_json("model", "enable", "meta/llama-x", "--url", srv.url)
        assert (on["id"], on["enabled"]) == ("meta/llama-x", True)
        assert call().status_code == 200
        # the action part still routes: an unknown action is 404, another method 405
        with srv.client(ADMIN_TOKEN) as client:
            for method, path, status in (
                ("POST", "/admin/models/meta/llama-x/bogus", 404),
                ("POST", "/admin/models/meta/llama-x", 404),
                ("GET", "/admin/models/meta/llama-x/disable", 405),
                ("POST", "/admin/models/meta/nope/disable", 404),
                ("POST", "/admin/keys/a/b/rotatex", 404),
                ("GET", "/admin/orgs/a/b/credits", 405),
            ):
                response = client.request(method, path)
                assert response.status_code == status, (method, path, response.text)
            response = client.post("/admin/models/meta/nope/disable")
            assert response.json()["error"]["message"] == "No model meta/nope."
    finally:
        assert srv.stop() == 0, srv.stderr()


@pytest.mark.parametrize(
    ("args", "config", "needle"),
    [
        (("--host", ""), None, "server.host"),
        (("--db", ""), None, "server.db"),
        ((), 'providers = [1]\n[[models]]\nid = "m"\nprovider = "mock"\n', "providers[0]"),
        ((), 'models = [1]\n[[providers]]\nname = "mock"\nkind = "mock"\n', "models[0]"),
        (
            (),
            '[[providers]]\nname = ""\nkind = "mock"\n[[models]]\nid = "m"\nprovider = ""\n',
            "providers[0].name",
        ),
    ],
    ids=["empty host", "empty db", "providers of numbers", "models of numbers", "empty name"],
)
def test_serve_refuses_a_bad_setting_in_one_line(
    tmp_path: Path, args: tuple[str, ...], config: str | None, needle: str
) -> None:
    """Refused before listening: exit 2 and one line naming the setting (no traceback)."""
    if config is not None:
        (tmp_path / "gateway.toml").write_text(config)
        args = (*args, "--config", "gateway.toml")
    result = run_cli("serve", "--port", "0", *args, "--json", cwd=tmp_path, timeout=15)
    line = assert_one_line_error(result, needle)
    assert result.returncode == 2, line
    assert json.loads(result.stdout)["error"]["exit_status"] == 2
    assert not (tmp_path / "svc-gateway.db").exists()


def test_a_second_server_on_the_same_database_is_refused(tmp_path: Path) -> None:
    """Each server holds its spend windows in memory: two on one database could each
    admit what the other does not see. The second one (here naming the same file by a
    relative path) exits at once, and the first keeps serving."""
    lock = tmp_path / "g.db.lock"
    first = start_server(tmp_path)
    try:
        assert lock.read_text().strip() == str(first.proc.pid)
        try:
            result = run_cli(
                "serve", "--port", "0", "--db", "g.db", "--json", cwd=tmp_path, timeout=15
            )
        except subprocess.TimeoutExpired:
            pytest.fail("a second server started on the same database")
        line = assert_one_line_error(result, "another svc-gateway server", "g.db")
        assert f"pid {first.proc.pid}" in line
        assert json.loads(result.stdout)["error"]["exit_status"] == result.returncode
        assert first.get("/v1/key", first.token).status_code == 200
        # another database beside it is fine
        other = start_server(tmp_path, db=tmp_path / "other.db")
        assert other.stop() == 0, other.stderr()
    finally:
        first.kill()  # no clean exit: the lock file stays, the lock dies with the process
    assert lock.exists()
    again = start_server(tmp_path)
    assert lock.read_text().strip() == str(again.proc.pid)
    assert again.stop() == 0, again.stderr()
    assert not lock.exists()  # a clean exit removes it


def test_serve_json_prints_one_object_once_listening(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--json", "--port", "0", "--db", "g.db"],
        cwd=tmp_path, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert set(info) == {"url", "database", "sandbox_key"}
        assert info["database"] == str(tmp_path / "g.db")
        assert info["sandbox_key"].startswith("svc_test_")
        response = httpx.get(
            f"{info['url']}/v1/key", headers={"Authorization": f"Bearer {info['sandbox_key']}"}
        )
        assert response.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_when_idle(tmp_path: Path, sig: signal.Signals) -> None:
    srv = start_server(tmp_path)
    assert srv.get("/v1/key", srv.token).status_code == 200
    status = srv.stop(sig)
    assert status == 0, srv.stderr()
    assert "Traceback" not in srv.stderr()


def test_restart_on_same_database_keeps_state(tmp_path: Path) -> None:
    first = start_server(tmp_path)
    try:
        assert first.token is not None
        org_id = new_org(first, "survivor")
        made = new_key(first, org_id, "--rpm", "9")
    finally:
        assert first.stop() == 0, first.stderr()

    second = start_server(tmp_path)
    try:
        assert second.token is None, second.stdout_lines
        assert not any("svc_test_" in line for line in second.stdout_lines), second.stdout_lines
        assert second.get("/v1/key", first.token).status_code == 200
        response = second.get("/v1/key", made["token"])
        assert response.status_code == 200, response.text
        assert response.json()["caps"]["rpm"] == 9
        listed = cli_json("key", "list", "--org", org_id, "--url", second.url)
        assert [row["id"] for row in listed["data"]] == [made["id"]]
    finally:
        assert second.stop() == 0, second.stderr()


# -- demo data and the sandbox key ----------------------------------------------------------

LIVE_CONFIG = """
[[providers]]
name = "acme-upstream"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"

[[models]]
id = "live-model"
provider = "acme-upstream"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""


def org_names(server: Server) -> list[str]:
    with server.client(ADMIN_TOKEN) as client:
        return [org["name"] for org in client.get("/admin/orgs").json()["data"]]


def text_start(tmp_path: Path, *args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """``serve`` in text mode (no --json), stdout a pipe unless given a terminal."""
    command = [sys.executable, "-m", "gateway", "serve", "--port", "0", "--db", "g.db", *args]
    return subprocess.Popen(
        command, cwd=tmp_path, env=base_env(), stdout=stdout, stderr=subprocess.DEVNULL, text=True
    )


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()
    assert status == 0


def start_lines(tmp_path: Path, *args: str) -> list[str]:
    """The three lines ``serve`` prints in text mode into a pipe once listening."""
    proc = text_start(tmp_path, *args)
    try:
        assert proc.stdout is not None
        return [proc.stdout.readline() for _ in range(3)]
    finally:
        stop(proc)


def test_a_live_config_creates_no_demo_data_and_prints_no_token(tmp_path: Path) -> None:
    """Under an operator's configuration the first start on an empty database creates no
    demo organisation (no credits, no key that manages keys) and prints no token."""
    (tmp_path / "live.toml").write_text(LIVE_CONFIG)
    srv = start_server(tmp_path, "--config", "live.toml")
    try:
        assert srv.token is None, srv.stdout_lines
        assert org_names(srv) == []
    finally:
        assert srv.stop() == 0, srv.stderr()
    lines = start_lines(tmp_path, "--config", "live.toml")  # the same, in text mode
    assert lines[0].startswith("svc-gateway listening on "), lines
    assert "svc_" not in "".join(lines)
    assert "org create" in lines[2], lines


def test_serve_demo_creates_the_demo_under_a_config_file(tmp_path: Path) -> None:
    (tmp_path / "live.toml").write_text(LIVE_CONFIG)
    srv = start_server(tmp_path, "--config", "live.toml", "--demo")
    try:
        assert srv.token is not None and srv.token.startswith("svc_test_")
        assert org_names(srv) == ["demo"]
        assert srv.get("/v1/key", srv.token).status_code == 200
    finally:
        assert srv.stop() == 0, srv.stderr()


def test_the_sandbox_key_is_not_printed_into_a_pipe(tmp_path: Path) -> None:
    """stdout a pipe or a file (a log): the demo is created but its token not printed;
    ``--json`` (asked-for machine output) is the way to receive it."""
    lines = start_lines(tmp_path)
    assert lines[0].startswith("svc-gateway listening on "), lines
    assert "svc_test_" not in "".join(lines)
    assert "not a terminal" in lines[2] and "--json" in lines[2], lines
    lines = start_lines(tmp_path)  # the next start on that database
    assert "existing database" in lines[2] and "key create" in lines[2], lines


def test_a_terminal_gets_the_sandbox_key(tmp_path: Path) -> None:
    primary, secondary = pty.openpty()
    try:
        proc = text_start(tmp_path, stdout=secondary)
        output = b""
        try:
            while b"try: curl" not in output:
                ready, _, _ = select.select([primary], [], [], 20)
                assert ready, output
                output += os.read(primary, 4096)
            match = re.search(rb"sandbox key \(shown once\): (svc_test_\S+)", output)
            url = re.search(rb"listening on (http://127\.0\.0\.1:\d+)", output)
            assert match and url, output
            response = httpx.get(
                url.group(1).decode() + "/v1/key",
                headers={"Authorization": f"Bearer {match.group(1).decode()}"},
            )
            assert response.status_code == 200, response.text
        finally:
            stop(proc)
    finally:
        os.close(primary)
        os.close(secondary)
