"""Configuration: the TOML file of DESIGN.md, environment overrides, validation.

docs/CONFIG.md is the reference of every key (tests/config/test_config_docs.py keeps it
and ``svc-gateway config example``, :mod:`gateway.config.example`, true to this loader).

Precedence, highest first: command-line flags, environment variables, the file,
embedded defaults. With no file at all the server runs on the embedded default:
SQLite in the working directory, the deterministic mock provider and a demo catalog.

Environment overrides (all optional): ``SVC_SERVER_HOST``, ``SVC_SERVER_PORT``,
``SVC_SERVER_DB``, ``SVC_SERVER_REQUEST_TIMEOUT_S``, ``SVC_SERVER_KEEPALIVE_S``,
``SVC_SERVER_SHARDS``, ``SVC_SERVER_PLATFORM_RPM``, ``SVC_SERVER_ROTATION_GRACE_S``,
``SVC_SERVER_LOG_FORMAT``, ``SVC_SERVER_LOG_LEVEL``, ``SVC_SERVER_METRICS_TOKEN``,
``SVC_SERVER_SHUTDOWN_GRACE_S``, ``SVC_SERVER_BODY_TIMEOUT_S``, ``SVC_SERVER_MAX_CONNECTIONS``,
``SVC_SERVER_MAX_CONNECTIONS_PER_CLIENT``,
``SVC_SERVER_WORKERS`` (a count or ``auto``);
``SVC_CLUSTER_NODE_ID``, ``SVC_CLUSTER_LEASE_S``; ``SVC_OBSERVABILITY_OTLP_ENDPOINT`` and
the other scalar keys of ``[observability]`` (``SVC_OBSERVABILITY_<KEY>``).

Every problem is a :class:`ConfigError` whose message names the offending key; the CLI
prints it on one line and exits with status 2.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.config.cache import CacheConfig, parse_cache
from gateway.config.checks import ConfigError as ConfigError
from gateway.config.checks import check_unknown as _check_unknown
from gateway.config.checks import http_url as _http_url
from gateway.config.checks import require_table as _require_table
from gateway.config.checks import take as _take
from gateway.config.guardrails import GuardrailConfig, parse_guardrails
from gateway.config.mcp_servers import McpServerConfig, parse_mcp_servers
from gateway.config.tokenizers import parse_tokenizer

MODEL_CAPABILITIES = ("tools", "structured_output", "vision", "web_search")
MODEL_KINDS = ("chat", "embedding")
#: how a model's deployments are chosen (docs/decisions/routing.md)
ROUTING_STRATEGIES = ("ordered", "weighted", "least_busy", "latency")
#: the routing keys of a ``[[models]]`` table
ROUTING_KEYS = (
    "deployments",
    "routing",
    "max_attempts",
    "first_byte_timeout_s",
    "fallbacks",
    "context_window",
)
#: attempts of one call at most, whatever a model says (each may wait its first byte)
MAX_ATTEMPTS = 10
PROVIDER_KINDS = ("mock", "openai", "anthropic", "gemini", "bedrock", "azure")
#: a model's prices, USD per million tokens
PRICE_KEYS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache_read_usd_per_mtok",
    "cache_write_usd_per_mtok",
)
#: where a native kind's API is when ``base_url`` is not set (bedrock's names its region)
DEFAULT_BASE_URLS = {
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "bedrock": "https://bedrock-runtime.{region}.amazonaws.com",
}
#: the keys each kind takes besides the common ones
_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "mock": (),
    "openai": ("api_key_env",),
    "anthropic": ("api_key_env", "anthropic_version"),
    "gemini": ("api_key_env",),
    "bedrock": ("region", "access_key_id_env", "secret_access_key_env", "session_token_env"),
    "azure": ("api_key_env", "api_version"),
}
#: the keys every provider takes, whatever its kind
PROVIDER_COMMON_KEYS = (
    "name",
    "kind",
    "base_url",
    "zero_retention",
    "residency",
    "timeout_s",
    "max_connections",
)
#: the keys of a ``[[models]]`` table
MODEL_KEYS = (
    "id",
    "provider",
    "upstream_id",
    "kind",
    "capabilities",
    "zero_retention_available",
    "byok_available",
    *PRICE_KEYS,
    "dimensions",
    "enabled",
    "aliases",
    *ROUTING_KEYS,
    "tokenizer",
)
#: the keys of a ``[[models.deployments]]`` table
DEPLOYMENT_KEYS = ("provider", "upstream_id", "weight", "rpm", "tpm")
#: the top-level tables of the file
TABLES = (
    "server",
    "cluster",
    "observability",
    "cache",
    "providers",
    "models",
    "guardrails",
    "mcp_servers",
)


def provider_keys(kind: str) -> tuple[str, ...]:
    """The keys a ``[[providers]]`` table of this kind takes."""
    return PROVIDER_COMMON_KEYS + _KIND_KEYS[kind]


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


#: the largest price of a model, USD per million tokens (a call's cost must fit 64 bits)
MAX_PRICE = 1_000_000
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    #: an SQLite file, or a ``postgresql://`` URL (the store decides which: gateway.store)
    db: str = "svc-gateway.db"
    request_timeout_s: float = 300.0
    keepalive_s: float = 15.0
    shards: int = 16
    platform_rpm: int | None = None
    rotation_grace_s: int = 24 * 3600
    #: on SIGTERM/SIGINT, how long calls in progress may take to finish (DESIGN.md)
    shutdown_grace_s: float = 25.0
    max_body_bytes: int = 10 * 1024 * 1024
    #: a request body must arrive whole within this long (and not trickle: gateway/edge/bodies.py)
    body_timeout_s: float = 30.0
    #: request bodies over 64 KiB held in memory at once, all requests together
    max_buffered_body_bytes: int = 32 * 1024 * 1024
    #: open client connections; past it the next one waits in the listen backlog
    max_connections: int = 1000
    #: open connections of one client address; None: half of max_connections
    #: (gateway/serving/connections.py)
    max_connections_per_client: int | None = None
    public_catalog_rpm: int = 60
    #: an idle kept-alive connection is closed after this long (longer than clients'
    #: own pool expiry, 5 s for httpx and the OpenAI SDK, so they close first)
    connection_idle_s: float = 30.0
    #: spend-alert webhooks: first retry after this many seconds, doubling up to an hour
    webhook_retry_s: float = 5.0
    webhook_max_attempts: int = 12
    log_format: str = "text"
    log_level: str = "info"
    #: GET /metrics and the counting behind it; off, /metrics answers 404
    metrics: bool = True
    #: when set, GET /metrics needs ``Authorization: Bearer <metrics_token>``
    metrics_token: str | None = None
    #: after a stop signal, /readyz answers 503 for this long while everything is still
    #: served, so that a load balancer stops routing here before the listener closes
    drain_s: float = 0.0
    #: serving processes on the one port (``"auto"`` in the file: one per core); more
    #: than one run as nodes of one deployment (gateway/serving/workers.py)
    workers: int = 1


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    kind: str
    base_url: str | None = None
    api_key_env: str | None = None
    zero_retention: bool = False
    residency: tuple[str, ...] = ()
    timeout_s: float = 300.0
    max_connections: int = 100
    #: anthropic: the ``anthropic-version`` header
    anthropic_version: str = "2023-06-01"
    #: azure: set, the deployments surface with this ``api-version``; None, the v1 surface
    api_version: str | None = None
    #: bedrock: the AWS region, and the environment variables of its credentials
    region: str | None = None
    access_key_id_env: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_env: str = "AWS_SECRET_ACCESS_KEY"
    session_token_env: str = "AWS_SESSION_TOKEN"


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    """``[[models.deployments]]``: one upstream that serves a model."""

    provider: str
    upstream_id: str
    #: the share of calls under ``weighted`` routing
    weight: float = 1.0
    #: the upstream account's own limits, kept per node (None: none)
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    id: str
    #: the first deployment's provider and upstream id (the single-upstream form)
    provider: str
    upstream_id: str
    kind: str = "chat"
    capabilities: tuple[str, ...] = ()
    zero_retention_available: bool = False
    byok_available: bool = False
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    #: cached input read, and input written to the cache; None: priced as input
    cache_read_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None
    dimensions: int = 1536
    enabled: bool = True
    #: other names clients may call the model by; one shared by two models is ambiguous
    aliases: tuple[str, ...] = ()
    #: the upstreams that serve it; empty: the one of ``provider`` and ``upstream_id``
    deployments: tuple[DeploymentConfig, ...] = ()
    routing: str = "weighted"
    #: attempts over deployments and fallbacks before the first byte
    max_attempts: int = 3
    #: an attempt but the last with no byte by then is given up (None: the call's time
    #: limit / max_attempts)
    first_byte_timeout_s: float | None = None
    #: other catalog models tried when every deployment failed before the first byte
    fallbacks: tuple[str, ...] = ()
    #: tokens of prompt and output the model holds (None: not stated, not checked)
    context_window: int | None = None
    #: how its prompt tokens are counted (gateway/config/tokenizers.py)
    tokenizer: str = "bytes"

    def routes(self) -> tuple[DeploymentConfig, ...]:
        """The deployments of the model: the listed ones, or the single-upstream form."""
        return self.deployments or (DeploymentConfig(self.provider, self.upstream_id),)


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: several nodes on one PostgreSQL database (ignored on SQLite)."""

    #: names the node in leases, request rows and logs (default: host name and pid)
    node_id: str = field(default_factory=_default_node_id)
    #: a lease (and the node's registration) lasts this long without a renewal
    lease_s: float = 10.0


