"""The routing keys of ``[[models]]`` (issue 35): deployments, strategy, attempts,
first-byte timeout, fallbacks, context window; each mistake names its key."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from gateway.config.settings import ConfigError, DeploymentConfig, parse_config

PROVIDERS = """
[[providers]]
name = "east"
kind = "openai"
base_url = "https://east.example.com/v1"

[[providers]]
name = "west"
kind = "openai"
base_url = "https://west.example.com/v1"
"""

ROUTED = """
[[models]]
id = "big"
input_usd_per_mtok = 1
output_usd_per_mtok = 2
routing = "least_busy"
max_attempts = 4
first_byte_timeout_s = 7.5
fallbacks = ["small"]
context_window = 128000

[[models.deployments]]
provider = "east"
upstream_id = "big-1"
weight = 3
rpm = 100
tpm = 5000

[[models.deployments]]
provider = "west"

[[models]]
id = "small"
provider = "west"
"""


def parse(text: str) -> Any:
    return parse_config(tomllib.loads(PROVIDERS + text))


def test_deployments_and_routing_keys_are_read() -> None:
    big, small = parse(ROUTED).models
    assert big.deployments == (
        DeploymentConfig("east", "big-1", 3.0, 100, 5000),
        DeploymentConfig("west", "big"),
    )
    assert (big.provider, big.upstream_id) == ("east", "big-1")  # the first deployment
    assert (big.routing, big.max_attempts, big.first_byte_timeout_s) == ("least_busy", 4, 7.5)
    assert (big.fallbacks, big.context_window) == (("small",), 128000)
    # the single-upstream form: one deployment, weighted, three attempts
    assert small.routes() == (DeploymentConfig("west", "small"),)
    assert (small.routing, small.max_attempts, small.fallbacks) == ("weighted", 3, ())


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (('id = "small"\nprovider = "west"', 'id = "small"'), "models[1].provider"),
        (('routing = "least_busy"', 'routing = "fastest"'), "models[0].routing"),
        (("max_attempts = 4", "max_attempts = 0"), "models[0].max_attempts"),
        (
            ("first_byte_timeout_s = 7.5", "first_byte_timeout_s = 0"),
            "models[0].first_byte_timeout_s",
        ),
        (('fallbacks = ["small"]', 'fallbacks = ["nope"]'), "models[0].fallbacks"),
        (('fallbacks = ["small"]', 'fallbacks = ["big"]'), "models[0].fallbacks"),
        (("context_window = 128000", "context_window = -1"), "models[0].context_window"),
        (("weight = 3", "weight = 0"), "models[0].deployments[0].weight"),
        (("rpm = 100", "rpm = 0"), "models[0].deployments[0].rpm"),
        (('provider = "east"', 'provider = "north"'), "models[0].deployments[0].provider"),
        (("tpm = 5000", "region = 1"), "models[0].deployments[0]"),
        (('routing = "least_busy"', 'provider = "east"'), "models[0].deployments"),
    ],
)
def test_routing_mistakes_name_their_key(change: tuple[str, str], where: str) -> None:
    text = ROUTED.replace(*change)
    assert text != ROUTED
    with pytest.raises(ConfigError, match="^" + re.escape(where)):
        parse(text)


def test_a_fallback_is_of_the_same_kind() -> None:
    text = ROUTED.replace(
        'id = "small"\nprovider = "west"', 'id = "small"\nprovider = "west"\nkind = "embedding"'
    )
    with pytest.raises(ConfigError, match="not a chat model"):
        parse(text)


def test_a_model_does_not_mix_the_mock_with_real_providers() -> None:
    mock = '[[providers]]\nname = "mock"\nkind = "mock"\n'
    text = mock + ROUTED.replace(
        'provider = "west"\n\n[[models]]', 'provider = "mock"\n\n[[models]]'
    )
    assert text != mock + ROUTED
    with pytest.raises(ConfigError, match=re.escape("models[0].deployments: mock and real")):
        parse(text)
