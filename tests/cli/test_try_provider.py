"""Trying a configuration before serving it, as docs/operations.md walks it: ``svc-gateway
fake-upstream --kind K`` (a process serving the shipped fake of each kind) and
``svc-gateway provider test NAME`` through the provider table the fake printed: one
small request, its status, latency and usage; refused without consent."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.fakes.local_fake import KINDS
from tests.support.procs import base_env, run_cli

pytestmark = pytest.mark.processes

MODEL = """
[[models]]
id = "try-chat"
provider = "fake-{kind}"
upstream_id = "{upstream}"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""
#: what each kind's provider calls the model (the azure fake serves this deployment)
UPSTREAM = {"azure": "gpt-4o-mini", "bedrock": "anthropic.claude-test", "gemini": "gemini-test"}


@pytest.fixture(params=KINDS)
def fake(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A ``fake-upstream --json`` process of each kind; its JSON line."""
    kind = str(request.param)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "fake-upstream", "--kind", kind, "--json"],
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        yield {"kind": kind, **json.loads(line)}
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # and its pipes closed


def config_for(fake: dict[str, Any], tmp_path: Path) -> Path:
    table = "[[providers]]\n" + "".join(f'{k} = "{v}"\n' for k, v in fake["provider"].items())
    upstream = UPSTREAM.get(fake["kind"], "try-chat")
    path = tmp_path / "gateway.toml"
    path.write_text(table + MODEL.format(kind=fake["kind"], upstream=upstream))
    return path


def test_provider_test_through_each_kinds_fake(fake: dict[str, Any], tmp_path: Path) -> None:
    config = config_for(fake, tmp_path)
    name = fake["provider"]["name"]
    env = base_env(**fake["env"])
    result = run_cli("provider", "test", name, "--config", str(config), "--yes", "--json", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "ok" and answer["provider"] == name
    assert answer["model"] == "try-chat"
    assert answer["latency_ms"] > 0
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] > 0
    if fake["kind"] == "openai":
        return  # its fake takes any key, as a local model server does
    # a wrong credential: the provider's refusal is the answer, status 1
    wrong = {
        name: "wrong:wrong" if ":" in value else "wrong" for name, value in fake["env"].items()
    }
    refused = run_cli(
        "provider", "test", name, "--config", str(config), "--yes", "--json", env=base_env(**wrong)
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert json.loads(refused.stdout)["status"] == "failed"


def test_provider_test_asks_for_consent(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[providers]]\nname = "openai"\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "OPENAI_API_KEY"\n'
        + MODEL.format(kind="x", upstream="m").replace('provider = "fake-x"', 'provider = "openai"')
    )
    result = run_cli(
        "provider", "test", "openai", "--config", str(config), env=base_env(OPENAI_API_KEY="sk")
    )
    assert result.returncode == 1
    assert "costs tokens: add --yes" in result.stderr