# ---------------------------------------------------------------- [observability]


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    """``[observability]``: OpenTelemetry traces over OTLP/HTTP (docs/decisions/otel.md).

    Off (no SDK object at all) while ``otlp_endpoint`` is unset.
    """

    #: the collector: a base URL (``http://host:4318``: ``/v1/traces`` is appended, as for
    #: OTEL_EXPORTER_OTLP_ENDPOINT) or the full traces URL (any other path: used as is, as
    #: for OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    otlp_endpoint: str | None = None
    #: headers of every export request (a collector's or vendor's credential)
    otlp_headers: tuple[tuple[str, str], ...] = ()
    service_name: str = "svc-gateway"
    #: share of new traces recorded; a request with a traceparent follows its sampled flag
    sample_ratio: float = 1.0
    #: the batch processor's wait between exports
    batch_delay_s: float = 5.0
    #: one export request, retries included
    export_timeout_s: float = 10.0
    #: spans waiting for export, at most; past it a span is dropped (and counted)
    queue_size: int = 2048

    def traces_url(self) -> str | None:
        """The URL spans are posted to (None: traces are off)."""
        url = self.otlp_endpoint
        if url is None:
            return None
        path = re.sub(r"^https?://[^/?#]*", "", url)
        return url.rstrip("/") + "/v1/traces" if path in ("", "/") else url


