"""The layering rules of docs/ARCHITECTURE.md, read from the source's import statements.

- ``gateway/`` is in layer folders: at most a few modules directly in it, and no two
  modules of the project share a file name;
- ``shards/`` imports nothing from ``gateway/`` (it decides admissions for any front end);
- only ``gateway/store/`` imports a database driver (sqlite, psycopg): nothing above the
  store knows which backend it runs on;
- no import cycle inside ``gateway/`` or ``shards/``, imports under ``if TYPE_CHECKING:``
  included, and those type-only imports are counted (they may not grow unseen);
- only ``gateway/observe/otel.py`` imports the OpenTelemetry SDK;
- only ``gateway/edge/`` imports quart; only ``gateway/serving/`` imports hypercorn (the
  edge's ASGI wrappers use ``edge/asgi.py``'s types); ``calls/`` and ``accounts/`` never import
  ``serving/`` (the runtime): they take the parts they use, or a protocol beside them;
- only the HTTP handlers (``gateway/edge/routes/``, ``gateway/edge/dashboard/``) read
  the runtime from the request's app (``http.runtime()``); below them it is passed as an
  argument.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def parse(path: Path) -> ast.Module:
    """The syntax tree of a source file, parsed once a run: the rules read the same ~200
    files again and again (read only: ``ast.walk`` and ``iter_child_nodes`` change nothing)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported_modules(path: Path) -> set[str]:
    tree = parse(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


#: modules directly in gateway/ besides its layer folders, at most
TOP_LEVEL_MODULES = 10


def test_gateway_is_in_layer_folders() -> None:
    top = sorted(path.name for path in (ROOT / "gateway").glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, top


def test_no_two_modules_share_a_file_name() -> None:
    seen: dict[str, list[str]] = {}
    for package in ("gateway", "shards"):
        for path in sources(package):
            if path.name != "__init__.py":
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


@pytest.mark.parametrize("path", sources("shards"), ids=lambda p: p.name)
def test_shards_import_nothing_from_gateway(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m == "gateway" or m.startswith("gateway.")}
    assert not bad, f"{path.name} imports {bad}"


DRIVERS = {"sqlite3", "sqlite_utils", "psycopg", "psycopg_binary", "asyncpg"}


def test_only_the_store_imports_a_database_driver() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("gateway", "shards")
        for path in sources(package)
        if "store" not in path.relative_to(ROOT).parts
        and {m.split(".")[0] for m in imported_modules(path)} & DRIVERS
    ]
    assert offenders == []


def test_the_rules_see_real_imports() -> None:
    """The scanner itself: it finds the imports it is meant to police."""
    assert {"sqlite_utils", "psycopg"} <= {
        m.split(".")[0] for p in sources("gateway/store") for m in imported_modules(p)
    }
    assert "shards" in imported_modules(ROOT / "gateway" / "serving" / "runtime.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path, with_type_only: bool = False) -> Iterator[str]:
    """Every module, or ``module.name``, that ``path`` imports when it runs: at the top,
    in functions, anywhere but under ``if TYPE_CHECKING:``. ``from package import sub``
    is an import of the submodule: a package's ``__init__`` that imports its own
    submodules makes no cycle with them (their parent runs first, as for any import)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]

    def visit(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if (
                not with_type_only
                and isinstance(child, ast.If)
                and getattr(child.test, "id", None) == "TYPE_CHECKING"
            ):
                for stmt in child.orelse:
                    yield from visit(stmt)
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                yield from (f"{module}.{alias.name}" for alias in child.names)
            yield from visit(child)

    yield from visit(parse(path))


def import_graph(package: str, with_type_only: bool = False) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports at run time (and, ``with_type_only``,
    under ``if TYPE_CHECKING:``)."""
    modules = {module_name(path): path for path in sources(package)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in runtime_imports(path, with_type_only):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected parts of two or more."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            part = [stack.pop()]
            while part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in graph:
        if node not in order:
            visit(node)
    return found


def test_no_import_cycle_inside_gateway() -> None:
    assert cycles(import_graph("gateway")) == []


def test_the_cycle_finder_finds_cycles() -> None:
    """The finder itself: a cycle it is shown is a cycle it reports."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "gateway.serving.runtime" in import_graph("gateway")["gateway.edge.app"]


def test_only_the_http_handlers_read_the_runtime_from_the_app() -> None:
    readers = [
        str(path.relative_to(ROOT))
        for path in sources("gateway")
        for node in ast.walk(parse(path))
        if isinstance(node, ast.ImportFrom)
        and node.module == "gateway.edge.http"
        and "runtime" in {alias.name for alias in node.names}
    ]
    assert readers, "the scanner sees no reader at all"
    handlers = ("gateway/edge/routes/", "gateway/edge/dashboard/")
    assert [r for r in readers if not r.startswith(handlers)] == []


def every_import(path: Path) -> Iterator[str]:
    """Every module, or ``module.name``, ``path`` imports, type-only imports included."""
    return runtime_imports(path, with_type_only=True)


@pytest.mark.parametrize("package", ["gateway", "shards"])
def test_no_import_cycle_even_of_type_only_imports(package: str) -> None:
    assert cycles(import_graph(package, with_type_only=True)) == []


#: ``if TYPE_CHECKING:`` blocks in gateway/ and shards/, at most: each is an import a
#: module needs only for its annotations; a new one must be a choice, not a way around
#: the rules above (the 14th: httpx in providers/guardrail_webhook.py, imported when a
#: webhook guardrail is first asked, not at every start)
TYPE_CHECKING_BLOCKS = 14


def test_type_only_imports_are_counted() -> None:
    blocks = [
        str(path.relative_to(ROOT))
        for package in ("gateway", "shards")
        for path in sources(package)
        for node in ast.walk(parse(path))
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    ]
    assert 0 < len(blocks) <= TYPE_CHECKING_BLOCKS, blocks


def importers(package: str, prefix: str) -> list[str]:
    """The modules of ``package`` that import ``prefix`` (a module or package name)."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in sources(package)
        if any(m == prefix or m.startswith(prefix + ".") for m in every_import(path))
    )


def test_only_the_edge_imports_quart() -> None:
    assert [p for p in importers("gateway", "quart") if not p.startswith("gateway/edge/")] == []
    assert importers("gateway", "quart"), "the scanner sees no quart import at all"


def test_only_serving_imports_hypercorn() -> None:
    assert [
        p for p in importers("gateway", "hypercorn") if not p.startswith("gateway/serving/")
    ] == []
    assert importers("gateway", "hypercorn"), "the scanner sees no hypercorn import at all"


def test_only_observe_otel_imports_the_opentelemetry_sdk() -> None:
    """The edge and the calls see spans through observe/tracing.py's protocols."""
    assert importers("gateway", "opentelemetry") == ["gateway/observe/otel.py"]


@pytest.mark.parametrize("layer", ["calls", "accounts"])
def test_calls_and_accounts_never_take_the_runtime(layer: str) -> None:
    assert importers(f"gateway/{layer}", "gateway.serving") == []
    assert importers("gateway/edge", "gateway.serving"), "the scanner sees no such import"
