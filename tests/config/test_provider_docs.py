"""Every configuration example of docs/providers/*.md loads with the real loader, so a
document cannot drift from the configuration it describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config.settings import load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers"
_TOML = re.compile(r"^```toml\n(.*?)^```", re.DOTALL | re.MULTILINE)
EXAMPLES = [
    pytest.param(page, index, block, id=f"{page.stem}-{index}")
    for page in sorted(DOCS.glob("*.md"))
    for index, block in enumerate(_TOML.findall(page.read_text(encoding="utf-8")))
]


def test_every_provider_page_has_an_example() -> None:
    pages = {page for page, _, _ in (example.values for example in EXAMPLES)}
    assert pages == set(DOCS.glob("*.md")) and pages


@pytest.mark.parametrize(("page", "index", "block"), EXAMPLES)
def test_the_example_loads(tmp_path: Path, page: Path, index: int, block: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(block, encoding="utf-8")
    config = load_config(path, environ={})
    assert config.providers and config.models
    kinds = {provider.kind for provider in config.providers}
    assert page.stem in kinds, f"{page.name}'s example configures no {page.stem} provider"
