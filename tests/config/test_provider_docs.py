"""Every configuration example of docs/providers/*.md loads with the real loader (a file
on disk, ``load_config``), so a document cannot drift from the configuration it
describes; a kind's page configures that kind, and some say what their text says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config.settings import PROVIDER_KINDS, Config, load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers"
_TOML = re.compile(r"^```toml\n(.*?)^```", re.DOTALL | re.MULTILINE)
EXAMPLES = [
    pytest.param(page, index, block, id=f"{page.stem}-{index}")
    for page in sorted(DOCS.glob("*.md"))
    for index, block in enumerate(_TOML.findall(page.read_text(encoding="utf-8")))
]


def examples(name: str) -> list[str]:
    return [str(example.values[2]) for example in EXAMPLES if example.values[0].name == name]


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={})


def test_every_provider_page_has_an_example() -> None:
    pages = {page for page, _, _ in (example.values for example in EXAMPLES)}
    assert pages == set(DOCS.glob("*.md")) and pages


@pytest.mark.parametrize(("page", "index", "block"), EXAMPLES)
def test_the_example_loads(tmp_path: Path, page: Path, index: int, block: str) -> None:
    config = load(tmp_path, block)
    assert config.providers and config.models
    if page.stem in PROVIDER_KINDS:
        kinds = {provider.kind for provider in config.providers}
        assert page.stem in kinds, f"{page.name}'s example configures no {page.stem} provider"


def test_the_azure_examples_are_the_two_surfaces(tmp_path: Path) -> None:
    v1, deployments = (load(tmp_path, text) for text in examples("azure.md"))
    azure = [p for p in v1.providers if p.kind == "azure"]
    assert [p.api_version for p in azure] == [None]
    assert azure[0].base_url == "https://contoso-eastus.openai.azure.com"
    dated = [p for p in deployments.providers if p.kind == "azure"]
    assert [p.api_version for p in dated] == ["2024-10-21"]


def test_the_pricing_example_has_both_cache_prices(tmp_path: Path) -> None:
    (text,) = examples("pricing.md")
    model = load(tmp_path, text).models[0]
    assert (model.cache_read_usd_per_mtok, model.cache_write_usd_per_mtok) == (0.3, 3.75)
