"""Every configuration example of docs/providers/azure.md and pricing.md loads with the
real config loader (a file on disk, ``load_config``), and says what the text says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config.settings import Config, load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers"
_TOML = re.compile(r"```toml\n(.*?)```", re.DOTALL)


def examples(name: str) -> list[str]:
    found = _TOML.findall((DOCS / name).read_text(encoding="utf-8"))
    assert found, f"no toml example in {name}"
    return found


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={})


@pytest.mark.parametrize("name", ["azure.md", "pricing.md"])
def test_every_example_loads(tmp_path: Path, name: str) -> None:
    for text in examples(name):
        config = load(tmp_path, text)
        assert config.models and config.providers


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