_OBSERVABILITY_TYPES: dict[str, type | tuple[type, ...]] = {
    "otlp_endpoint": str,
    "service_name": str,
    "sample_ratio": (int, float),
    "batch_delay_s": (int, float),
    "export_timeout_s": (int, float),
    "queue_size": int,
}


def _parse_observability(table: object) -> ObservabilityConfig:
    if not isinstance(table, dict):
        raise ConfigError("observability: must be a table")
    _check_unknown(table, {*_OBSERVABILITY_TYPES, "otlp_headers"}, "observability")
    values = {
        key: _take(table, key, "observability", kind)
        for key, kind in _OBSERVABILITY_TYPES.items()
        if key in table
    }
    headers = table.get("otlp_headers", {})
    if not isinstance(headers, dict):
        raise ConfigError("observability.otlp_headers: must be a table")
    for name, value in headers.items():
        if not isinstance(value, str):
            raise ConfigError(f"observability.otlp_headers.{name}: expected str")
    values["otlp_headers"] = tuple(headers.items())
    observability = replace(ObservabilityConfig(), **values)
    _validate_observability(observability)
    return observability


def _validate_observability(observability: ObservabilityConfig) -> None:
    where = "observability"
    endpoint = observability.otlp_endpoint
    if endpoint is not None and not _http_url(endpoint):
        raise ConfigError(f"{where}.otlp_endpoint: expected an http:// or https:// URL")
    _not_empty(observability.service_name, f"{where}.service_name")
    if not 0 <= observability.sample_ratio <= 1:
        raise ConfigError(f"{where}.sample_ratio: must be between 0 and 1")
    _positive(observability.batch_delay_s, f"{where}.batch_delay_s")
    _positive(observability.export_timeout_s, f"{where}.export_timeout_s")
    _positive(observability.queue_size, f"{where}.queue_size")


