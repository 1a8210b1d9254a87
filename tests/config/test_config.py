"""`gateway.config.settings`: embedded defaults, the TOML file, environment and flag overrides,
and validation errors that name the key at fault."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.config.settings import (
    Config,
    ConfigError,
    ModelConfig,
    ProviderConfig,
    ServerConfig,
    default_config,
    load_config,
    parse_config,
)

FULL_TOML = """
[server]
host = "0.0.0.0"
port = 9001
db = "/var/lib/svc/gw.db"
request_timeout_s = 120
keepalive_s = 5.5
shards = 4
platform_rpm = 6000

[[providers]]
name = "openai"
kind = "openai"
base_url = "http://127.0.0.1:9001/v1"
api_key_env = "OPENAI_API_KEY"
zero_retention = true
residency = ["us", "eu"]

[[providers]]
name = "mock"
kind = "mock"

[[models]]
id = "gpt-4o-mini"
provider = "openai"
upstream_id = "gpt-4o-mini-2024"
kind = "chat"
capabilities = ["tools", "structured_output", "vision", "web_search"]
zero_retention_available = true
byok_available = true
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60

[[models]]
id = "embed"
provider = "mock"
kind = "embedding"
dimensions = 256
input_usd_per_mtok = 0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


# -- defaults ---------------------------------------------------------------------------


def assert_demo_catalog(config: Config) -> None:
    assert [(p.name, p.kind) for p in config.providers] == [("mock", "mock")]
    assert config.models, "the demo catalog is empty"
    assert {m.provider for m in config.models} == {"mock"}
    assert [m.kind for m in config.models].count("embedding") == 1
    assert any(m.kind == "chat" for m in config.models)
    ids = [m.id for m in config.models]
    assert len(ids) == len(set(ids))
    for model in config.models:
        assert model.input_usd_per_mtok is not None
        assert model.output_usd_per_mtok is not None


def test_embedded_default() -> None:
    config = load_config(None, environ={})
    assert config.server == ServerConfig()
    assert config.server.host == "127.0.0.1"
    assert config.server.port == 8080
    assert config.server.db == "svc-gateway.db"
    assert config.server.request_timeout_s == 300
    assert config.server.keepalive_s == 15
    assert config.source is None
    assert_demo_catalog(config)
    assert config == default_config()


def test_provider_lookup() -> None:
    config = default_config()
    assert config.provider("mock").kind == "mock"
    with pytest.raises(KeyError):
        config.provider("nope")


def test_empty_document_is_the_default() -> None:
    config = parse_config({})
    assert config.server == ServerConfig()
    assert_demo_catalog(config)


def test_server_table_alone_keeps_the_demo_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 0\ndb = "x.db"\n')
    config = load_config(path, environ={})
    assert config.server.port == 0
    assert config.server.db == "x.db"
    assert config.source == str(path)
    assert_demo_catalog(config)


# -- the file ----------------------------------------------------------------------------


def test_file_values(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL_TOML), environ={})
    server = config.server
    assert (server.host, server.port, server.db) == ("0.0.0.0", 9001, "/var/lib/svc/gw.db")
    assert server.request_timeout_s == 120
    assert server.keepalive_s == 5.5
    assert server.shards == 4
    assert server.platform_rpm == 6000
    assert config.providers == (
        ProviderConfig(
            name="openai",
            kind="openai",
            base_url="http://127.0.0.1:9001/v1",
            api_key_env="OPENAI_API_KEY",
            zero_retention=True,
            residency=("us", "eu"),
        ),
        ProviderConfig(name="mock", kind="mock"),
    )
    chat, embed = config.models
    assert chat == ModelConfig(
        id="gpt-4o-mini",
        provider="openai",
        upstream_id="gpt-4o-mini-2024",
        kind="chat",
        capabilities=("tools", "structured_output", "vision", "web_search"),
        zero_retention_available=True,
        byok_available=True,
        input_usd_per_mtok=0.15,
        output_usd_per_mtok=0.60,
    )
    # defaults of a model: upstream id = id, no flags, enabled, unpriced output
    assert embed.upstream_id == "embed"
    assert embed.kind == "embedding"
    assert embed.dimensions == 256
    assert embed.input_usd_per_mtok == 0.0
    assert isinstance(embed.input_usd_per_mtok, float)
    assert embed.output_usd_per_mtok is None
    assert (embed.zero_retention_available, embed.byok_available, embed.enabled) == (
        False,
        False,
        True,
    )


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 7777\n")
    config = load_config(None, environ={"SVC_CONFIG": str(path)})
    assert config.server.port == 7777
    assert config.source == str(path)


