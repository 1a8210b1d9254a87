"""URL builders compiled on first use (gateway/serving/patches/werkzeug_rules.py) build
the URLs Werkzeug's own builders build, for every route of the app."""

from __future__ import annotations

from pathlib import Path

from werkzeug.routing import AnyConverter

from gateway.edge.app import create_app
from gateway.serving.patches.werkzeug_rules import LazyBuilders
from gateway.serving.runtime import Runtime
from tests.conftest import make_config


def test_every_route_builds_the_url_werkzeugs_builder_builds(tmp_path: Path) -> None:
    runtime = Runtime.open(make_config(tmp_path))
    try:
        plain, lazy = create_app(runtime), create_app(runtime, LazyBuilders)
        built = 0
        for rule in plain.url_map.iter_rules():
            values = {name: f"v-{name}" for name in rule.arguments}
            for name, converter in rule._converters.items():
                if isinstance(converter, AnyConverter):  # <any(enable, disable):action>
                    values[name] = min(converter.items)
            expected = plain.url_map.bind("gw.test").build(rule.endpoint, values)
            # twice: the first call compiles the builder, the second uses the kept one
            for _ in range(2):
                assert lazy.url_map.bind("gw.test").build(rule.endpoint, values) == expected
            built += 1
        assert built > 40
        assert lazy.url_map.bind("gw.test").build(
            "dashboard.static", {"filename": "dashboard.css", "v": "1"}
        ) == plain.url_map.bind("gw.test").build(
            "dashboard.static", {"filename": "dashboard.css", "v": "1"}
        )
    finally:
        runtime.store.close()
