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
