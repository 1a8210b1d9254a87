"""One TLS context for every test client that asks for the default one.

httpx (and the ``openai`` client's httpx2) build a new SSL context from certifi's bundle
for every client, 10–25 ms of CPU each: before this, the largest single cost of the quick
tier (a test makes two or three clients). The tests' clients speak plain HTTP to loopback
servers, so the clients that ask for the default verification share one context, built
once per process; a client given a context of its own (the TLS tests' throwaway CA) keeps
it. :func:`install` is called once, from ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

#: the transport modules that look ``create_ssl_context`` up for each client they build
TRANSPORTS = ("httpx._transports.default", "httpx2._transports.default")


def _sharing(build: Callable[..., Any]) -> Callable[..., Any]:
    once = functools.cache(build)

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is True and cert is None:
            return once(True, None, trust_env)
        return build(verify=verify, cert=cert, trust_env=trust_env)

    return create_ssl_context


def install() -> None:
    for name in TRANSPORTS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.create_ssl_context = _sharing(module.create_ssl_context)
