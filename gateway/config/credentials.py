"""The provider credentials a configuration names, checked against the environment.

A provider's key is read from the environment variable its table names (``api_key_env``,
and bedrock's ``access_key_id_env`` / ``secret_access_key_env``), at each call. A name
whose variable is not set would send calls without a credential, to be refused upstream
one by one: ``serve`` refuses to start instead, naming the variable. A provider that needs
no key (a local vLLM or Ollama) or serves only BYOK keys (the organisation's own key,
registered with ``org byok``) leaves ``api_key_env`` out.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.settings import Config

#: bedrock's credential variables that must be set (the session token is optional)
BEDROCK_REQUIRED = ("access_key_id_env", "secret_access_key_env")


def missing_credentials(config: Config, environ: Mapping[str, str]) -> list[str]:
    """``providers[i].<key>: VAR is not set`` for each named variable that is unset or
    empty, in the order of the file."""
    missing = []
    for index, provider in enumerate(config.providers):
        keys = BEDROCK_REQUIRED if provider.kind == "bedrock" else ("api_key_env",)
        for key in keys:
            name = getattr(provider, key)
            if name and not environ.get(name):
                missing.append(f"providers[{index}].{key}: {name} is not set")
    return missing