def _env_observability(
    observability: ObservabilityConfig, environ: dict[str, str]
) -> ObservabilityConfig:
    """``SVC_OBSERVABILITY_<KEY>`` for each key but the headers (the exporter reads
    ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` itself); an empty endpoint turns traces off."""
    values: dict[str, Any] = {}
    for key, kinds in _OBSERVABILITY_TYPES.items():
        name = f"SVC_OBSERVABILITY_{key.upper()}"
        if name not in environ:
            continue
        raw = environ[name]
        kind = kinds[-1] if isinstance(kinds, tuple) else kinds
        if key == "otlp_endpoint":
            values[key] = raw or None
            continue
        try:
            values[key] = kind(raw)
        except ValueError:
            raise ConfigError(f"{name}: expected {kind.__name__}") from None
        if isinstance(values[key], float) and not math.isfinite(values[key]):
            raise ConfigError(f"{name}: must be a finite number")
    if not values:
        return observability
    observability = replace(observability, **values)
    _validate_observability(observability)
    return observability


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    providers: tuple[ProviderConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()
    source: str | None = None
    #: ``[[guardrails]]`` (gateway/config/guardrails.py)
    guardrails: tuple[GuardrailConfig, ...] = ()
    cache: CacheConfig = field(default_factory=CacheConfig)
    #: the MCP servers fronted at /mcp (gateway/config/mcp_servers.py)
    mcp_servers: tuple[McpServerConfig, ...] = ()

    def provider(self, name: str) -> ProviderConfig:
        for provider in self.providers:
            if provider.name == name:
                return provider
        raise KeyError(name)


def _demo_models() -> tuple[ModelConfig, ...]:
    full = ("tools", "structured_output", "vision", "web_search")
    return (
        ModelConfig("gpt-4o-mini", "mock", "gpt-4o-mini", "chat", full, True, True, 0.15, 0.60),
        ModelConfig("gpt-4o", "mock", "gpt-4o", "chat", full, True, True, 2.50, 10.00),
        ModelConfig("mock-basic", "mock", "mock-basic", "chat", (), False, False, 0.10, 0.20),
        ModelConfig(
            "text-embedding-3-small",
            "mock",
            "text-embedding-3-small",
            "embedding",
            (),
            True,
            True,
            0.02,
            0.0,
        ),
    )


def default_config() -> Config:
    """The embedded default: the mock provider and a demo catalog."""
    mock = ProviderConfig(name="mock", kind="mock", zero_retention=True, residency=("us", "eu"))
    return Config(server=ServerConfig(), providers=(mock,), models=_demo_models())


# ---------------------------------------------------------------- parsing helpers


def _not_empty(value: str, where: str) -> str:
    if not value.strip():
        raise ConfigError(f"{where}: must not be empty")
    return value


def _positive(value: float, where: str) -> None:
    if value <= 0:
        raise ConfigError(f"{where}: must be positive")


def _parse_server(table: dict[str, Any]) -> ServerConfig:
    defaults = ServerConfig()
    types: dict[str, type | tuple[type, ...]] = {
        "host": str,
        "port": int,
        "db": str,
        "request_timeout_s": (int, float),
        "keepalive_s": (int, float),
        "shards": int,
        "platform_rpm": int,
        "rotation_grace_s": int,
        "shutdown_grace_s": (int, float),
        "max_body_bytes": int,
        "body_timeout_s": (int, float),
        "max_buffered_body_bytes": int,
        "max_connections": int,
        "max_connections_per_client": int,
        "public_catalog_rpm": int,
        "connection_idle_s": (int, float),
        "webhook_retry_s": (int, float),
        "webhook_max_attempts": int,
        "log_format": str,
        "log_level": str,
        "metrics": bool,
        "metrics_token": str,
        "drain_s": (int, float),
        "workers": (int, str),
    }
    if "graceful_timeout_s" in table:
        # the name before DESIGN.md's contract was followed: say what it is called now
        raise ConfigError("server.graceful_timeout_s: renamed server.shutdown_grace_s")
    _check_unknown(table, types, "server")
    values = {key: _take(table, key, "server", kind) for key, kind in types.items() if key in table}
    if "workers" in values:
        values["workers"] = parse_workers(values["workers"], "server.workers")
    server = replace(defaults, **values)
    _validate_server(server)
    return server


def parse_workers(value: object, where: str) -> int:
    """``[server] workers``: a count of at least 1, or ``"auto"`` (one per core)."""
    if value == "auto":
        return os.cpu_count() or 1
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f'{where}: must be a number or "auto"') from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f'{where}: must be at least 1 (or "auto": one per core)')
    return value


