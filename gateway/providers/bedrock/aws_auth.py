"""AWS credentials of a bedrock provider, SigV4 signing by botocore, and their redaction.

Credentials are read from the process environment at each call (as the other kinds read
their key at each use). That environment is fixed when the process starts, so a rotated
key pair takes effect at the next start. Where they come from:

    the call's ProviderRequest.api_key     credentials
    -------------------------------------  ------------------------------------------------
    None (a gateway key)                   the provider's access_key_id_env,
                                           secret_access_key_env, session_token_env
    "AKID:SECRET" or "AKID:SECRET:TOKEN"   an organisation's own key pair (BYOK): its
                                           credential's environment variable holds the
                                           pair, colon-separated (AWS ids, secrets and
                                           session tokens never contain a colon)

Missing or malformed credentials refuse the call (:class:`ProviderRefused` 401, so that a
BYOK one is ``byok_credential_rejected``) before anything is sent: never an unsigned call.

botocore signs (``SigV4Auth``, service ``bedrock``); the bytes go out through our own
HTTP/1.1 pool. botocore's ``botocore.auth`` logger writes the canonical request and the
signature at DEBUG: it is held at INFO here, whatever the gateway's log level.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.calls.provider_errors import REDACTED, redact_secrets
from gateway.config.settings import ProviderConfig
from gateway.providers.base import ProviderRefused

SERVICE = "bedrock"
#: the documented shape of a BYOK credential of a bedrock provider
BYOK_SHAPE = "ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]"
logging.getLogger("botocore.auth").setLevel(logging.INFO)

#: SigV4 material an AWS error may echo: signatures, credential scopes, security tokens
_SIGNED_PARTS = re.compile(
    r"(?i)\b(signature|x-amz-signature|x-amz-security-token|credential|x-amz-credential)"
    r"(\s*[=:]\s*)[^\s,;&\"']+"
)


@dataclass(frozen=True, slots=True)
class AWSCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def secrets(self) -> list[str]:
        return [s for s in (self.access_key_id, self.secret_access_key, self.session_token) if s]


def own_credentials(config: ProviderConfig) -> AWSCredentials | None:
    """The provider's credentials from its environment variables; None when either of
    the key pair is unset."""
    key_id = os.environ.get(config.access_key_id_env)
    secret = os.environ.get(config.secret_access_key_env)
    if not key_id or not secret:
        return None
    return AWSCredentials(key_id, secret, os.environ.get(config.session_token_env) or None)


def byok_credentials(api_key: str) -> AWSCredentials | None:
    """An organisation's key pair, ``ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]``."""
    parts = api_key.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts):
        return None
    return AWSCredentials(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def credentials_for(config: ProviderConfig, api_key: str | None) -> AWSCredentials:
    """The credentials of one call, or the refusal that says what is missing."""
    if api_key is not None:
        found = byok_credentials(api_key)
        if found is None:
            raise ProviderRefused(
                401, f"the organisation's AWS credential must have the shape {BYOK_SHAPE}"
            )
        return found
    found = own_credentials(config)
    if found is None:
        raise ProviderRefused(
            401,
            f"no AWS credentials for provider {config.name!r}: set "
            f"{config.access_key_id_env} and {config.secret_access_key_env}",
        )
    return found


def signed_headers(
    credentials: AWSCredentials, region: str, url: str, body: bytes, headers: dict[str, str]
) -> dict[str, str]:
    """``headers`` plus ``X-Amz-Date``, ``Authorization`` (and ``X-Amz-Security-Token``)
    of a SigV4-signed ``POST url``; ``Host`` is signed from ``url`` and sent by the pool."""
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    aws = Credentials(
        credentials.access_key_id, credentials.secret_access_key, credentials.session_token
    )
    SigV4Auth(aws, SERVICE, region).add_auth(request)
    return {name: str(value) for name, value in request.headers.items()}


def split_secrets(secrets: Iterable[str]) -> list[str]:
    """Each secret and, for a BYOK key pair, each of its parts (an AWS error echoes the
    access key id or the token alone, never the colon-joined credential)."""
    found: list[str] = []
    for secret in secrets:
        found.append(secret)
        if ":" in secret:
            found.extend(secret.split(":"))
    return found


def redact_aws(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of ``secrets`` nor any signature, credential scope or security
    token it quotes."""
    text = redact_secrets(text, split_secrets(secrets))
    return _SIGNED_PARTS.sub(lambda m: m[1] + m[2] + REDACTED, text)
