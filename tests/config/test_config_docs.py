"""The configuration's documentation cannot drift from the loader: ``config example`` (and
its commented-out tables), every ```toml snippet of README.md and docs/ (docs/providers/
too), every policy snippet of docs/CONFIG.md, and every key the loader takes is in
docs/CONFIG.md. The README's command blocks are run as typed, in a fresh shell."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import orjson
import pytest

from gateway.accounts.orgs import POLICY_KEYS, validate_policy
from gateway.config.example import EXAMPLE
from gateway.config.settings import (
    DEPLOYMENT_KEYS,
    MODEL_KEYS,
    PROVIDER_KINDS,
    ROUTING_STRATEGIES,
    TABLES,
    ServerConfig,
    load_config,
    provider_keys,
)
from tests.support.procs import REPO_ROOT, base_env

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
DOCS += sorted((REPO_ROOT / "docs" / "providers").glob("*.md"))
CONFIG_MD = REPO_ROOT / "docs" / "CONFIG.md"


def fenced(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.M | re.S)


def uncommented(text: str) -> str:
    """The example with its commented-out settings and tables turned on (``#key`` and
    ``#[table]`` lines; prose comments start with ``# `` and stay)."""
    return "".join(
        line[1:] if re.match(r"#[\[a-z]", line) else line for line in text.splitlines(keepends=True)
    )


def loads(text: str, tmp_path: Path) -> None:
    """Through the real loader: a file, read as ``serve --config`` reads it."""
    path = tmp_path / "snippet.toml"
    path.write_text(text)
    load_config(path, environ={})


def test_the_example_loads_with_and_without_its_commented_tables(tmp_path: Path) -> None:
    loads(EXAMPLE, tmp_path)
    whole = uncommented(EXAMPLE)
    assert whole != EXAMPLE
    loads(whole, tmp_path)
    config = tomllib.loads(whole)
    assert {p["kind"] for p in config["providers"]} == set(PROVIDER_KINDS)


def test_the_example_holds_every_key(tmp_path: Path) -> None:
    config = tomllib.loads(uncommented(EXAMPLE))
    assert set(config) == set(TABLES)  # a table added to the loader is added here too
    assert set(config["server"]) == set(ServerConfig.__dataclass_fields__)
    assert set(config["cluster"]) == {"node_id", "lease_s"}
    for provider in config["providers"]:
        assert set(provider) <= set(provider_keys(provider["kind"])), provider
    every = set().union(*(provider_keys(kind) for kind in PROVIDER_KINDS))
    assert set().union(*config["providers"]) == every
    assert set().union(*config["models"]) == set(MODEL_KEYS)
    deployments = [d for model in config["models"] for d in model.get("deployments", [])]
    assert set().union(*deployments) == set(DEPLOYMENT_KEYS)


SNIPPETS = [(path, n, text) for path in DOCS for n, text in enumerate(fenced(path, "toml"))]


@pytest.mark.parametrize(
    ("path", "index", "text"),
    SNIPPETS,
    ids=[f"{p.relative_to(REPO_ROOT)}#{n}" for p, n, _ in SNIPPETS],
)
def test_every_toml_snippet_of_the_docs_loads(
    path: Path, index: int, text: str, tmp_path: Path
) -> None:
    loads(text, tmp_path)


def test_there_are_snippets_to_check() -> None:
    assert {path.name for path, _, _ in SNIPPETS} >= {"clients.md", "CONFIG.md", "openai.md"}


def test_the_policy_snippets_validate_and_every_policy_key_is_documented() -> None:
    snippets = fenced(CONFIG_MD, "json")
    assert snippets
    for text in snippets:
        validate_policy(orjson.loads(text))
    reference = CONFIG_MD.read_text()
    for key in POLICY_KEYS:
        assert f"| `{key}` |" in reference, key


def test_every_key_and_override_is_in_the_reference() -> None:
    reference = CONFIG_MD.read_text()
    keys = {*ServerConfig.__dataclass_fields__, "node_id", "lease_s", *MODEL_KEYS}
    keys |= {*DEPLOYMENT_KEYS, *ROUTING_STRATEGIES}
    keys |= set().union(*(provider_keys(kind) for kind in PROVIDER_KINDS))
    for key in keys:
        assert f"`{key}`" in reference, key
    for kind in PROVIDER_KINDS:
        assert f"| `{kind}` |" in reference or f"| `{kind}` (" in reference, kind
    settings = (REPO_ROOT / "gateway" / "config" / "settings.py").read_text()
    block = settings[settings.index("_ENV_SERVER: dict") :]
    names = re.findall(r'^    "(\w+)":', block[: block.index("}")], re.M)
    assert names
    for name in names:
        assert f"`SVC_SERVER_{name.upper()}`" in reference, name
    for name in ("SVC_CLUSTER_NODE_ID", "SVC_CLUSTER_LEASE_S", "SVC_CONFIG"):
        assert f"`{name}`" in reference, name


def readme_block(heading: str, page: str = "README.md") -> str:
    """The first ```sh block after ``heading`` in README.md (or another ``page``)."""
    text = (REPO_ROOT / page).read_text()
    section = text[text.index(heading) :]
    return fenced_text(section)


def fenced_text(text: str) -> str:
    match = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert match is not None
    return match.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_the_readme_operator_blocks_work_as_typed(tmp_path: Path) -> None:
    """The README's operator block, then the Claude Code block of docs/clients.md and the
    configuration block of docs/providers/openai.md (in the walk-through's shell), typed
    into a fresh bash in a checkout whose ``.venv`` holds this test's interpreter and the
    command's entry point; the fake key stands for a real one (the provider is never
    called). The walk-through leaves no file in the checkout but its database."""
    bin_dir = tmp_path / ".venv" / "bin"  # what `pip install .` makes of pyproject.toml
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    script_of = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = script_of["svc-gateway"].split(":")
    entry = bin_dir / "svc-gateway"
    entry.write_text(
        f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
    )
    entry.chmod(0o755)
    operator = readme_block("## Operating it from the command line")
    claude_code = readme_block("## Claude Code and the Anthropic SDKs", "docs/clients.md")
    configured = readme_block(
        "## A configuration that serves live keys", "docs/providers/openai.md"
    )
    configured = configured.replace("export OPENAI_API_KEY=sk-...", "export OPENAI_API_KEY=sk-x")
    blocks = operator + claude_code + configured
    script = "set -euo pipefail\nset -m\n" + blocks + "kill %1; wait\n"
    # the README's port is 8080; this run takes a free one (another test may hold 8080)
    port = free_port()
    script = script.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    env = {k: v for k, v in base_env(admin_token=None).items() if k != "PATH"}
    env["PATH"] = "/usr/bin:/bin"  # a fresh shell: no venv on PATH until the README puts it
    env.update(SVC_SERVER_PORT=str(port), SVC_GATEWAY_URL=f"http://127.0.0.1:{port}")
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{out[-3000:]}\n--- stderr ---\n{err[-3000:]}"
    assert '"object":"key"' in out or '"prefix"' in out, out
    assert "svc_live_" in out  # the live key of the configuration block
    assert '"type":"message"' in out  # the Claude Code block's call of /v1/messages
    left = {path.name for path in tmp_path.iterdir()} - {".venv", "snippet.toml"}
    assert {name for name in left if not name.startswith("svc-gateway.db")} == set(), left
