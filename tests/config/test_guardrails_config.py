"""``[[guardrails]]`` in the config file: what is refused at start, by the key's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config.guardrails import GuardrailConfig
from gateway.config.settings import ConfigError, load_config, parse_config

pytestmark = pytest.mark.quick

REFUSED = [
    ({"name": "a", "kind": "magic"}, "guardrails[0].kind: must be one of regex, pii, secrets"),
    ({"name": "a", "kind": "pii", "entities": ["zip"]}, "guardrails[0].entities[0]: unknown"),
    ({"name": "a", "kind": "regex", "patterns": ["(a)\\1"]}, "guardrails[0].patterns[0]: does"),
    ({"name": "a", "kind": "regex", "patterns": ["(unclosed"]}, "guardrails[0].patterns[0]"),
    ({"name": "a", "kind": "regex"}, "guardrails[0].patterns: required"),
    ({"name": "a", "kind": "pii", "on": "sideways"}, "guardrails[0].on: must be one of"),
    ({"name": "a", "kind": "pii", "action": "shout"}, "guardrails[0].action: must be one of"),
    ({"name": "a", "kind": "secrets", "url": "http://x"}, "guardrails[0].url: unknown key"),
    ({"name": "a", "kind": "webhook"}, "guardrails[0].url: required"),
    ({"name": "a", "kind": "webhook", "url": "ftp://x"}, "guardrails[0].url: must be an http"),
    (
        {"name": "a", "kind": "webhook", "url": "http://x", "on_error": "maybe"},
        "guardrails[0].on_error: must be one of deny, allow",
    ),
    (
        {"name": "a", "kind": "webhook", "url": "http://x", "timeout_s": 0},
        "guardrails[0].timeout_s: must be above 0",
    ),
    (
        {"name": "a", "kind": "webhook", "url": "http://x", "stream_chars": 0},
        "guardrails[0].stream_chars: must be from 1 to 16384",
    ),
    (
        {"name": "a", "kind": "webhook", "url": "http://x", "stream_chars": 20_000},
        "guardrails[0].stream_chars: must be from 1 to 16384",
    ),
    (
        {"name": "a", "kind": "pii", "stream_chars": 50},
        "guardrails[0].stream_chars: unknown key",
    ),
    ({"kind": "pii"}, "guardrails[0].name: required"),
    ({"name": "a b", "kind": "pii"}, "guardrails[0].name: 1-64 letters"),
]


@pytest.mark.parametrize(("table", "message"), REFUSED)
def test_a_bad_guardrail_is_refused_with_its_path(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", "\\[").replace("]", "\\]")):
        parse_config({"guardrails": [table]})


def test_duplicate_names_are_refused() -> None:
    tables = [{"name": "a", "kind": "pii"}, {"name": "a", "kind": "secrets"}]
    with pytest.raises(ConfigError, match=r"guardrails\[1\].name: duplicate"):
        parse_config({"guardrails": tables})


def test_the_file_reads_every_kind(tmp_path: Path) -> None:
    file = tmp_path / "gw.toml"
    file.write_text(
        """
[[guardrails]]
name = "pii"
kind = "pii"
on = "both"
action = "redact"
entities = ["email", "credit_card"]

[[guardrails]]
name = "no-secrets"
kind = "secrets"
on = "input"

[[guardrails]]
name = "tickets"
kind = "regex"
patterns = ["ACME-[0-9]{6}"]
action = "flag"

[[guardrails]]
name = "acme-filter"
kind = "webhook"
url = "http://127.0.0.1:7100/check"
timeout_s = 2
on_error = "allow"
stream_chars = 64
"""
    )
    config = load_config(str(file), environ={})
    assert config.guardrails == (
        GuardrailConfig("pii", "pii", "both", "redact", entities=("email", "credit_card")),
        GuardrailConfig("no-secrets", "secrets", "input"),
        GuardrailConfig("tickets", "regex", action="flag", patterns=("ACME-[0-9]{6}",)),
        GuardrailConfig(
            "acme-filter",
            "webhook",
            url="http://127.0.0.1:7100/check",
            timeout_s=2.0,
            on_error="allow",
            stream_chars=64,
        ),
    )
