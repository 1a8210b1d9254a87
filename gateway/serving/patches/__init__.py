"""Every change this server makes to its frameworks' code, one module per framework.

Each module here overrides, copies or reaches into code that its framework does not
offer as an interface: ``hypercorn_worker`` (hypercorn's trio worker, its connection,
the disconnect it hands the app with an answer's last bytes, and the chunks of a streamed
answer framed as h11 frames them), ``quart_trio_connection``
(Quart-Trio's HTTP connection), ``werkzeug_rules`` (URL builders compiled on first use)
and ``trio_socket`` (the stdlib socket under trio's stream). Nowhere else in
``gateway/`` imports a framework's internals (``tests/serving/test_framework_patches.py``).

The frameworks are pinned to exact versions (``pyproject.toml``). Each module's
``REVIEWED`` records the upstream code it was reviewed against: qualified name → (the
version, the SHA-256 of that function's or class's source). The test fails when the
installed version or source differs: review the patch against the new source, then
record the new pair. This package imports none of its modules (``connections`` imports
``trio_socket``, and ``hypercorn_worker`` imports ``connections``).
"""