def _validate_server(server: ServerConfig) -> None:
    if not 0 <= server.port <= 65535:
        raise ConfigError("server.port: must be between 0 and 65535")
    for key in (
        "request_timeout_s",
        "keepalive_s",
        "shards",
        "max_body_bytes",
        "body_timeout_s",
        "max_buffered_body_bytes",
        "max_connections",
        "public_catalog_rpm",
        "connection_idle_s",
        "webhook_retry_s",
        "webhook_max_attempts",
        "workers",
    ):
        _positive(getattr(server, key), f"server.{key}")
    if server.max_buffered_body_bytes < server.max_body_bytes:
        # else a body of the largest size allowed could never be read
        raise ConfigError("server.max_buffered_body_bytes: must be at least max_body_bytes")
    for key in ("shutdown_grace_s", "rotation_grace_s", "drain_s"):
        if getattr(server, key) < 0:
            raise ConfigError(f"server.{key}: must not be negative")
    if server.platform_rpm is not None:
        _positive(server.platform_rpm, "server.platform_rpm")
    if server.max_connections_per_client is not None:
        _positive(server.max_connections_per_client, "server.max_connections_per_client")
    if not server.db:
        raise ConfigError("server.db: must not be empty")
    if server.log_format not in LOG_FORMATS:
        raise ConfigError(f"server.log_format: must be one of {', '.join(LOG_FORMATS)}")
    if server.log_level not in LOG_LEVELS:
        raise ConfigError(f"server.log_level: must be one of {', '.join(LOG_LEVELS)}")
    if server.metrics_token is not None and not server.metrics_token.strip():
        raise ConfigError("server.metrics_token: must not be empty")
    if not server.host.strip():
        # an empty host would silently listen on every interface
        raise ConfigError("server.host: must not be empty")


def _parse_provider(table: dict[str, Any], index: int) -> ProviderConfig:
    where = f"providers[{index}]"
    _require_table(table, where)
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}.{key}: required")
    kind = _take(table, "kind", where, str)
    if kind not in PROVIDER_KINDS:
        raise ConfigError(f"{where}.kind: must be one of {', '.join(PROVIDER_KINDS)}")
    _check_unknown(table, provider_keys(kind), where)
    strings = {
        key: _not_empty(_take(table, key, where, str), f"{where}.{key}")
        for key in sorted({*_KIND_KEYS[kind], "base_url"})
        if key in table
    }
    region = strings.get("region")
    if kind == "bedrock" and region is None:
        raise ConfigError(f"{where}.region: required for kind bedrock (e.g. us-east-1)")
    if region is not None and not re.fullmatch(r"[a-z0-9-]+", region):
        raise ConfigError(f"{where}.region: not an AWS region name (e.g. us-east-1)")
    base_url = strings.get("base_url")
    if base_url is None and kind in DEFAULT_BASE_URLS:
        base_url = DEFAULT_BASE_URLS[kind].format(region=region)
    if kind in ("openai", "azure") and not base_url:
        raise ConfigError(f"{where}.base_url: required for kind {kind}")
    if base_url is not None and not _http_url(base_url):
        raise ConfigError(f"{where}.base_url: must be an http(s) URL with a host")
    residency = tuple(_take(table, "residency", where, list)) if "residency" in table else ()
    if not all(isinstance(zone, str) for zone in residency):
        raise ConfigError(f"{where}.residency: must be a list of strings")
    credentials = {
        key: strings[key]
        for key in ("access_key_id_env", "secret_access_key_env", "session_token_env")
        if key in strings
    }
    provider = ProviderConfig(
        name=_not_empty(_take(table, "name", where, str), f"{where}.name"),
        kind=kind,
        base_url=base_url,
        api_key_env=strings.get("api_key_env"),
        zero_retention=_take(table, "zero_retention", where, bool)
        if "zero_retention" in table
        else False,
        residency=residency,
        timeout_s=float(_take(table, "timeout_s", where, (int, float)))
        if "timeout_s" in table
        else 300.0,
        max_connections=_take(table, "max_connections", where, int)
        if "max_connections" in table
        else 100,
        anthropic_version=strings.get("anthropic_version", "2023-06-01"),
        api_version=strings.get("api_version"),
        region=region,
        **credentials,
    )
    _positive(provider.timeout_s, f"{where}.timeout_s")
    _positive(provider.max_connections, f"{where}.max_connections")
    return provider


