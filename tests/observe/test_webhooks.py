"""Spend-alert webhooks: threshold events delivered once per crossing, signed, retried.

The receiver is a real HTTP server on loopback (trio + h11) that records deliveries and
can refuse the first ones with 500. Live keys call the fake upstream; a call whose
upstream reports no usage settles exactly its reservation, which makes cap crossings
exact.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import h11
import orjson
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.config.settings import Config
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import (
    IN_PRICE,
    MAX_TOKENS,
    OUT_PRICE,
    UPSTREAM_KEY,
    live_config,
)
from tests.conftest import Gateway, start_gateway
from tests.support.procs import assert_one_line_error, base_env, cli_json, run_cli, start_server


@dataclass
class Receiver:
    """Webhook receiver: every delivery kept; the first ``fail_first`` answered 500."""

    url: str = ""
    fail_first: int = 0
    deliveries: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    refused: int = 0
    #: answer nothing at all (a stuck receiver); requests are only counted
    hang: bool = False
    requests: int = 0
    arrived: trio.Event = field(default_factory=trio.Event)
    requested: trio.Event = field(default_factory=trio.Event)

    async def serve(self, *, task_status: trio.TaskStatus[Receiver]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/hook"
        task_status.started(self)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        headers: dict[str, str] = {}
        body = b""
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            self.requests += 1
            self.requested.set()
            if self.hang:
                await trio.sleep_forever()
            if self.refused < self.fail_first:
                self.refused += 1
                status = 500
            else:
                self.deliveries.append((headers, body))
                self.arrived.set()
                status = 200
            response = h11.Response(status_code=status, headers=[("content-length", "0")])
            await stream.send_all(conn.send(response) + conn.send(h11.EndOfMessage()))

    def events(self) -> dict[str, dict[str, Any]]:
        """Delivered events by id (duplicates collapse, as a receiver dedupes)."""
        return {orjson.loads(body)["id"]: orjson.loads(body) for _, body in self.deliveries}

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        with trio.fail_after(timeout):
            while len(self.events()) < count:
                self.arrived = trio.Event()
                await self.arrived.wait()


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    parts = dict(item.split("=", 1) for item in headers["svc-signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(parts["v1"], expected.hexdigest())


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> Receiver:
    return await nursery.start(Receiver().serve)


@pytest.fixture
def config(tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    base = live_config(tmp_path, upstream)
    return replace(base, server=replace(base.server, webhook_retry_s=0.2))


@pytest.fixture
async def gw(nursery: trio.Nursery, config: Config) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(nursery, config)
    yield gateway
    gateway.stop.set()


TEXT = "[[fault no_usage]] spend"


class _AnySecret:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith("whsec_") and len(other) > 30


ANY_SECRET = _AnySecret()


def worst_case() -> int:
    """The reservation of one TEXT call: what it settles when no usage is reported."""
    messages = [{"role": "user", "content": TEXT}]
    prompt = estimate_prompt_tokens({"messages": messages, "max_tokens": MAX_TOKENS})
    return math.ceil((prompt * IN_PRICE + MAX_TOKENS * OUT_PRICE) * 1000)


async def org_with_webhook(
    gw: Gateway, url: str, credits: float = 100, name: str = "acme"
) -> tuple[str, str]:
    response = await gw.admin("POST", "/admin/orgs", {"name": name, "credits_usd": credits})
    org_id = response.json()["id"]
    response = await gw.admin("PUT", f"/admin/orgs/{org_id}/webhook", {"url": url})
    assert response.status_code == 200, response.text
    secret = response.json()["secret"]
    assert secret.startswith("whsec_")
    return org_id, secret


async def quiet(gw: Gateway) -> None:
    """Every settlement so far checked, every event it made delivered: nothing more comes."""
    with trio.fail_after(15):
        await gw.runtime.alerts.wait_quiet()


async def spend(gw: Gateway, token: str, text: str = TEXT) -> None:
    body = {
        "model": "live-chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
    }
    async with gw.client(token) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


async def test_each_daily_cap_threshold_is_delivered_once_and_signed(
    gw: Gateway, receiver: Receiver
) -> None:
    org_id, secret = await org_with_webhook(gw, receiver.url)
    cap = 4 * worst_case() / NANOS_PER_USD  # four calls reach it exactly
    key = await gw.create_key(org_id=org_id, mode="live", caps={"usd_day": cap})
    for _ in range(2):
        await spend(gw, key["token"])  # 25 %, then 50 %
    await receiver.wait_for(1)
    for _ in range(2):
        await spend(gw, key["token"])  # 75 %, then 100 %: 80 and 100 cross
    await receiver.wait_for(3)
    await quiet(gw)  # nothing more arrives
    events = receiver.events()
    key_events = sorted(
        (e["data"]["threshold_pct"], e["data"]["metric"])
        for e in events.values()
        if e["data"]["scope"] == "key"
    )
    assert key_events == [(50, "usd_day"), (80, "usd_day"), (100, "usd_day")]
    assert len(receiver.deliveries) == len(events)  # each once
    for headers, body in receiver.deliveries:
        assert verify(secret, headers, body)
        assert headers["svc-webhook-id"] == orjson.loads(body)["id"]
        assert not verify("whsec_wrong", headers, body)
    hundred = next(e for e in events.values() if e["data"]["threshold_pct"] == 100)
    assert hundred["type"] == "spend.threshold_crossed"
    assert hundred["data"]["key_id"] == key["id"]
    assert hundred["data"]["used_usd"] == pytest.approx(cap)


async def test_credit_thresholds(gw: Gateway, receiver: Receiver) -> None:
    """Credits: the share of purchased credits used (here with usage reported, so billed)."""
    org_id, _ = await org_with_webhook(gw, receiver.url, credits=0.006)
    key = await gw.create_key(org_id=org_id, mode="live")
    for _ in range(80):  # each call bills its usage; 80 % needs room for one reservation
        await spend(gw, key["token"], "billed call")
        await quiet(gw)
        credits = [e for e in receiver.events().values() if e["data"]["metric"] == "credits"]
        if len(credits) == 2:
            break
    await receiver.wait_for(2)
    pcts = sorted(e["data"]["threshold_pct"] for e in receiver.events().values())
    assert pcts[:2] == [50, 80]
    assert all(e["data"]["scope"] == "org" for e in receiver.events().values())


async def test_organisation_budget_thresholds(gw: Gateway, receiver: Receiver) -> None:
    """The monthly budget of the organisation's policy against what its keys are billed
    (usage reported, so billed; 80 % leaves room for one more reservation)."""
    org_id, _ = await org_with_webhook(gw, receiver.url)
    budget = 0.006
    response = await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", {"budget_usd_month": budget})
    assert response.status_code == 200, response.text
    keys = [await gw.create_key(org_id=org_id, mode="live") for _ in range(2)]
    for n in range(80):  # the keys take turns: the budget is the organisation's
        await spend(gw, keys[n % 2]["token"], "billed call")
        await quiet(gw)
        if len(receiver.events()) == 2:
            break
    await receiver.wait_for(2)
    events = sorted(receiver.events().values(), key=lambda e: e["data"]["threshold_pct"])
    assert [e["data"]["threshold_pct"] for e in events] == [50, 80]
    month = time.strftime("%Y-%m", time.gmtime())
    for event in events:
        assert event["data"]["scope"] == "org"
        assert event["data"]["metric"] == "budget_month"
        assert event["data"]["window"] == month
        assert event["data"]["limit_usd"] == pytest.approx(budget)
        assert event["data"]["used_usd"] >= budget * event["data"]["threshold_pct"] / 100
        assert "key_id" not in event["data"]


async def test_a_failing_receiver_is_retried_until_it_accepts(
    gw: Gateway, receiver: Receiver
) -> None:
    receiver.fail_first = 3
    org_id, secret = await org_with_webhook(gw, receiver.url)
    key = await gw.create_key(
        org_id=org_id, mode="live", caps={"usd_day": 2 * worst_case() / NANOS_PER_USD}
    )
    await spend(gw, key["token"])  # 50 %
    await receiver.wait_for(1, timeout=15)
    assert receiver.refused == 3
    headers, body = receiver.deliveries[0]
    assert verify(secret, headers, body)


async def test_a_pending_event_is_delivered_after_a_restart(
    nursery: trio.Nursery, config: Config, receiver: Receiver
) -> None:
    receiver.fail_first = 1_000  # refuses everything while the first server runs
    first = await start_gateway(nursery, config)
    org_id, secret = await org_with_webhook(first, receiver.url)
    key = await first.create_key(
        org_id=org_id, mode="live", caps={"usd_day": 2 * worst_case() / NANOS_PER_USD}
    )
    await spend(first, key["token"])
    with trio.fail_after(10):
        await receiver.requested.wait()
    await first.aclose()
    receiver.fail_first = 0
    again = await start_gateway(nursery, config)
    try:
        await receiver.wait_for(1, timeout=15)
        (event,) = receiver.events().values()
        assert event["data"]["threshold_pct"] == 50
        headers, body = receiver.deliveries[0]
        assert verify(secret, headers, body)
        # the restarted server goes on from there: 80 and 100 are new, 50 is not again
        await spend(again, key["token"])
        await receiver.wait_for(3)
        await quiet(again)
        events = receiver.events()
        assert sorted(e["data"]["threshold_pct"] for e in events.values()) == [50, 80, 100]
        assert len(receiver.deliveries) == 3  # the 50 % event was delivered exactly once
    finally:
        again.stop.set()


async def test_orgs_without_a_webhook_get_no_events(gw: Gateway, receiver: Receiver) -> None:
    key = await gw.create_key(mode="live", caps={"usd_day": worst_case() / NANOS_PER_USD})
    await spend(gw, key["token"])
    await quiet(gw)
    assert receiver.deliveries == []


async def test_monthly_cap_thresholds_name_the_month(gw: Gateway, receiver: Receiver) -> None:
    org_id, _ = await org_with_webhook(gw, receiver.url)
    cap = 2 * worst_case() / NANOS_PER_USD
    key = await gw.create_key(org_id=org_id, mode="live", caps={"usd_month": cap})
    await spend(gw, key["token"])  # 50 % of the month; no daily cap, no daily event
    await receiver.wait_for(1)
    await quiet(gw)
    (event,) = receiver.events().values()
    month = time.strftime("%Y-%m", time.gmtime())
    assert event["data"] == {
        "scope": "key",
        "org_id": org_id,
        "key_id": key["id"],
        "metric": "usd_month",
        "window": month,
        "threshold_pct": 50,
        "used_usd": pytest.approx(cap / 2),
        "limit_usd": pytest.approx(cap),
    }
    assert abs(event["created"] - time.time()) < 60


async def test_a_stuck_receiver_does_not_hold_up_others(
    gw: Gateway, receiver: Receiver, nursery: trio.Nursery
) -> None:
    stuck = await nursery.start(Receiver(hang=True).serve)
    stuck_org, _ = await org_with_webhook(gw, stuck.url, name="stuck")
    good_org, _ = await org_with_webhook(gw, receiver.url, name="good")
    cap = {"usd_day": 2 * worst_case() / NANOS_PER_USD}
    stuck_key = await gw.create_key(org_id=stuck_org, mode="live", caps=cap)
    good_key = await gw.create_key(org_id=good_org, mode="live", caps=cap)
    await spend(gw, stuck_key["token"])
    with trio.fail_after(5):
        await stuck.requested.wait()
    await spend(gw, good_key["token"])
    await receiver.wait_for(1, timeout=2)  # well within the stuck delivery's time limit
    (event,) = receiver.events().values()
    assert event["data"]["org_id"] == good_org


@pytest.mark.parametrize(
    "url", ["ftp://x", "http://", "/relative", "not a url", 7, None, "http://h/" + "x" * 2000]
)
async def test_the_webhook_url_is_checked(gw: Gateway, url: object) -> None:
    response = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/webhook", {"url": url})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "url")


async def test_setting_a_webhook_again_gives_a_new_secret(gw: Gateway, receiver: Receiver) -> None:
    org_id, first = await org_with_webhook(gw, receiver.url)
    response = await gw.admin("PUT", f"/admin/orgs/{org_id}/webhook", {"url": receiver.url})
    assert response.json() == {"org_id": org_id, "url": receiver.url, "secret": ANY_SECRET}
    assert response.json()["secret"] != first
    response = await gw.admin("PUT", "/admin/orgs/org_missing/webhook", {"url": receiver.url})
    assert response.status_code == 404


@pytest.mark.processes
def test_cli_org_webhook_prints_the_secret_once(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        gateway = ("--gateway-url", server.url)
        org_id = cli_json("org", "create", "acme", "--url", server.url)["id"]
        hook = "http://127.0.0.1:9/hook"
        data = cli_json("org", "webhook", org_id, "--url", hook, *gateway)
        assert set(data) == {"org_id", "url", "secret"}
        assert (data["org_id"], data["url"]) == (org_id, hook)
        assert data["secret"].startswith("whsec_")
        plain = run_cli("org", "webhook", org_id, "--url", hook, *gateway)
        assert plain.returncode == 0, plain.stderr
        secrets = re.findall(r"whsec_\S+", plain.stdout)
        assert len(secrets) == 1 and secrets[0] != data["secret"]
        assert secrets[0] not in server.stderr()  # the secret is never logged
        env = base_env(SVC_GATEWAY_URL=server.url)  # the gateway's address from the env
        refused = run_cli("org", "webhook", org_id, "--url", "ftp://x", env=env)
        assert_one_line_error(refused, "url")
        help_text = run_cli("org", "webhook", "--help").stdout
        assert "secret" in help_text and "--gateway-url" in help_text
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.stderr()


async def test_a_failed_delivery_is_a_log_event(
    gw: Gateway, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.fail_first = 1
    org_id, secret = await org_with_webhook(gw, receiver.url)
    key = await gw.create_key(
        org_id=org_id, mode="live", caps={"usd_day": 2 * worst_case() / NANOS_PER_USD}
    )
    with caplog.at_level("INFO", logger="gateway.observe.alerts"):
        await spend(gw, key["token"])
        await receiver.wait_for(1, timeout=15)  # the retry: the failure was logged before
    events = [r for r in caplog.records if getattr(r, "svc_event", None) == "alert_delivery"]
    [fields] = [e.svc_fields for e in events if e.svc_fields["outcome"] == "retry"]  # type: ignore[attr-defined]
    assert fields["error"] == "HTTP 500"
    assert (fields["org_id"], fields["attempts"]) == (org_id, 1)
    assert receiver.url not in caplog.text and secret not in caplog.text