def test_explicit_path_wins_over_svc_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 7777\n")
    config = load_config(path, environ={"SVC_CONFIG": str(tmp_path / "missing.toml")})
    assert config.server.port == 7777


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path, environ={})
    assert str(path) in str(info.value)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(path, environ={})
    assert str(path) in str(info.value)


def test_undecodable_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[server]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(path) in str(info.value)


# -- environment and flags ---------------------------------------------------------------


def test_environment_overrides() -> None:
    environ = {
        "SVC_SERVER_HOST": "::1",
        "SVC_SERVER_PORT": "9100",
        "SVC_SERVER_DB": "env.db",
        "SVC_SERVER_REQUEST_TIMEOUT_S": "12.5",
        "SVC_SERVER_KEEPALIVE_S": "3",
        "SVC_SERVER_SHARDS": "2",
        "SVC_SERVER_PLATFORM_RPM": "50",
        "SVC_SERVER_ROTATION_GRACE_S": "60",
        "SVC_SERVER_SHUTDOWN_GRACE_S": "4.5",
        "SVC_SERVER_WORKERS": "3",
    }
    server = load_config(None, environ=environ).server
    assert server.host == "::1"
    assert server.port == 9100
    assert server.db == "env.db"
    assert server.request_timeout_s == 12.5
    assert server.keepalive_s == 3.0
    assert server.shards == 2
    assert server.platform_rpm == 50
    assert server.rotation_grace_s == 60
    assert server.shutdown_grace_s == 4.5
    assert server.workers == 3


def test_workers_from_the_environment_auto_and_below_the_flag() -> None:
    cores = os.cpu_count() or 1
    assert load_config(None, environ={"SVC_SERVER_WORKERS": "auto"}).server.workers == cores
    environ = {"SVC_SERVER_WORKERS": "auto"}
    assert load_config(None, environ=environ, workers=1).server.workers == 1


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_TOML)
    config = load_config(path, environ={"SVC_SERVER_PORT": "9200"})
    assert config.server.port == 9200
    assert config.server.host == "0.0.0.0"  # not overridden: the file's value
    assert [m.id for m in config.models] == ["gpt-4o-mini", "embed"]


def test_flags_win_over_environment(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_TOML)
    environ = {"SVC_SERVER_PORT": "9200", "SVC_SERVER_DB": "env.db", "SVC_SERVER_HOST": "::1"}
    config = load_config(path, environ=environ, port=9300, db="flag.db", host=None)
    assert config.server.port == 9300
    assert config.server.db == "flag.db"
    assert config.server.host == "::1"  # a flag left out (None) does not override


def test_flag_port_zero_is_kept() -> None:
    assert load_config(None, environ={"SVC_SERVER_PORT": "9200"}, port=0).server.port == 0


def test_explicit_environ_ignores_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SVC_SERVER_PORT", "1234")
    monkeypatch.setenv("SVC_CONFIG", "/nonexistent/svc.toml")
    assert load_config(None, environ={}).server.port == 8080


def test_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SVC_CONFIG", raising=False)
    monkeypatch.setenv("SVC_SERVER_PORT", "1234")
    assert load_config().server.port == 1234


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"SVC_SERVER_PORT": "x"}, "SVC_SERVER_PORT"),
        ({"SVC_SERVER_PORT": "99999"}, "server.port"),
        ({"SVC_SERVER_SHARDS": "0"}, "server.shards"),
        ({"SVC_SERVER_KEEPALIVE_S": "soon"}, "SVC_SERVER_KEEPALIVE_S"),
        ({"SVC_SERVER_REQUEST_TIMEOUT_S": "-1"}, "server.request_timeout_s"),
        ({"SVC_SERVER_PLATFORM_RPM": "0"}, "server.platform_rpm"),
        ({"SVC_SERVER_DB": ""}, "server.db"),
        ({"SVC_SERVER_HOST": ""}, "server.host"),
        ({"SVC_SERVER_REQUEST_TIMEOUT_S": "nan"}, "SVC_SERVER_REQUEST_TIMEOUT_S"),
        ({"SVC_SERVER_WORKERS": "many"}, "SVC_SERVER_WORKERS"),
        ({"SVC_SERVER_WORKERS": "0"}, "SVC_SERVER_WORKERS"),
    ],
)
def test_bad_environment_names_the_variable_or_key(environ: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ=environ)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"port": 70000}, "server.port"),
        ({"port": -1}, "server.port"),
        ({"db": ""}, "server.db"),
        ({"host": ""}, "server.host"),
        ({"host": " "}, "server.host"),
    ],
)
def test_bad_flags_name_the_key(flags: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={}, **flags)
    assert needle in str(info.value)


