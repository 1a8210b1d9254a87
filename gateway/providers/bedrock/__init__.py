"""The ``bedrock`` kind: Bedrock Runtime Converse and ConverseStream, signed with SigV4.

:mod:`.converse` translates bodies and answers, :mod:`.converse_stream` reads the event
stream, :mod:`.aws_auth` holds credentials and signing, :mod:`.runtime_client` calls.
"""

from gateway.providers.bedrock.runtime_client import BedrockProvider

__all__ = ["BedrockProvider"]