def _parse_model(table: dict[str, Any], index: int, providers: set[str]) -> ModelConfig:
    where = f"models[{index}]"
    _check_unknown(table, MODEL_KEYS, where)
    if "id" not in table:
        raise ConfigError(f"{where}.id: required")
    model_id = _take(table, "id", where, str)
    if not _ID.match(model_id):
        raise ConfigError(f"{where}.id: invalid model id {model_id!r}")
    deployments = _parse_deployments(table, where, providers, model_id)
    if deployments and ("provider" in table or "upstream_id" in table):
        raise ConfigError(
            f"{where}.deployments: give either deployments or provider and upstream_id, not both"
        )
    if not deployments and "provider" not in table:
        raise ConfigError(f"{where}.provider: required (or [[models.deployments]])")
    provider = _take(table, "provider", where, str) if "provider" in table else ""
    if not deployments and provider not in providers:
        raise ConfigError(f"{where}.provider: no provider named {provider!r}")
    kind = _take(table, "kind", where, str) if "kind" in table else "chat"
    if kind not in MODEL_KINDS:
        raise ConfigError(f"{where}.kind: must be one of {', '.join(MODEL_KINDS)}")
    caps = tuple(_take(table, "capabilities", where, list)) if "capabilities" in table else ()
    for cap in caps:
        if cap not in MODEL_CAPABILITIES:
            raise ConfigError(f"{where}.capabilities: unknown capability {cap!r}")
    prices: dict[str, float | None] = {}
    for key in PRICE_KEYS:
        value = _take(table, key, where, (int, float)) if key in table else None
        if value is not None and not 0 <= value <= MAX_PRICE:
            raise ConfigError(f"{where}.{key}: must be between 0 and {MAX_PRICE:,}")
        prices[key] = float(value) if value is not None else None
    flags = {
        key: _take(table, key, where, bool) if key in table else default
        for key, default in (
            ("zero_retention_available", False),
            ("byok_available", False),
            ("enabled", True),
        )
    }
    dimensions = _take(table, "dimensions", where, int) if "dimensions" in table else 1536
    _positive(dimensions, f"{where}.dimensions")
    aliases = tuple(_take(table, "aliases", where, list)) if "aliases" in table else ()
    for alias in aliases:
        if not isinstance(alias, str) or not _ID.match(alias):
            raise ConfigError(f"{where}.aliases: invalid model id {alias!r}")
    upstream_id = _take(table, "upstream_id", where, str) if "upstream_id" in table else model_id
    if deployments:
        provider, upstream_id = deployments[0].provider, deployments[0].upstream_id
    return ModelConfig(
        id=model_id,
        provider=provider,
        upstream_id=_not_empty(upstream_id, f"{where}.upstream_id"),
        deployments=deployments,
        **_parse_routing(table, where),
        tokenizer=parse_tokenizer(table, where, ConfigError),
        kind=kind,
        capabilities=caps,
        dimensions=dimensions,
        aliases=aliases,
        zero_retention_available=flags["zero_retention_available"],
        byok_available=flags["byok_available"],
        enabled=flags["enabled"],
        input_usd_per_mtok=prices["input_usd_per_mtok"],
        output_usd_per_mtok=prices["output_usd_per_mtok"],
        cache_read_usd_per_mtok=prices["cache_read_usd_per_mtok"],
        cache_write_usd_per_mtok=prices["cache_write_usd_per_mtok"],
    )


def _parse_deployments(
    table: dict[str, Any], where: str, providers: set[str], model_id: str
) -> tuple[DeploymentConfig, ...]:
    """``[[models.deployments]]``: each names a configured provider; weights are positive."""
    if "deployments" not in table:
        return ()
    listed = _take(table, "deployments", where, list)
    if not listed:
        raise ConfigError(f"{where}.deployments: at least one deployment, or leave it out")
    found = []
    for index, item in enumerate(listed):
        at = f"{where}.deployments[{index}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: must be a table")
        _check_unknown(item, DEPLOYMENT_KEYS, at)
        if "provider" not in item:
            raise ConfigError(f"{at}.provider: required")
        provider = _take(item, "provider", at, str)
        if provider not in providers:
            raise ConfigError(f"{at}.provider: no provider named {provider!r}")
        upstream = _take(item, "upstream_id", at, str) if "upstream_id" in item else model_id
        weight = float(_take(item, "weight", at, (int, float))) if "weight" in item else 1.0
        _positive(weight, f"{at}.weight")
        limits = {k: _take(item, k, at, int) if k in item else None for k in ("rpm", "tpm")}
        for key, value in limits.items():
            if value is not None:
                _positive(value, f"{at}.{key}")
        found.append(
            DeploymentConfig(provider, _not_empty(upstream, f"{at}.upstream_id"), weight, **limits)
        )
    return tuple(found)


