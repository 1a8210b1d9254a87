"""Real gateway processes for the operator-contract tests.

``start_server`` runs ``python -m gateway serve --json`` as a subprocess on a loopback
port the OS picks, with a SQLite file in a temp dir, and waits (bounded) for the JSON
object it prints once listening (a test harness is a program reading stdout: it asks for
the machine output, the one that carries the sandbox key when stdout is not a terminal);
``run_cli`` runs one CLI verb as a subprocess. Nothing here imports the gateway: the
processes are the thing under test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "procs-admin-token"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
CLI_TIMEOUT_S = 30.0


def base_env(admin_token: str | None = ADMIN_TOKEN, **extra: str) -> dict[str, str]:
    """The caller's environment without any SVC_* setting, plus the repo on PYTHONPATH."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SVC_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    if admin_token is not None:
        env["SVC_ADMIN_TOKEN"] = admin_token
    env.update(extra)
    return env


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = CLI_TIMEOUT_S,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``svc-gateway ARGS...`` (as ``python -m gateway``), bounded, output captured;
    ``preexec_fn`` runs in the child before it starts (e.g. to lower a resource limit)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env=env if env is not None else base_env(),
        cwd=cwd,
        preexec_fn=preexec_fn,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a verb with ``--json``; it must succeed and print exactly one JSON object."""
    result = run_cli(*args, "--json", env=env)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr}"
    data = json.loads(result.stdout)  # the whole stdout: one JSON document, nothing else
    assert isinstance(data, dict), result.stdout
    return data


def our_error_lines(stderr: str) -> list[str]:
    """The CLI's own error lines (hypercorn and logging lines may surround them)."""
    return [line for line in stderr.splitlines() if line.startswith("svc-gateway:")]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A non-zero exit with exactly one ``svc-gateway:`` line naming every needle."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = our_error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@dataclass
class Server:
    """A running ``svc-gateway serve`` process."""

    proc: subprocess.Popen[str]
    url: str
    port: int
    token: str | None
    stdout_lines: list[str]
    stderr_path: Path
    _lines: queue.Queue[str | None] = field(repr=False)
    _pump: threading.Thread = field(repr=False)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0)

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        with self.client(token) as client:
            return client.get(path)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` and wait for the exit (bounded); return the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"server did not exit within {timeout} s of {sig.name}\n{self.stderr()}"
            ) from None
        _reap(self.proc, self._pump)
        return status

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        _reap(self.proc, self._pump)


def _reap(proc: subprocess.Popen[str], pump: threading.Thread) -> None:
    """Wait for the exit and the end of the stdout reader, then close the pipe."""
    proc.wait(timeout=STOP_TIMEOUT_S)
    pump.join(timeout=STOP_TIMEOUT_S)
    if proc.stdout is not None:
        proc.stdout.close()


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def start_server(
    tmp_path: Path,
    *args: str,
    db: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
    preexec_fn: Callable[[], None] | None = None,
) -> Server:
    """Start ``serve --json --port 0 --db DB`` in ``tmp_path``; wait for its JSON line.

    Returns once the server printed ``{"url", "database", "sandbox_key"}`` (``token`` is
    that key: null on an existing database or without demo data); fails with the
    server's stderr otherwise. ``preexec_fn`` runs in the child before it starts.
    """
    db = db if db is not None else tmp_path / "g.db"
    stderr_path = tmp_path / f"server-{os.urandom(4).hex()}.stderr"
    command = ["serve", "--json", "--port", "0", "--db", str(db), *args]
    with stderr_path.open("w") as stderr_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *command],
            cwd=tmp_path,
            env=env if env is not None else base_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            preexec_fn=preexec_fn,
        )
    lines: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    pump.start()

    def fail(why: str) -> NoReturn:
        if proc.poll() is None:
            proc.kill()
        _reap(proc, pump)
        raise AssertionError(f"{why}\n--- stderr ---\n{stderr_path.read_text()}")

    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        fail(f"server printed nothing within {timeout} s")
    if line is None:
        fail(f"server exited during start-up with status {proc.wait(timeout=5)}")
    info = json.loads(line)
    if "error" in info:  # refused under --json: the error object, then its line and exit
        status = proc.wait(timeout=5)
        fail(f"server refused to start (status {status}): {info['error']['message']}")
    url = info["url"]
    assert url.startswith("http://127.0.0.1:"), url
    port = int(url.rsplit(":", 1)[1])
    token = info["sandbox_key"]
    return Server(proc, url, port, token, [line], stderr_path, lines, pump)


__all__ = [
    "ADMIN_TOKEN",
    "REPO_ROOT",
    "Server",
    "assert_one_line_error",
    "base_env",
    "cli_json",
    "our_error_lines",
    "run_cli",
    "start_server",
]
