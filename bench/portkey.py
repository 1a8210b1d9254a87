"""The Portkey OSS gateway as a pure-proxy reference for ``bench/live_upstream.py --portkey``.

Issue 34 sets svc-gateway's CPU per call and per streamed chunk against its base revision;
``--portkey`` also says where it stands against a gateway that only relays: Portkey's
open-source gateway (Node.js, Hono), from npm. Installed once into a directory under the
temp dir (``svc-bench-portkey-<version>``, a ``ready`` marker once complete, reused after),
pinned exactly: ``@portkey-ai/gateway`` 1.15.2 with ``@hono/node-server`` 1.13.5 and
``hono`` 4.9.7, npm ``overrides`` making the gateway's own dependencies resolve to those
(newer ones break its streams); the installed versions are checked.

Portkey has no configuration of providers here: it routes each request by its headers
(:func:`route_headers`): ``x-portkey-provider: openai`` and ``x-portkey-custom-host`` (the
fake upstream's ``/v1`` URL; 127.0.0.1 is among its default trusted custom hosts), with the
upstream's key as the ``Authorization`` bearer. It maps no model names: calls name the
upstream's model. Its ``build/start-server.js`` takes the port as ``--port=N`` but has no
host option: it listens on every interface. The bench runs a copy of it beside
``node_modules`` whose one call to ``serve`` also names ``hostname: "127.0.0.1"``
(:func:`loopback_copy`: the call must be found exactly once, else the run stops), so
that nothing of the bench is reachable from outside the machine. ``--headless`` and
``NODE_ENV=production`` leave out its logs UI and the log stream behind it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import trio

from bench.streaming import Server, pinned
from tests.support.pg_cluster import free_port
from tests.support.waiting import until

VERSION = "1.15.2"
#: every package pinned, the gateway's own dependencies included (npm ``overrides``)
PINS = {"@portkey-ai/gateway": VERSION, "@hono/node-server": "1.13.5", "hono": "4.9.7"}
START_TIMEOUT_S = 30.0
#: the call of @hono/node-server's ``serve`` in start-server.js 1.15.2 (minified), and
#: what the loopback copy makes of it
SERVE_CALL = "port:Ku})"
SERVE_LOOPBACK = 'port:Ku,hostname:"127.0.0.1"})'


def install() -> Path:
    """Portkey's server, installed by npm on first use (then reused): the loopback copy
    of its ``start-server.js`` (:func:`loopback_copy`)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise SystemExit("--portkey needs node and npm on the PATH (Portkey runs on Node.js)")
    home = Path(tempfile.gettempdir()) / f"svc-bench-portkey-{VERSION}"
    script = home / "start-server-loopback.mjs"
    if (home / "ready").exists() and script.exists():
        return script
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    overrides = {name: pin for name, pin in PINS.items() if name != "@portkey-ai/gateway"}
    package = {
        "name": "svc-bench-portkey",
        "private": True,
        "dependencies": PINS,
        "overrides": overrides,
    }
    (home / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund"],
        cwd=home,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for name, pin in PINS.items():
        found = json.loads((home / "node_modules" / name / "package.json").read_text())["version"]
        if found != pin:
            raise SystemExit(f"npm installed {name} {found}, not {pin}: see {home}")
    loopback_copy(
        home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js", script
    )
    (home / "ready").touch()
    return script


def loopback_copy(original: Path, copy: Path) -> None:
    """``original`` (Portkey's start-server.js) as ``copy``, listening on 127.0.0.1 only;
    the copy sits beside ``node_modules``, where its imports resolve as the original's."""
    source = original.read_text()
    if source.count(SERVE_CALL) != 1:
        raise SystemExit(f"{original}: its serve() call is not the one this bench patches")
    copy.write_text(source.replace(SERVE_CALL, SERVE_LOOPBACK))


def describe() -> str:
    """What runs, for the notes under the table."""
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    pins = ", ".join(f"{name} {pin}" for name, pin in PINS.items())
    return f"Portkey's gateway from npm ({pins}) on Node.js {node.stdout.strip()}"


def route_headers(upstream_url: str) -> dict[str, str]:
    """The headers by which Portkey sends a call to the OpenAI-compatible ``upstream_url``
    (its ``/v1`` base); the upstream's key goes as the ``Authorization`` bearer."""
    return {"x-portkey-provider": "openai", "x-portkey-custom-host": upstream_url}


async def start(script: Path, workdir: Path, cpus: set[int] | None) -> Server:
    """Portkey on a free loopback port (``cpus``: the cores it and its threads may run on),
    once it answers HTTP, and if it works alone (:func:`check_alone`)."""
    workdir.mkdir()
    port = free_port()
    stderr_path = workdir / "portkey.stderr"
    env = {**os.environ, "NODE_ENV": "production"}
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            ["node", str(script), f"--port={port}", "--headless"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            preexec_fn=pinned(cpus),
        )
    server = Server(proc, f"http://127.0.0.1:{port}", stderr_path)

    async def answers() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"Portkey exited:\n{stderr_path.read_text()}")
        try:
            async with httpx.AsyncClient() as client:
                await client.get(server.url)
        except httpx.TransportError:
            return False
        return True

    try:
        ready: bool = await until(answers, within=START_TIMEOUT_S, every=0.1)
        assert ready
    except trio.TooSlowError:
        server.stop()
        raise SystemExit(f"Portkey did not answer:\n{stderr_path.read_text()}") from None
    try:
        check_alone(proc.pid)
    except SystemExit:
        server.stop()
        raise
    return server


def check_alone(pid: int) -> None:
    """Stop the run if ``pid`` (any of its threads) has child processes: the CPU figure
    reads the node process's clock, which a child's work would escape."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "children").read_text().split():
            raise SystemExit("Portkey started child processes: their CPU would not be counted")
