"""GET /healthz and GET /readyz: liveness and readiness for load balancers (no key); and
GET /, which points to the catalog, the dashboard and the API document.

/healthz answers 200 ``{"status":"ok"}`` while the process serves at all. /readyz
answers 200 ``{"status":"ready"}`` only when the server is past start-up, not stopping,
every shard actor runs, the store answers within a bound and (several nodes) the node
holds fresh leases; otherwise 503
``{"status":"unready","reason":...}`` with the first reason found (see
:mod:`gateway.serving.readiness`).
"""

from __future__ import annotations

from quart import Quart, Response

from gateway import __version__
from gateway.edge.exchange import refused
from gateway.edge.http import json_response, runtime
from gateway.observe.metrics import UNREADY
from gateway.serving.readiness import STORE_TIMEOUT_S, Phase, unready_reason

#: answered in every phase; every other path waits for READY (see gateway.edge.app)
PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
NO_STORE = {"Cache-Control": "no-store"}


async def healthz() -> Response:
    return json_response({"status": "ok"}, headers=NO_STORE)


async def readyz() -> Response:
    rt = runtime()
    phase = rt.readiness.phase
    shards_running = rt.pool.statistics().running
    store_answers = (
        phase is Phase.READY and shards_running and await rt.store.answers(STORE_TIMEOUT_S)
    )
    fenced = rt.cluster is not None and not rt.cluster.admitting()
    reason = unready_reason(
        phase, shards_running, store_answers, fenced, settlements_queued=rt.store.deferred > 0
    )
    if reason is None:
        return json_response({"status": "ready"}, headers=NO_STORE)
    refused(UNREADY)  # logged and counted as what it is: no code would read internal_error
    return json_response({"status": "unready", "reason": reason}, 503, headers=NO_STORE)


async def index() -> Response:
    """``GET /``: where things are, for someone who opened the server's address (no key)."""
    return json_response(
        {
            "object": "svc-gateway",
            "version": __version__,
            "message": "A key-authenticated gateway for language-model calls: the API is"
            " under /v1 (Authorization: Bearer <key>), organisations' users sign in at"
            " /dashboard/.",
            "links": {
                "models": "/v1/models",
                "dashboard": "/dashboard/",
                "openapi": "/openapi.json",
                "health": "/healthz",
            },
        }
    )


def register(app: Quart) -> None:
    app.add_url_rule("/", "index", index, methods=["GET"])
    app.add_url_rule("/healthz", "healthz", healthz, methods=["GET"])
    app.add_url_rule("/readyz", "readyz", readyz, methods=["GET"])
