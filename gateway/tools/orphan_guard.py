"""``python -m gateway.tools.orphan_guard CMD...``: run a stdio MCP server that dies with us.

The gateway starts each stdio upstream through this small launcher. It runs the server
as its child (stdin and stdout passed through), and ends it when the gateway process is
gone: its parent changed (the gateway was killed, even by SIGKILL, and the launcher was
reparented) or it was asked to stop (SIGTERM, SIGINT). ``prctl(PR_SET_PDEATHSIG)`` would
not do: trio spawns children from a worker thread, and the signal follows the death of
that thread, not of the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

#: how often the launcher looks at its parent
POLL_S = 0.2
#: how long the server has to end after SIGTERM before it is killed
STOP_S = 2.0


def _stop(child: subprocess.Popen[bytes]) -> int:
    child.terminate()
    try:
        return child.wait(STOP_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m gateway.tools.orphan_guard CMD [ARG...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)
    stopping = False

    def asked(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, asked)
    signal.signal(signal.SIGINT, asked)
    while True:
        try:
            return child.wait(POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if stopping or os.getppid() != parent:
            return _stop(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
