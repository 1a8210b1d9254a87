"""The framework patches (gateway/serving/patches/) against the frameworks installed.

Each patch module records, in ``REVIEWED``, the upstream functions and classes it
overrides, copies or relies on: qualified name → (version, SHA-256 of the source). A
version that moves, or a source that changes under the same version, fails here and
names the patch to review and the record to write once it is reviewed. The reviewed
versions are the pins of pyproject.toml, and nothing outside ``gateway/serving/patches/``
reaches into a framework's internals.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import pkgutil
import re
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gateway.serving.patches
from tests.test_layering import ROOT, imported_modules, sources

PATCHES = ROOT / "gateway" / "serving" / "patches"


def patch_modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"gateway.serving.patches.{info.name}")
        for info in pkgutil.iter_modules(gateway.serving.patches.__path__)
    ]


def records() -> list[tuple[ModuleType, str, str, str]]:
    """(patch module, upstream qualified name, version reviewed, source SHA-256)."""
    return [
        (module, name, version, digest)
        for module in patch_modules()
        for name, (version, digest) in getattr(module, "REVIEWED", {}).items()
    ]


def resolve(qualified_name: str) -> Any:
    """The object a dotted name names: its longest importable module, then attributes."""
    parts = qualified_name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(qualified_name)


def normalised(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


@functools.cache
def installed_packages() -> Mapping[str, list[str]]:
    """Top-level package → distributions (a scan of every installed one: once)."""
    return metadata.packages_distributions()


def distribution_of(qualified_name: str) -> str:
    """The installed distribution that provides the top-level package of a name."""
    return normalised(installed_packages()[qualified_name.split(".")[0]][0])


def pins() -> dict[str, str]:
    """pyproject.toml's ``name==version`` dependencies, by normalised name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = (re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", spec) for spec in project["dependencies"])
    return {normalised(m[1]): m[2] for m in found if m}


def review_needed(module: ModuleType, name: str, version: str, digest: str) -> str | None:
    """What to review, when the installed ``name`` is not the one the patch was
    reviewed against; None when it is."""
    distribution = distribution_of(name)
    installed = metadata.version(distribution)
    where = Path(module.__file__ or "").relative_to(ROOT)
    reviewed = f"{where} was reviewed against {name} of {distribution} {version}"
    try:
        actual = hashlib.sha256(inspect.getsource(resolve(name)).encode()).hexdigest()
    except (ImportError, AttributeError):
        return f"{reviewed}, which {distribution} {installed} no longer has: rewrite the patch"
    if (installed, actual) == (version, digest):
        return None
    return (
        f"{reviewed} (source sha256 {digest}); installed: {distribution} {installed}, source"
        f" sha256 {actual}. Review the patch against the installed source, then record"
        f" {name!r}: ({installed!r}, {actual!r}) in its REVIEWED"
    )


def test_every_patch_module_records_what_it_was_reviewed_against() -> None:
    modules = patch_modules()
    assert {m.__name__.rpartition(".")[2] for m in modules} >= {
        "hypercorn_worker",
        "quart_trio_connection",
        "trio_socket",
    }
    assert [m.__name__ for m in modules if not getattr(m, "REVIEWED", None)] == []


@pytest.mark.parametrize(
    ("module", "name", "version", "digest"),
    records(),
    ids=[f"{m.__name__.rpartition('.')[2]}:{name}" for m, name, _, _ in records()],
)
def test_the_patched_upstream_code_is_the_reviewed_one(
    module: ModuleType, name: str, version: str, digest: str
) -> None:
    problem = review_needed(module, name, version, digest)
    assert problem is None, problem


def test_the_reviewed_versions_are_the_pinned_and_installed_ones() -> None:
    pinned = pins()
    reviewed: dict[tuple[str, str], set[str]] = {}
    for module, name, version, _ in records():
        reviewed.setdefault((distribution_of(name), version), set()).add(module.__name__)
    assert {distribution for distribution, _ in reviewed} == {
        "h11",
        "hypercorn",
        "quart",
        "quart-trio",
        "trio",
        "werkzeug",
    }
    for (distribution, version), modules in sorted(reviewed.items()):
        installed = metadata.version(distribution)
        assert (pinned.get(distribution), installed) == (version, version), (
            f"{', '.join(sorted(modules))} reviewed against {distribution} {version};"
            f" pyproject.toml pins {pinned.get(distribution)}, installed {installed}"
        )


def test_a_changed_upstream_is_caught() -> None:
    """The check itself: a recorded hash or version that differs names what to do."""
    module, name, version, digest = records()[0]
    assert review_needed(module, name, version, digest) is None
    for stale in ((version, "0" * 64), ("0.0.1", digest)):
        problem = review_needed(module, name, *stale)
        assert problem is not None
        assert str(Path(module.__file__ or "").relative_to(ROOT)) in problem
        assert f"record {name!r}: ({version!r}, {digest!r}) in its REVIEWED" in problem
    gone = review_needed(module, name + "_gone", version, digest)
    assert gone is not None and "no longer has: rewrite the patch" in gone


#: public modules of the frameworks; any other of theirs is an internal
PUBLIC = {"hypercorn.config", "hypercorn.typing"}
FRAMEWORKS = {"hypercorn", "quart", "quart_trio", "trio", "h11"}
#: the frameworks' private attributes the patches reach (trio's socket, hypercorn's
#: task group)
PRIVATE_ATTRIBUTES = {"_sock", "_nursery"}


def internal(module: str) -> bool:
    parts = module.split(".")
    if parts[0] not in FRAMEWORKS:
        return False
    if parts[0] == "hypercorn":
        return len(parts) > 1 and module not in PUBLIC
    return module in {"quart.asgi", "quart_trio.asgi"} or any(p.startswith("_") for p in parts)


def reaches(path: Path) -> set[str]:
    """The framework internals ``path`` imports, and the private attributes it names."""
    found = {m for m in imported_modules(path) if internal(m)}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRIBUTES:
            found.add(node.value)
    return found


def test_only_the_patches_reach_into_a_framework() -> None:
    offenders = {
        str(path.relative_to(ROOT)): reaches(path)
        for package in ("gateway", "shards")
        for path in sources(package)
        if PATCHES not in path.parents and reaches(path)
    }
    assert offenders == {}, (
        "framework internals outside gateway/serving/patches/: move the code there, with"
        " the upstream code it relies on in its module's REVIEWED"
    )
    inside = set().union(*(reaches(path) for path in PATCHES.glob("*.py")))
    assert {"hypercorn.trio.tcp_server", "quart_trio.asgi", "_sock", "_nursery"} <= inside
