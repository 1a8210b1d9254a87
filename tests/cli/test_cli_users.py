"""The CLI's ``user`` verbs against a real ``serve`` process (tests/support/procs.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.support.procs import (
    Server,
    assert_one_line_error,
    base_env,
    cli_json,
    run_cli,
    start_server,
)

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("cli-users"))
    try:
        yield srv
    finally:
        assert srv.stop(signal.SIGTERM) == 0, srv.stderr()


def env(server: Server, **extra: str) -> dict[str, str]:
    return base_env(SVC_GATEWAY_URL=server.url, **extra)


def test_user_create_list_disable_enable_reset(server: Server) -> None:
    org = cli_json("org", "create", "Acme", env=env(server))["id"]
    made = cli_json(
        "user", "create", "--org", org, "--email", "Ann@Acme.example", "--role", "owner",
        env=env(server),
    )  # fmt: skip
    assert {"id", "email", "role", "password"} <= set(made)
    assert made["email"] == "ann@acme.example" and len(made["password"]) == 24
    given = cli_json(
        "user", "create", "--org", org, "--email", "bo@acme.example", "--role", "viewer",
        "--password-env", "BO_PASSWORD", env=env(server, BO_PASSWORD="a good long passphrase"),
    )  # fmt: skip
    assert "password" not in given
    listed = cli_json("user", "list", "--org", org, env=env(server))["data"]
    assert [(u["email"], u["role"]) for u in listed] == [
        ("ann@acme.example", "owner"),
        ("bo@acme.example", "viewer"),
    ]
    text = run_cli("user", "list", "--org", org, env=env(server))
    assert text.returncode == 0 and "email=bo@acme.example  role=viewer" in text.stdout
    assert cli_json("user", "disable", made["id"], env=env(server))["status"] == "disabled"
    assert cli_json("user", "enable", made["id"], env=env(server))["status"] == "active"
    reset = cli_json("user", "reset-password", made["id"], env=env(server))
    assert len(reset["password"]) == 24 and reset["password"] != made["password"]


def test_user_refusals_are_one_line(server: Server) -> None:
    org = cli_json("org", "create", "Refusals", env=env(server))["id"]
    unset = run_cli(
        "user", "create", "--org", org, "--email", "a@b.example", "--role", "admin",
        "--password-env", "NOT_SET_ANYWHERE", env=env(server),
    )  # fmt: skip
    assert unset.returncode == 2
    assert_one_line_error(unset, "NOT_SET_ANYWHERE")
    short = run_cli(
        "user", "create", "--org", org, "--email", "a@b.example", "--role", "admin",
        "--password-env", "PW", env=env(server, PW="short"),
    )  # fmt: skip
    assert_one_line_error(short, "400 invalid_request", "12 to 1024")
    assert "short" not in short.stderr  # a password is never echoed
    bad_role = run_cli(
        "user", "create", "--org", org, "--email", "a@b.example", "--role", "root",
        env=env(server),
    )  # fmt: skip
    assert bad_role.returncode == 2
    missing = run_cli("user", "disable", "user_nope", env=env(server))
    assert_one_line_error(missing, "404 not_found", "user_nope")