def _parse_routing(table: dict[str, Any], where: str) -> dict[str, Any]:
    """The routing keys of a model: strategy, attempts, first-byte timeout, fallbacks,
    context window (fallbacks are checked against the catalog once every model is read)."""
    values: dict[str, Any] = {}
    if "routing" in table:
        routing = _take(table, "routing", where, str)
        if routing not in ROUTING_STRATEGIES:
            raise ConfigError(f"{where}.routing: must be one of {', '.join(ROUTING_STRATEGIES)}")
        values["routing"] = routing
    if "max_attempts" in table:
        attempts = _take(table, "max_attempts", where, int)
        if not 1 <= attempts <= MAX_ATTEMPTS:
            raise ConfigError(f"{where}.max_attempts: must be between 1 and {MAX_ATTEMPTS}")
        values["max_attempts"] = attempts
    if "first_byte_timeout_s" in table:
        timeout = float(_take(table, "first_byte_timeout_s", where, (int, float)))
        _positive(timeout, f"{where}.first_byte_timeout_s")
        values["first_byte_timeout_s"] = timeout
    if "fallbacks" in table:
        fallbacks = tuple(_take(table, "fallbacks", where, list))
        for name in fallbacks:
            if not isinstance(name, str) or not _ID.match(name):
                raise ConfigError(f"{where}.fallbacks: invalid model id {name!r}")
        values["fallbacks"] = fallbacks
    if "context_window" in table:
        window = _take(table, "context_window", where, int)
        _positive(window, f"{where}.context_window")
        values["context_window"] = window
    return values


def _check_fallbacks(models: tuple[ModelConfig, ...]) -> None:
    """Each fallback is another configured model of the same kind."""
    kinds = {m.id: m.kind for m in models}
    for i, model in enumerate(models):
        for name in model.fallbacks:
            if name == model.id:
                raise ConfigError(f"models[{i}].fallbacks: {name!r} is the model itself")
            if name not in kinds:
                raise ConfigError(f"models[{i}].fallbacks: no model {name!r}")
            if kinds[name] != model.kind:
                raise ConfigError(f"models[{i}].fallbacks: {name!r} is not a {model.kind} model")


def _check_mock_deployments(models: tuple[ModelConfig, ...], kinds: dict[str, str]) -> None:
    """A model is served by the mock alone or by real providers alone: the mock serves
    sandbox keys only, so a live key routed to a mock deployment would fail the call."""
    for i, model in enumerate(models):
        mock = {kinds.get(d.provider) == "mock" for d in model.routes()}
        if len(mock) > 1:
            raise ConfigError(
                f"models[{i}].deployments: mock and real providers in one model; give the"
                " mock deployments a model of their own"
            )


def _parse_cluster(table: object) -> ClusterConfig:
    if not isinstance(table, dict):
        raise ConfigError("cluster: must be a table")
    types: dict[str, type | tuple[type, ...]] = {"node_id": str, "lease_s": (int, float)}
    _check_unknown(table, types, "cluster")
    values = {k: _take(table, k, "cluster", kind) for k, kind in types.items() if k in table}
    cluster = replace(ClusterConfig(), **values)
    _validate_cluster(cluster)
    return cluster


def _validate_cluster(cluster: ClusterConfig) -> None:
    if not cluster.node_id.strip():
        raise ConfigError("cluster.node_id: must not be empty")
    if cluster.lease_s < 1:
        raise ConfigError("cluster.lease_s: must be at least 1")


