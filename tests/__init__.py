"""The tests, in folders that mirror ``gateway/``'s layers (docs/ARCHITECTURE.md).

A test lives beside the layer whose code it pins: ``serving/`` (connections, socket I/O,
the heap, readiness, descriptor and abuse limits), ``edge/`` (authentication, bodies,
routes, idempotency replays, OpenAPI and fuzzing, the dashboard, the ``openai`` client's
expectations), ``calls/`` (parsing, estimates, admission, policy, settlement, streams),
``accounts/``, ``providers/``, ``store/``, ``observe/``, ``config/``, ``cli/`` and
``shards/``. Two folders hold whole-process tests that cross the layers: ``money/``
(durable money: killed servers, clients that leave, database faults) and ``cluster/``
(several nodes on one PostgreSQL). At the root: ``conftest.py`` (the in-process gateway
and the shared fixtures), ``test_layering.py`` (the tree itself) and
``test_error_catalog.py`` (``gateway/errors.py``). Helpers that are not tests live in
``support/``: ``procs.py`` (``serve`` subprocesses), ``pg_cluster.py`` (a throwaway
PostgreSQL), ``fake_upstream.py`` and ``fake_client.py`` (the fakes on either side of
the gateway), ``waiting.py`` (the one bounded poll).

Every folder is a package, so a test module is imported once, under its dotted name, even
when another module imports its fixtures.
"""

import os
import sys

# Bytecode as Python writes it by default, even where the environment sets
# PYTHONDONTWRITEBYTECODE (container images do): without it every process of the suite
# compiled the project anew, each gateway and CLI process the tests start (~0.18 s of a
# serve's ~0.75 s start; ~400 such processes per run) and each worker's assertion rewrite
# of every test module (~6 s of its start). The files go to __pycache__ beside the
# sources (git ignores them); this runs before conftest.py, so the xdist workers and every
# process the tests start inherit it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