# -- validation, table-driven --------------------------------------------------------------

PROVIDERS = '[[providers]]\nname = "mock"\nkind = "mock"\n'
MODEL = '[[models]]\nid = "m"\nprovider = "mock"\n'


def model(extra: str) -> str:
    return PROVIDERS + MODEL + extra


INVALID: list[tuple[str, str, str]] = [
    # (id, TOML document, text the error must contain)
    ("unknown-top-level", "[sever]\nport = 1\n", "config.sever"),
    ("server-not-a-table", "server = 3\n", "server"),
    ("server-unknown-key", "[server]\nprot = 8080\n", "server.prot"),
    ("port-string", '[server]\nport = "x"\n', "server.port"),
    ("port-bool", "[server]\nport = true\n", "server.port"),
    ("port-float", "[server]\nport = 80.5\n", "server.port"),
    ("port-too-big", "[server]\nport = 65536\n", "server.port"),
    ("port-negative", "[server]\nport = -1\n", "server.port"),
    ("host-number", "[server]\nhost = 1\n", "server.host"),
    ("db-empty", '[server]\ndb = ""\n', "server.db"),
    ("timeout-zero", "[server]\nrequest_timeout_s = 0\n", "server.request_timeout_s"),
    ("keepalive-negative", "[server]\nkeepalive_s = -1\n", "server.keepalive_s"),
    ("shards-zero", "[server]\nshards = 0\n", "server.shards"),
    ("platform-rpm-zero", "[server]\nplatform_rpm = 0\n", "server.platform_rpm"),
    ("max-body-zero", "[server]\nmax_body_bytes = 0\n", "server.max_body_bytes"),
    ("grace-negative", "[server]\nshutdown_grace_s = -1\n", "server.shutdown_grace_s"),
    (
        "graceful-renamed",
        "[server]\ngraceful_timeout_s = 3\n",
        "server.graceful_timeout_s: renamed server.shutdown_grace_s",
    ),
    ("rotation-grace-negative", "[server]\nrotation_grace_s = -1\n", "server.rotation_grace_s"),
    ("catalog-rpm-negative", "[server]\npublic_catalog_rpm = -1\n", "server.public_catalog_rpm"),
    ("providers-without-models", PROVIDERS, "models"),
    ("models-without-providers", MODEL, "providers"),
    ("providers-not-a-list", 'providers = "mock"\n' + MODEL, "providers"),
    ("provider-unknown-key", PROVIDERS + 'colour = "red"\n' + MODEL, "providers[0].colour"),
    ("provider-no-name", '[[providers]]\nkind = "mock"\n' + MODEL, "providers[0].name"),
    ("provider-no-kind", '[[providers]]\nname = "mock"\n' + MODEL, "providers[0].kind"),
    (
        "provider-bad-kind",
        '[[providers]]\nname = "mock"\nkind = "x"\n' + MODEL,
        "providers[0].kind",
    ),
    (
        "openai-no-base-url",
        '[[providers]]\nname = "mock"\nkind = "openai"\n' + MODEL,
        "providers[0].base_url",
    ),
    (
        "provider-residency-numbers",
        PROVIDERS + "residency = [1]\n" + MODEL,
        "providers[0].residency",
    ),
    (
        "provider-zero-retention-string",
        PROVIDERS + 'zero_retention = "yes"\n' + MODEL,
        "providers[0].zero_retention",
    ),
    ("provider-timeout-zero", PROVIDERS + "timeout_s = 0\n" + MODEL, "providers[0].timeout_s"),
    (
        "provider-connections-zero",
        PROVIDERS + "max_connections = 0\n" + MODEL,
        "providers[0].max_connections",
    ),
    ("provider-duplicate", PROVIDERS + PROVIDERS + MODEL, "providers[1].name"),
    (
        "model-unknown-provider",
        PROVIDERS + '[[models]]\nid = "m"\nprovider = "nope"\n',
        "models[0].provider",
    ),
    ("model-no-id", PROVIDERS + '[[models]]\nprovider = "mock"\n', "models[0].id"),
    ("model-no-provider", PROVIDERS + '[[models]]\nid = "m"\n', "models[0].provider"),
    ("model-bad-id", PROVIDERS + '[[models]]\nid = "a b"\nprovider = "mock"\n', "models[0].id"),
    ("model-unknown-key", model("colour = 1\n"), "models[0].colour"),
    ("model-bad-kind", model('kind = "image"\n'), "models[0].kind"),
    ("model-bad-capability", model('capabilities = ["telepathy"]\n'), "models[0].capabilities"),
    (
        "model-negative-price",
        model("input_usd_per_mtok = -0.1\n"),
        "models[0].input_usd_per_mtok",
    ),
    (
        "model-price-string",
        model('output_usd_per_mtok = "1"\n'),
        "models[0].output_usd_per_mtok",
    ),
    ("model-price-nan", model("input_usd_per_mtok = nan\n"), "models[0].input_usd_per_mtok"),
    ("model-price-inf", model("output_usd_per_mtok = inf\n"), "models[0].output_usd_per_mtok"),
    ("model-price-huge", model("input_usd_per_mtok = 1e300\n"), "models[0].input_usd_per_mtok"),
    ("server-timeout-nan", "[server]\nrequest_timeout_s = nan\n", "server.request_timeout_s"),
    ("server-keepalive-inf", "[server]\nkeepalive_s = inf\n", "server.keepalive_s"),
    (
        "provider-base-url-not-a-url",
        '[[providers]]\nname = "p"\nkind = "openai"\nbase_url = "not a url"\n' + MODEL,
        "providers[0].base_url",
    ),
    ("model-dimensions-zero", model("dimensions = 0\n"), "models[0].dimensions"),
    ("model-enabled-string", model('enabled = "yes"\n'), "models[0].enabled"),
    ("model-byok-number", model("byok_available = 1\n"), "models[0].byok_available"),
    ("model-duplicate", PROVIDERS + MODEL + MODEL, "models[1].id"),
    ("host-empty", '[server]\nhost = ""\n', "server.host"),
    ("providers-of-numbers", "providers = [1]\n" + MODEL, "providers[0]: must be a table"),
    ("providers-of-lists", "providers = [[]]\n" + MODEL, "providers[0]: must be a table"),
    ("models-of-numbers", "models = [1]\n" + PROVIDERS, "models[0]: must be a table"),
    ("models-of-strings", 'models = ["m"]\n' + PROVIDERS, "models[0]: must be a table"),
    (
        "provider-name-empty",
        '[[providers]]\nname = ""\nkind = "mock"\n[[models]]\nid = "m"\nprovider = ""\n',
        "providers[0].name",
    ),
    ("model-upstream-id-empty", model('upstream_id = ""\n'), "models[0].upstream_id"),
    (
        "two-embedding-models",
        PROVIDERS
        + '[[models]]\nid = "e1"\nprovider = "mock"\nkind = "embedding"\n'
        + '[[models]]\nid = "e2"\nprovider = "mock"\nkind = "embedding"\n',
        "models",
    ),
]


@pytest.mark.parametrize(
    ("text", "needle"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_validation_error_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text))
    message = str(info.value)
    assert message.startswith(needle), message
    assert "\n" not in message
    # the same through load_config and a file
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert str(info.value) == message


def test_valid_edge_values() -> None:
    config = parse_config(
        tomllib.loads(
            "[server]\nport = 65535\nrequest_timeout_s = 0.5\n"
            + PROVIDERS
            + '[[models]]\nid = "org/model:v1.2-x"\nprovider = "mock"\n'
            + "input_usd_per_mtok = 0\ncapabilities = []\n"
        )
    )
    assert config.server.port == 65535
    assert config.server.request_timeout_s == 0.5
    assert config.models[0].id == "org/model:v1.2-x"
    assert config.models[0].input_usd_per_mtok == 0.0
