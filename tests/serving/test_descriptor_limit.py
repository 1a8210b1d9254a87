"""The client cap and the upstream pools sized to the descriptor limit (issue 29).

``serve`` raises its soft ``RLIMIT_NOFILE`` to the hard limit; when even that cannot
hold ``[server] max_connections`` beside every provider's pool and the reserved
descriptors, the cap and the pools shrink alike (a warning), or the start is refused
when too few client connections would be left. It used to serve with a cap of 1.

The process tests run real ``serve`` processes whose soft and hard descriptor limits
are lowered before they start, live keys calling the fake upstream
(gateway/fakes/fake_upstream.py) in this test's trio loop.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config.settings import Config, ProviderConfig, ServerConfig
from gateway.fakes.fake_upstream import FakeUpstream
from gateway.serving.connections import (
    MIN_CLIENT_CONNECTIONS,
    RESERVED_DESCRIPTORS,
    DescriptorLimitError,
    fit_descriptor_limit,
)
from tests.support.procs import (
    ADMIN_TOKEN,
    START_TIMEOUT_S,
    Server,
    assert_one_line_error,
    base_env,
    run_cli,
    start_server,
)

CLIENTS = 50
#: "big" (1000) and "small" (20) beside the default cap of 1000 want 2020 descriptors;
#: a limit of 512 leaves 384: shrunk by 384/2020, the pools get 190 and 3, the cap 191
FITS_SHRUNK = 512
#: 72 left: the pools get 35 and 1, the cap 36, under the floor of 64
TOO_LOW = 200
CONFIG = """
[[providers]]
name = "big"
kind = "openai"
base_url = "{url}"
api_key_env = "FAKE_UPSTREAM_KEY"
max_connections = 1000

[[providers]]
name = "small"
kind = "openai"
base_url = "{url}"
api_key_env = "FAKE_UPSTREAM_KEY"
max_connections = 20
timeout_s = 2

[[models]]
id = "big-chat"
provider = "big"
upstream_id = "up-chat"
input_usd_per_mtok = 0.0
output_usd_per_mtok = 1.0

[[models]]
id = "small-chat"
provider = "small"
upstream_id = "up-chat"
input_usd_per_mtok = 0.0
output_usd_per_mtok = 1.0
"""


def config_with(cap: int, *pools: tuple[str, str, int]) -> Config:
    """A cap and providers (name, kind, max_connections)."""
    providers = tuple(
        ProviderConfig(name=name, kind=kind, base_url="http://127.0.0.1:9/v1", max_connections=n)
        for name, kind, n in pools
    )
    return Config(server=ServerConfig(max_connections=cap), providers=providers)


def sizes(config: Config) -> tuple[int, dict[str, int]]:
    return config.server.max_connections, {p.name: p.max_connections for p in config.providers}


# -- the arithmetic --------------------------------------------------------------------------


def test_a_config_that_fits_is_kept_as_it_is() -> None:
    config = config_with(1000, ("a", "openai", 100), ("b", "openai", 100))
    assert fit_descriptor_limit(config, 1200 + RESERVED_DESCRIPTORS) is config


def test_the_mock_opens_no_connection_and_is_not_counted() -> None:
    config = config_with(1000, ("demo", "mock", 5000))
    assert fit_descriptor_limit(config, 1000 + RESERVED_DESCRIPTORS) is config


def test_cap_and_pools_shrink_by_one_factor_each_pool_keeping_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = config_with(1000, ("big", "openai", 1000), ("small", "openai", 20), ("m", "mock", 9))
    fitted = fit_descriptor_limit(config, FITS_SHRUNK)
    assert sizes(fitted) == (191, {"big": 190, "small": 3, "m": 9})
    tiny = config_with(1000, ("a", "openai", 1000), ("b", "openai", 2))
    # the cap takes what the rounding down of the pools leaves
    assert sizes(fit_descriptor_limit(tiny, 1100 + RESERVED_DESCRIPTORS)) == (
        550,
        {"a": 549, "b": 1},
    )
    (warning,) = [r.getMessage() for r in caplog.records if "descriptor limit 512" in r.message]
    for needle in ("max_connections 1000", "big 1000, small 20", "at most 191", "big 190"):
        assert needle in warning, warning
    assert "ulimit -n" in warning and "[[providers]] max_connections" in warning


def test_a_cap_shrunk_under_the_floor_is_refused() -> None:
    config = config_with(1000, ("big", "openai", 1000), ("small", "openai", 20))
    with pytest.raises(DescriptorLimitError, match="at most 36 client connections, fewer than 64"):
        fit_descriptor_limit(config, TOO_LOW)
    # a limit below the reserve itself
    with pytest.raises(DescriptorLimitError, match="at most 0 client connections"):
        fit_descriptor_limit(config, 100)


def test_a_cap_configured_under_the_floor_is_kept_only_where_it_fits() -> None:
    small = MIN_CLIENT_CONNECTIONS // 2
    config = config_with(small, ("a", "openai", 100))
    assert fit_descriptor_limit(config, small + 100 + RESERVED_DESCRIPTORS) is config
    with pytest.raises(DescriptorLimitError, match=f"fewer than {MIN_CLIENT_CONNECTIONS}"):
        fit_descriptor_limit(config, small + 99 + RESERVED_DESCRIPTORS)


# -- real processes ----------------------------------------------------------------------------


def descriptor_limit(limit: int) -> Callable[[], None]:
    """For ``preexec_fn``: the child's soft and hard limits (``serve`` raises soft to hard)."""
    return partial(resource.setrlimit, resource.RLIMIT_NOFILE, (limit, limit))