def parse_config(data: dict[str, Any], source: str | None = None) -> Config:
    """Validate a parsed TOML document into a :class:`Config`."""
    _check_unknown(data, TABLES, "config")
    server_table = data.get("server", {})
    if not isinstance(server_table, dict):
        raise ConfigError("server: must be a table")
    server = _parse_server(server_table)
    cluster = _parse_cluster(data.get("cluster", {}))
    observability = _parse_observability(data.get("observability", {}))
    guardrails = parse_guardrails(data.get("guardrails", []))
    try:
        cache = parse_cache(data.get("cache", {}))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    mcp_servers = parse_mcp_servers(data.get("mcp_servers"))
    provider_tables = data.get("providers")
    model_tables = data.get("models")
    if provider_tables is None and model_tables is None:
        base = default_config()
        return Config(
            server=server,
            cluster=cluster,
            observability=observability,
            providers=base.providers,
            models=base.models,
            source=source,
            guardrails=guardrails,
            cache=cache,
            mcp_servers=mcp_servers,
        )
    if not isinstance(provider_tables, list) or not provider_tables:
        raise ConfigError("providers: at least one [[providers]] table is required")
    if not isinstance(model_tables, list) or not model_tables:
        raise ConfigError("models: at least one [[models]] table is required")
    providers = tuple(_parse_provider(t, i) for i, t in enumerate(provider_tables))
    names = [p.name for p in providers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"providers[{i}].name: duplicate provider {name!r}")
    models = tuple(_parse_model(t, i, set(names)) for i, t in enumerate(model_tables))
    ids = [m.id for m in models]
    for i, model_id in enumerate(ids):
        if model_id in ids[:i]:
            raise ConfigError(f"models[{i}].id: duplicate model {model_id!r}")
    for i, model in enumerate(models):
        for alias in model.aliases:
            if alias in ids:
                raise ConfigError(f"models[{i}].aliases: {alias!r} is the id of a model")
    if sum(1 for m in models if m.kind == "embedding") > 1:
        raise ConfigError("models: at most one model of kind embedding is served")
    _check_fallbacks(models)
    _check_mock_deployments(models, {p.name: p.kind for p in providers})
    return Config(
        server,
        cluster,
        observability,
        providers,
        models,
        source,
        guardrails=guardrails,
        cache=cache,
        mcp_servers=mcp_servers,
    )


def _env_workers(value: str) -> int:
    return parse_workers(value, "SVC_SERVER_WORKERS")


#: each variable's parser: a ``ValueError`` names the variable and the parser's name
_ENV_SERVER: dict[str, Callable[[str], Any]] = {
    "host": str,
    "port": int,
    "db": str,
    "request_timeout_s": float,
    "keepalive_s": float,
    "shards": int,
    "platform_rpm": int,
    "rotation_grace_s": int,
    "log_format": str,
    "log_level": str,
    "metrics_token": str,
    "shutdown_grace_s": float,
    "body_timeout_s": float,
    "max_connections": int,
    "max_connections_per_client": int,
    "workers": _env_workers,
}


def _env_overrides(server: ServerConfig, environ: dict[str, str]) -> ServerConfig:
    values: dict[str, Any] = {}
    for key, kind in _ENV_SERVER.items():
        name = f"SVC_SERVER_{key.upper()}"
        if name in environ:
            try:
                values[key] = kind(environ[name])
            except ValueError:
                raise ConfigError(f"{name}: expected {kind.__name__}") from None
            if isinstance(values[key], float) and not math.isfinite(values[key]):
                raise ConfigError(f"{name}: must be a finite number")
    server = replace(server, **values)
    _validate_server(server)
    return server


def load_config(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> Config:
    """Read the file (if any), apply environment and flag overrides, validate."""
    env = dict(os.environ if environ is None else environ)
    path = path or env.get("SVC_CONFIG")
    if path:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config: file not found: {file}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config: cannot read {file}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {file} is not valid TOML: {exc}") from None
        config = parse_config(data, source=str(file))
    else:
        config = default_config()
    server = _env_overrides(config.server, env)
    flagged = {key: value for key, value in overrides.items() if value is not None}
    if flagged:
        server = replace(server, **flagged)
        _validate_server(server)
    return replace(
        config,
        server=server,
        cluster=_env_cluster(config.cluster, env),
        observability=_env_observability(config.observability, env),
    )


def _env_cluster(cluster: ClusterConfig, environ: dict[str, str]) -> ClusterConfig:
    """``SVC_CLUSTER_NODE_ID`` and ``SVC_CLUSTER_LEASE_S`` (several nodes often share
    one config file and differ only by their environment)."""
    if "SVC_CLUSTER_NODE_ID" in environ:
        cluster = replace(cluster, node_id=environ["SVC_CLUSTER_NODE_ID"])
    if "SVC_CLUSTER_LEASE_S" in environ:
        try:
            lease_s = float(environ["SVC_CLUSTER_LEASE_S"])
        except ValueError:
            raise ConfigError("SVC_CLUSTER_LEASE_S: expected float") from None
        if not math.isfinite(lease_s):
            raise ConfigError("SVC_CLUSTER_LEASE_S: must be a finite number")
        cluster = replace(cluster, lease_s=lease_s)
    _validate_cluster(cluster)
    return cluster
