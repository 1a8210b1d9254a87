"""A throwaway PostgreSQL 15 cluster for the tests and the benches.

``initdb`` + ``pg_ctl`` in a temp dir, listening on 127.0.0.1 and a free port, its unix
socket inside the same dir. ``initdb`` refuses to run as root: as root the cluster runs as
the ``postgres`` system user (``runuser``), in a dir that user owns (and can reach: the
dir is made world-traversable, as ``/tmp``'s own temp dirs are not). Nothing here imports
the gateway.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: where Debian puts a PostgreSQL's programs (not on PATH), newest version first
BIN_GLOB = "/usr/lib/postgresql/*/bin"
TIMEOUT_S = 60.0


def find_bin_dir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``, or None when PostgreSQL is absent."""
    debian = sorted(glob.glob(BIN_GLOB), key=lambda d: int(Path(d).parent.name), reverse=True)
    for name in (os.environ.get("SVC_TEST_PG_BIN"), *debian):
        if name and all((Path(name) / tool).exists() for tool in ("initdb", "pg_ctl", "psql")):
            return Path(name)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """One running cluster: ``url(dbname)`` names a database on it (user ``postgres``)."""

    bin_dir: Path
    root: Path
    port: int
    run_as: str | None
    #: the server's default durability (fsync); tests run without it (a test is no crash)
    durable: bool = False

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        # cwd: the cluster's own dir, which the postgres user can enter (the caller's may not)
        return subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, check=check, cwd=self.root
        )

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port}"
            f" -c unix_socket_directories={self.root} -c max_connections=200"
        )
        if not self.durable:
            options += " -c fsync=off -c full_page_writes=off"
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
        )

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(self.data), check=False)

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        return self._run(
            "psql",
            "-X",
            "-q",
            "-A",
            "-t",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            dbname,
            "-c",
            sql,
        ).stdout


def start_cluster(bin_dir: Path, *, durable: bool = False) -> Cluster:
    """initdb a new cluster in a temp dir and start it; the caller must ``destroy`` it."""
    run_as = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="svc-pg-"))
    root.chmod(0o755)
    if run_as is not None:
        user = pwd.getpwnam(run_as)
        os.chown(root, user.pw_uid, user.pw_gid)
    cluster = Cluster(bin_dir=bin_dir, root=root, port=free_port(), run_as=run_as, durable=durable)
    try:
        cluster._run(
            "initdb",
            "-D",
            str(cluster.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        cluster.start()
    except BaseException:
        destroy(cluster)
        raise
    return cluster


def destroy(cluster: Cluster) -> None:
    """Stop the cluster (if it runs) and remove its directory. A postmaster that outlives
    ``pg_ctl stop`` (seen once after a full run, cause not found) is shut down by signal."""
    pid_file = cluster.data / "postmaster.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text().split()[0])
        cluster.stop()
        with contextlib.suppress(OSError):
            if b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown
    shutil.rmtree(cluster.root, ignore_errors=True)