def write_config(tmp_path: Path, upstream: FakeUpstream) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(CONFIG.format(url=upstream.url))
    return path


async def live_key(server: Server) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as client:
        org = await client.post("/admin/orgs", json={"name": "acme", "credits_usd": 100})
        assert org.status_code == 201, org.text
        # the defaults (20 calls at once, 60 a minute) are below what the test asks
        caps = {"max_in_flight": CLIENTS, "rpm": 600}
        body = {"org_id": org.json()["id"], "name": "live", "mode": "live", "caps": caps}
        made = await client.post("/admin/keys", json=body)
        assert made.status_code == 201, made.text
        return str(made.json()["token"])


def chat(model: str, faults: str = "", *, stream: bool = False) -> dict[str, Any]:
    text = f"hello [[fault {faults}]]" if faults else "hello"
    messages = [{"role": "user", "content": text}]
    return {"model": model, "messages": messages, "max_tokens": 16, "stream": stream}


@pytest.mark.timeout(90)
@pytest.mark.processes
async def test_pools_that_do_not_fit_shrink_and_50_clients_are_served_at_once(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    config = write_config(tmp_path, upstream)
    server = await trio.to_thread.run_sync(
        partial(
            start_server,
            tmp_path,
            "--config",
            str(config),
            env=base_env(FAKE_UPSTREAM_KEY="sk-upstream"),
            preexec_fn=descriptor_limit(FITS_SHRUNK),
        )
    )
    try:
        assert "serving at most 191 client connections, with pools big 190, small 3" in (
            server.stderr()
        )
        token = await live_key(server)
        headers = {"Authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=CLIENTS + 10)
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, limits=limits, timeout=30
        ) as client:
            statuses: list[int] = []

            async def call(body: dict[str, Any]) -> None:
                statuses.append((await client.post("/v1/chat/completions", json=body)).status_code)

            # 50 clients, each on its own connection, held by the upstream at the same time
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for _ in range(CLIENTS):
                        nursery.start_soon(call, chat("big-chat", "hold"))
                    await upstream.wait_until(lambda: upstream.open == CLIENTS)
                    upstream.release.set()
            assert statuses == [200] * CLIENTS

            # the pool used is the shrunk one: while 3 slow streams hold "small"'s three
            # connections, a fourth call waits for one in vain (timeout_s, 2 s; the
            # streams last 7 s) and never reaches the upstream
            statuses.clear()
            before = upstream.calls
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(call, chat("small-chat", "chunk_delay=1", stream=True))
                    await upstream.wait_until(lambda: upstream.open == 3)
                    await call(chat("small-chat"))
                    assert statuses == [503]
                    assert upstream.calls == before + 3
            assert statuses == [503, 200, 200, 200]
    finally:
        await trio.to_thread.run_sync(server.stop)


@pytest.mark.processes
async def test_pools_that_leave_too_few_client_connections_refuse_the_start(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    config = write_config(tmp_path, upstream)
    result = await trio.to_thread.run_sync(
        partial(
            run_cli,
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--db",
            str(tmp_path / "g.db"),
            env=base_env(FAKE_UPSTREAM_KEY="sk-upstream"),
            cwd=tmp_path,
            timeout=START_TIMEOUT_S,
            preexec_fn=descriptor_limit(TOO_LOW),
        )
    )
    assert result.returncode == 2, result.stderr
    assert_one_line_error(
        result,
        f"descriptor limit {TOO_LOW}",
        "[server] max_connections 1000",
        "[[providers]] max_connections: big 1000, small 20",
        "at most 36 client connections, fewer than 64",
        "ulimit -n",
    )
