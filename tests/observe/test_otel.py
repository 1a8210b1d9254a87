"""OpenTelemetry traces against a real OTLP/HTTP receiver on loopback.

A real gateway (its HTTP server, its store, the mock provider for sandbox keys and the
fake OpenAI upstream for live ones) exports to ``tests/support/fake_collector.py``,
which decodes what arrives with ``opentelemetry-proto``'s classes. The spans' ids are
checked against the ``traceparent`` the client sent and the one the upstream received;
the attributes against the answer; the exported bytes against every piece of content
and every secret of the call. With the collector down, calls are answered as before and
the spans that could not leave are counted on /metrics.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.accounts.key_record import parse_token
from gateway.config.settings import ConfigError, ObservabilityConfig, load_config
from gateway.fakes.fake_upstream import WORDS, FakeUpstream
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, make_config, start_gateway
from tests.support.fake_collector import (
    FakeCollector,
    ReceivedSpan,
    closed_port,
    running_collector,
)
from tests.support.procs import base_env, start_server
from tests.support.waiting import until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"
PROMPT = "the quarterly numbers of project nightingale"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: export often: a test waits for its spans on a condition, this only keeps it short
FAST = {"batch_delay_s": 0.05, "export_timeout_s": 2.0}


def traced(config: Any, url: str, **observability: Any) -> Any:
    settings = ObservabilityConfig(otlp_endpoint=url, **{**FAST, **observability})
    return replace(config, observability=settings)


@pytest.fixture
def collector() -> Iterator[FakeCollector]:
    with running_collector() as running:
        yield running


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, collector: FakeCollector
) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(nursery, traced(make_config(tmp_path), collector.url))
    yield gateway
    await gateway.aclose()


@pytest.fixture
async def live(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    collector: FakeCollector,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = traced(live_config(tmp_path, upstream), collector.url + "/v1/traces")
    gateway = await start_gateway(nursery, config)
    key = await gateway.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gateway, key["token"]
    await gateway.aclose()


async def spans_of(collector: FakeCollector, request_id: str) -> tuple[ReceivedSpan, ReceivedSpan]:
    """The server and client spans of one request, once both arrived."""

    def both() -> tuple[ReceivedSpan, ReceivedSpan] | None:
        server = collector.span_of("server", request_id)
        client = collector.span_of("client", request_id)
        return (server, client) if server and client else None

    return await until(both, within=10)


def assert_no_content(collector: FakeCollector, *secrets: str) -> None:
    exported = b"".join(collector.bodies)
    assert exported
    for secret in secrets:
        assert secret.encode() not in exported, secret


async def dropped(gw: Gateway, reason: str) -> float:
    async with gw.client() as client:
        text = (await client.get("/metrics")).text
    match = re.search(rf'^svc_trace_spans_dropped_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert match is not None, text
    return float(match.group(1))


# -- the spans of a call ---------------------------------------------------------------


async def test_a_chat_call_is_a_server_span_on_the_callers_trace_and_a_client_span(
    gw: Gateway, collector: FakeCollector
) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": PROMPT}]}
    async with gw.client(gw.token) as client:
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"traceparent": SAMPLED}
        )
    assert response.status_code == 200, response.text
    answer = response.json()
    request_id = response.headers["X-Request-Id"]
    server, client_span = await spans_of(collector, request_id)

    assert (server.trace_id, server.parent_span_id) == (TRACE, PARENT)
    assert server.name == "POST chat"
    parsed = parse_token(gw.token)
    assert parsed is not None
    prefix = parsed[1]
    assert server.attributes == {
        "http.request.method": "POST",
        "svc.endpoint": "chat",
        "http.response.status_code": 200,
        "svc.request_id": request_id,
        "svc.key_prefix": prefix,
        "svc.org_id": gw.org_id,
    }
    assert server.resource["service.name"] == "svc-gateway"

    assert client_span.trace_id == TRACE
    assert client_span.parent_span_id == server.span_id
    assert client_span.name == "chat gpt-4o-mini"
    usage = answer["usage"]
    assert client_span.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "mock",
        "gen_ai.system": "mock",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini",
        "gen_ai.response.finish_reasons": [answer["choices"][0]["finish_reason"]],
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "svc.model": "gpt-4o-mini",
        "svc.provider": "mock",
        "svc.request_id": request_id,
        "svc.key_prefix": prefix,
        "svc.org_id": gw.org_id,
    }
    assert (server.status, client_span.status) == ("unset", "unset")
    completion = answer["choices"][0]["message"]["content"]
    assert len(completion) > 8
    assert_no_content(collector, PROMPT, completion, gw.token, gw.token.rsplit("_", 1)[1])


async def test_a_request_without_traceparent_is_a_new_recorded_trace(
    gw: Gateway, collector: FakeCollector
) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with gw.client(gw.token) as client:
        response = await client.post("/v1/chat/completions", json=body)
        request_id = response.headers["X-Request-Id"]
        record = (await client.get(f"/v1/requests/{request_id}")).json()
    server, client_span = await spans_of(collector, request_id)
    assert server.parent_span_id == ""  # a root: sample_ratio 1 records every new trace
    assert server.trace_id == client_span.trace_id == record["trace_id"]


async def test_an_unsampled_caller_trace_exports_nothing(
    gw: Gateway, collector: FakeCollector
) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with gw.client(gw.token) as client:
        quiet = await client.post(
            "/v1/chat/completions", json=body, headers={"traceparent": f"00-{TRACE}-{PARENT}-00"}
        )
        loud = await client.post(
            "/v1/chat/completions", json=body, headers={"traceparent": SAMPLED}
        )
    assert quiet.status_code == loud.status_code == 200
    # the sampled call's spans arrive after the unsampled one ended: none of it came
    await spans_of(collector, loud.headers["X-Request-Id"])
    quiet_id = quiet.headers["X-Request-Id"]
    assert [s for s in collector.received() if s.attributes.get("svc.request_id") == quiet_id] == []


async def test_probes_and_scrapes_are_not_traced(gw: Gateway, collector: FakeCollector) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with gw.client(gw.token) as client:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/models"):
            assert (await client.get(path)).status_code == 200
        response = await client.post("/v1/chat/completions", json=body)
    # every span of the requests before the call has left by the time the call's has
    await spans_of(collector, response.headers["X-Request-Id"])
    names = sorted(span.name for span in collector.received())
    assert names == ["GET models", "POST chat", "chat gpt-4o-mini"]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_provider_is_sent_the_client_span_as_its_parent(
    live: tuple[Gateway, str], upstream: FakeUpstream, collector: FakeCollector, stream: bool
) -> None:
    gw, token = live
    # a streamed call: eight words 0.15 s apart, so its client span lasts over a second
    text = PROMPT + (" [[fault chunk_delay=0.15]]" if stream else "")
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    body = body_for(text, **extra)
    async with gw.client(token) as client:
        started = time.time_ns()
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"traceparent": SAMPLED}
        ) as response:
            received = (await response.aread()).decode()
        finished = time.time_ns()
    assert response.status_code == 200, received
    server, client_span = await spans_of(collector, response.headers["X-Request-Id"])

    sent = TRACEPARENT.fullmatch(upstream.headers[-1]["traceparent"])
    assert sent is not None
    assert sent.groups() == (TRACE, client_span.span_id, "01")
    assert client_span.parent_span_id == server.span_id and server.parent_span_id == PARENT
    attributes = client_span.attributes
    assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
    assert attributes["gen_ai.request.model"] == "up-chat"  # what the provider was asked
    assert attributes["svc.model"] == "live-chat"
    assert attributes["gen_ai.response.model"] == "up-chat"
    assert attributes["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
    assert attributes["gen_ai.usage.output_tokens"] > 0
    if stream:
        # ended when the stream ended, not when it was handed to its pump
        assert (client_span.end_ns - client_span.start_ns) / 1e9 >= 1.0
        assert started <= client_span.end_ns <= finished
    assert_no_content(collector, PROMPT, UPSTREAM_KEY, token, " ".join(WORDS[:3]))


async def test_a_failed_attempt_is_an_error_span(
    live: tuple[Gateway, str], collector: FakeCollector
) -> None:
    gw, token = live
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/chat/completions", json=body_for("hi [[fault status=500]]")
        )
    assert response.status_code >= 500
    code = response.json()["error"]["code"]
    server, client_span = await spans_of(collector, response.headers["X-Request-Id"])
    assert (client_span.status, client_span.attributes["error.type"]) == ("error", code)
    assert (server.status, server.attributes["error.type"]) == ("error", code)
    assert server.attributes["http.response.status_code"] == response.status_code


async def test_an_embeddings_call_is_an_embeddings_span(
    live: tuple[Gateway, str], upstream: FakeUpstream, collector: FakeCollector
) -> None:
    gw, token = live
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/embeddings",
            json={"model": "live-embed", "input": PROMPT},
            headers={"traceparent": SAMPLED},
        )
    assert response.status_code == 200, response.text
    _, client_span = await spans_of(collector, response.headers["X-Request-Id"])
    assert client_span.name == "embeddings up-embed"
    assert client_span.attributes["gen_ai.operation.name"] == "embeddings"
    assert (
        client_span.attributes["gen_ai.usage.input_tokens"]
        == response.json()["usage"]["prompt_tokens"]
    )
    sent = TRACEPARENT.fullmatch(upstream.headers[-1]["traceparent"])
    assert sent is not None and sent.group(2) == client_span.span_id


# -- the collector down ------------------------------------------------------------------


async def test_with_the_collector_down_calls_are_unaffected_and_drops_are_counted(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    # a queue of two: the first batch is with the exporter (retrying a refused
    # connection), the next two spans wait, every later one is dropped
    config = traced(make_config(tmp_path), down, queue_size=2)
    gw = await start_gateway(nursery, config)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with gw.client(gw.token) as client:
        for _ in range(6):
            started = time.perf_counter()
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"traceparent": SAMPLED}
            )
            assert response.status_code == 200, response.text
            # answered at once: the export (2 s with its retries) is not on the way
            assert time.perf_counter() - started < 1.0
    await until(lambda: dropped(gw, "queue_full"), within=10)
    await until(lambda: dropped(gw, "export_failed"), within=10)
    started = time.perf_counter()
    await gw.aclose()
    # a graceful stop waits for the last spans at most its bound (5 s), plus one request
    assert time.perf_counter() - started < 10


async def test_traces_off_is_no_span_machinery(nursery: trio.Nursery, tmp_path: Path) -> None:
    gw = await start_gateway(nursery, make_config(tmp_path))
    try:
        assert gw.runtime.spans is None and gw.runtime.call_parts.spans is None
        async with gw.client() as client:
            assert "svc_trace_spans_dropped" not in (await client.get("/metrics")).text
    finally:
        await gw.aclose()


# -- the configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://otel.example/v1/traces", "https://otel.example/v1/traces"),
        ("https://otel.example/custom/path", "https://otel.example/custom/path"),
    ],
)
def test_a_base_endpoint_gets_the_traces_path_a_full_one_is_kept(endpoint: str, url: str) -> None:
    assert ObservabilityConfig(otlp_endpoint=endpoint).traces_url() == url
    assert ObservabilityConfig().traces_url() is None


def test_the_table_and_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(
        '[observability]\notlp_endpoint = "http://127.0.0.1:4318"\nservice_name = "edge-1"\n'
        'sample_ratio = 0.5\n[observability.otlp_headers]\nauthorization = "Bearer x"\n'
    )
    config = load_config(file, environ={}).observability
    assert (config.otlp_endpoint, config.service_name, config.sample_ratio) == (
        "http://127.0.0.1:4318",
        "edge-1",
        0.5,
    )
    assert config.otlp_headers == (("authorization", "Bearer x"),)
    environ = {"SVC_OBSERVABILITY_OTLP_ENDPOINT": "http://collector:4318"}
    assert (
        load_config(None, environ=environ).observability.otlp_endpoint
        == environ["SVC_OBSERVABILITY_OTLP_ENDPOINT"]
    )
    off = load_config(file, environ={"SVC_OBSERVABILITY_OTLP_ENDPOINT": ""}).observability
    assert off.otlp_endpoint is None


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('otlp_endpoint = "localhost:4318"', "observability.otlp_endpoint"),
        ("sample_ratio = 1.5", "observability.sample_ratio"),
        ("queue_size = 0", "observability.queue_size"),
        ('colour = "red"', "observability.colour"),
    ],
)
def test_a_bad_key_is_refused_by_name(tmp_path: Path, table: str, needle: str) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(f"[observability]\n{table}\n")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(file, environ={})


# -- the command -------------------------------------------------------------------------


@pytest.mark.processes
def test_serve_exports_from_the_environment_and_flushes_on_a_graceful_stop(
    tmp_path: Path, collector: FakeCollector
) -> None:
    """``svc-gateway serve`` as the README runs it: the endpoint from the environment; a
    batch delay of a minute, so the spans can only have left with the stop's flush."""
    env = base_env(
        SVC_OBSERVABILITY_OTLP_ENDPOINT=collector.url,
        SVC_OBSERVABILITY_BATCH_DELAY_S="60",
    )
    server = start_server(tmp_path, env=env)
    try:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": PROMPT}]}
        with server.client(server.token) as client:
            response = client.post(
                "/v1/chat/completions", json=body, headers={"traceparent": SAMPLED}
            )
        assert response.status_code == 200, response.text
        assert collector.received() == []
    finally:
        assert server.stop() == 0, server.stderr()
    request_id = response.headers["X-Request-Id"]
    server_span = collector.span_of("server", request_id)
    client_span = collector.span_of("client", request_id)
    assert server_span is not None and client_span is not None
    assert client_span.parent_span_id == server_span.span_id
    assert server_span.parent_span_id == PARENT
