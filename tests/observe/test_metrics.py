"""GET /metrics against a real server, parsed with prometheus-client's own text parser.

A scripted mix of calls (successes, one of each refusal class, a stream, an upstream
failure, reads) moves every counter by exactly the number of calls of its kind; the
histograms count the calls; the settled and billed series equal the sums of the records.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from gateway.config.settings import load_config
from gateway.fakes.fake_upstream import FakeUpstream
from gateway.observe.metrics import ENDPOINTS, endpoint_of
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, make_config, start_gateway

REPO = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def scrape(gw: Gateway, token: str | None = None) -> Samples:
    async with gw.client(token) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Series of ``name`` whose value changed, by labels, and by how much."""
    keys = {labels for (n, labels) in (*before, *after) if n == name}
    out = {}
    for labels in keys:
        delta = after.get((name, labels), 0.0) - before.get((name, labels), 0.0)
        if delta:
            out[labels] = delta
    return out


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, live_config(tmp_path, upstream, request_timeout_s=5.0))
    yield gw
    gw.stop.set()


async def test_every_series_of_the_contract_is_exposed(gateway: Gateway) -> None:
    samples = await scrape(gateway)
    names = {name for name, _ in samples}
    for name in (
        "svc_calls_in_flight",
        "svc_build_info",
        "svc_shard_mailbox_depth",
        "svc_store_commit_seconds_count",
    ):
        assert name in names, name
    assert value(samples, "svc_build_info", version="0.1.0") == 1
    shards = {dict(labels)["shard"] for n, labels in samples if n == "svc_shard_mailbox_depth"}
    assert shards == {str(i) for i in range(gateway.runtime.config.server.shards)}
    async with gateway.client() as client:
        text = (await client.get("/metrics")).text
    for name in (
        "svc_requests_total",
        "svc_request_duration_seconds",
        "svc_time_to_first_byte_seconds",
        "svc_upstream_duration_seconds",
        "svc_tokens_total",
        "svc_settled_usd_total",
        "svc_billed_usd_total",
        "svc_admission_refusals_total",
    ):
        assert f"# TYPE {name} " in text, name
    assert "_created" not in text


