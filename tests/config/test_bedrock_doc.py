"""The configuration example of docs/providers/bedrock.md loads with the real loader."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.config.settings import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers" / "bedrock.md"


def test_the_documented_bedrock_config_loads(tmp_path: Path) -> None:
    examples = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(examples) == 1
    path = tmp_path / "config.toml"
    path.write_text(examples[0], encoding="utf-8")
    config = load_config(path, environ={})
    provider = config.provider("aws")
    assert (provider.kind, provider.region) == ("bedrock", "us-east-1")
    assert provider.base_url == "https://bedrock-runtime.us-east-1.amazonaws.com"
    assert provider.session_token_env == "AWS_SESSION_TOKEN"
    model = next(m for m in config.models if m.id == "claude-sonnet")
    assert (model.cache_read_usd_per_mtok, model.cache_write_usd_per_mtok) == (0.3, 3.75)