async def test_a_scripted_mix_moves_each_series_by_its_calls(live: Gateway) -> None:
    gw = live
    org = await gw.admin("POST", "/admin/orgs", {"name": "metered", "credits_usd": 50})
    org_id = org.json()["id"]
    key = (await gw.create_key(org_id=org_id, name="live", mode="live"))["token"]
    narrow = (await gw.create_key(name="narrow", scopes=["usage:read"]))["token"]
    slow = (await gw.create_key(name="one a minute", caps={"rpm": 1}))["token"]
    capped = await gw.create_key(org_id=org_id, mode="live", caps={"usd_day": 0.0000001})
    before = await scrape(gw)

    answers: list[tuple[str, httpx.Response]] = []
    request_ids: list[str] = []
    streams = 0

    async def send(token: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async with gw.client(token) as client:
            response = await client.request(method, path, **kwargs)
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                nonlocal streams
                streams += 1
        answers.append((path, response))
        return response

    for i in range(3):
        ok = await send(key, "POST", "/v1/chat/completions", json=body_for(f"hello {i}"))
        assert ok.status_code == 200, ok.text
        request_ids.append(ok.headers["X-Request-Id"])
    streamed = await send(
        key, "POST", "/v1/chat/completions", json=body_for("stream it", stream=True)
    )
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    request_ids.append(streamed.headers["X-Request-Id"])
    failed = await send(key, "POST", "/v1/chat/completions", json=body_for("[[fault status=500]]"))
    assert failed.status_code == 503
    request_ids.append(failed.headers["X-Request-Id"])
    embedded = await send(
        key, "POST", "/v1/embeddings", json={"model": "live-embed", "input": "a b c"}
    )
    assert embedded.status_code == 200, embedded.text
    request_ids.append(embedded.headers["X-Request-Id"])
    # one of each refusal class: 401, 403, 429, 402, 400, 404
    assert (await send("svc_test_nope", "GET", "/v1/key")).status_code == 401
    assert (await send(narrow, "POST", "/v1/chat/completions", json={})).status_code == 403
    assert (await send(slow, "GET", "/v1/key")).status_code == 200
    assert (await send(slow, "GET", "/v1/key")).status_code == 429
    over = await send(capped["token"], "POST", "/v1/chat/completions", json=body_for("x"))
    assert over.status_code == 402, over.text
    assert (await send(key, "POST", "/v1/chat/completions", content=b"{")).status_code == 400
    lost = await send(key, "POST", "/v1/chat/completions", json={**body_for("x"), "model": "no"})
    assert lost.status_code == 404
    assert (await send(None, "GET", "/v1/models")).status_code == 200
    assert (await send(None, "GET", "/nowhere")).status_code == 404

    after = await scrape(gw)
    expected: Counter[tuple[str, str, str]] = Counter()
    for path, response in answers:
        code = "ok" if response.status_code < 400 else response.json()["error"]["code"]
        expected[(endpoint_of(path), str(response.status_code), code)] += 1
    expected[("other", "200", "ok")] += 1  # the first scrape, counted once it was answered
    got = {
        (dict(labels)["endpoint"], dict(labels)["status"], dict(labels)["code"]): delta
        for labels, delta in moved(before, after, "svc_requests_total").items()
    }
    assert got == dict(expected)

    per_endpoint: Counter[str] = Counter()
    for (endpoint, _, _), count in expected.items():
        per_endpoint[endpoint] += count
    durations = moved(before, after, "svc_request_duration_seconds_count")
    assert {dict(labels)["endpoint"]: n for labels, n in durations.items()} == per_endpoint
    first_bytes = moved(before, after, "svc_time_to_first_byte_seconds_count")
    assert first_bytes == {(("endpoint", "chat"),): streams} and streams == 1
    # the provider was asked by six live model calls: 3 chat, the stream, the failure,
    # the embeddings
    upstream = moved(before, after, "svc_upstream_duration_seconds_count")
    assert upstream == {(("provider", "upstream"),): 6}
    refusals = moved(before, after, "svc_admission_refusals_total")
    assert refusals == {(("code", "rate_limited"),): 1, (("code", "key_cap_exceeded"),): 1}
    assert value(after, "svc_calls_in_flight") == 0

    records = []
    async with gw.client(key) as client:
        for request_id in request_ids:
            response = await client.get(f"/v1/requests/{request_id}")
            assert response.status_code == 200, response.text
            records.append(response.json())
    settled = moved(before, after, "svc_settled_usd_total")
    billed = moved(before, after, "svc_billed_usd_total")
    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_model.setdefault(record["model"], []).append(record)
    for model, rows in by_model.items():
        want = sum(row["cost"]["settled_usd"] for row in rows)
        assert settled.get((("mode", "live"), ("model", model)), 0) == pytest.approx(want)
        want_billed = sum(row["cost"]["billed_usd"] for row in rows)
        assert billed.get((("model", model),), 0) == pytest.approx(want_billed)
    assert sum(settled.values()) == pytest.approx(sum(r["cost"]["settled_usd"] for r in records))
    assert sum(settled.values()) > 0 and sum(billed.values()) > 0
    tokens = moved(before, after, "svc_tokens_total")
    for direction, field in (("input", "prompt_tokens"), ("output", "completion_tokens")):
        want = sum((r["usage"] or {}).get(field, 0) for r in records)
        got_tokens = sum(n for labels, n in tokens.items() if ("direction", direction) in labels)
        assert got_tokens == want > 0
    commits = moved(before, after, "svc_store_commit_seconds_count")
    assert commits and next(iter(commits.values())) >= 1


async def test_label_sets_stay_bounded(gateway: Gateway) -> None:
    """Many keys, tags, unknown models and paths: no new series after the first round,
    and no label ever holds a key, a tag value, a model name or a path of a caller."""

    sent: list[str] = []

    async def round_of(n: int, tag: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        for i in range(n):
            created = await gateway.create_key(name=f"k{tag}{i}")
            sent.extend([created["id"], created["token"], f"t-{tag}{i}", f"r-{tag}{i}"])
            sent.extend([f"made-up-{tag}-{i}", f"req_{tag}{i}", f"nothing-{tag}-{i}"])
            async with gateway.client(created["token"]) as client:
                headers = {"X-Svc-Tags": f"team=t-{tag}{i},run=r-{tag}{i}"}
                body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post("/v1/chat/completions", json=body, headers=headers)
                assert answer.status_code == 200
                sent.append(answer.headers["X-Request-Id"])
                body["model"] = f"made-up-{tag}-{i}"
                await client.post("/v1/chat/completions", json=body)
                await client.get(f"/v1/requests/req_{tag}{i}")
                await client.get(f"/v1/nothing-{tag}-{i}")
        return set(await scrape(gateway))

    await scrape(gateway)  # the first scrape's own series appear from the next one on
    first = await round_of(6, "a")
    second = await round_of(12, "b")
    assert second == first
    label_values = {value for _, labels in second for _, value in labels}
    assert not [v for v in label_values if any(s in v for s in sent)]
    endpoints = {dict(labels).get("endpoint") for _, labels in second} - {None}
    assert endpoints <= set(ENDPOINTS)
    models = {dict(labels).get("model") for _, labels in second} - {None}
    assert models <= {m.id for m in gateway.runtime.config.models} | {"other"}


async def test_the_metrics_token_guards_metrics(nursery: trio.Nursery, tmp_path: Path) -> None:
    gw = await start_gateway(nursery, make_config(tmp_path, metrics_token="scrape-secret"))
    try:
        async with gw.client() as client:
            assert (await client.get("/metrics")).status_code == 401
        async with gw.client("wrong") as client:
            refused = await client.get("/metrics")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert "svc_requests_total" in str(await scrape(gw, "scrape-secret"))
        async with gw.client() as client:
            assert (await client.get("/healthz")).status_code == 200
    finally:
        gw.stop.set()


async def test_metrics_off_is_404_and_counts_nothing(nursery: trio.Nursery, tmp_path: Path) -> None:
    gw = await start_gateway(nursery, make_config(tmp_path, metrics=False))
    try:
        async with gw.client(gw.token) as client:
            assert (await client.get("/v1/key")).status_code == 200
            response = await client.get("/metrics")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        text = gw.runtime.metrics.exposition().decode()
        assert "svc_requests_total{" not in text
    finally:
        gw.stop.set()


def test_metrics_token_from_the_file_or_the_environment(tmp_path: Path) -> None:
    config_file = tmp_path / "gateway.toml"
    config_file.write_text('[server]\nmetrics_token = "from-file"\nlog_format = "json"\n')
    assert load_config(config_file, environ={}).server.metrics_token == "from-file"
    env = {"SVC_SERVER_METRICS_TOKEN": "from-env", "SVC_SERVER_LOG_LEVEL": "warning"}
    server = load_config(config_file, environ=env).server
    assert (server.metrics_token, server.log_format, server.log_level) == (
        "from-env",
        "json",
        "warning",
    )


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [
        ("/v1/chat/completions", "chat"),
        ("/v1/responses", "responses"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/models", "models"),
        ("/v1/key", "key"),
        ("/v1/keys", "keys"),
        ("/v1/keys/key_1", "keys"),
        ("/v1/usage", "usage"),
        ("/v1/credits", "credits"),
        ("/v1/requests/req_1", "requests"),
        ("/admin/orgs", "admin"),
        ("/healthz", "other"),
        ("/v1/models/gpt-4o", "models"),
        ("/v1/modelsx", "other"),
        ("/administrator", "other"),
    ],
)
def test_endpoint_labels(path: str, endpoint: str) -> None:
    assert endpoint_of(path) == endpoint


CONTRACT = {
    "svc_requests_total",
    "svc_request_duration_seconds",
    "svc_time_to_first_byte_seconds",
    "svc_upstream_duration_seconds",
    "svc_calls_in_flight",
    "svc_tokens_total",
    "svc_settled_usd_total",
    "svc_billed_usd_total",
    "svc_admission_refusals_total",
    "svc_store_commit_seconds",
    "svc_shard_mailbox_depth",
    "svc_build_info",
}


def test_the_dashboard_uses_only_the_contract_names() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\bsvc_[a-z_]+", target["expr"]):
                used.add(re.sub(r"_(bucket|count|sum)$", "", name))
    used |= set(re.findall(r"\bsvc_[a-z_]+", json.dumps(dashboard["templating"])))
    assert used <= CONTRACT, used - CONTRACT
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("by code", "latency", "first byte", "in flight", "per model", "refusals"):
        assert topic in titles, topic
    scrape = (REPO / "deploy" / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in scrape
