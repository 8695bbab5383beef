"""Credentials: tokens that listeners and the admin listener accept, and the
header the gateway sends to an upstream that wants one.

Tokens never appear in the YAML: the config names where they are (a file or
an environment variable, a :class:`SecretRef`), and the token values are
read when a listener or upstream client is built, so ``/config`` and the
frozen :class:`~gateway.config.model.GatewayConfig` never hold them. Presented
credentials are compared in constant time against every accepted token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from gateway.config.auth import CredentialConfig, read_secrets
from gateway.core.errors import ErrorKind, GatewayError


def unauthenticated(message: str) -> GatewayError:
    return GatewayError(ErrorKind.UNAUTHENTICATED, message)


def _digest(token: str) -> bytes:
    # Equal-length digests: compare_digest then leaks nothing about lengths.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Authenticator:
    """Checks a request's credential against the accepted tokens."""

    def __init__(self, config: CredentialConfig) -> None:
        self.config = config
        self._digests = [_digest(t) for t in read_secrets(config.token)]

    def reload(self, config: CredentialConfig) -> None:
        """Re-read the tokens (rotation); the old ones stay if this fails."""
        digests = [_digest(t) for t in read_secrets(config.token)]
        self.config, self._digests = config, digests

    @property
    def challenge(self) -> str:
        """The WWW-Authenticate value of a 401, when a scheme is used."""
        return f'{self.config.scheme} realm="inference-gateway"' if self.config.scheme else ""

    def expected(self) -> str:
        scheme = self.config.scheme
        return f"'{self.config.header}: {scheme + ' ' if scheme else ''}<token>'"

    def check(self, headers: Mapping[str, str]) -> None:
        """Raise UNAUTHENTICATED unless ``headers`` carry an accepted token.
        ``headers``: case-insensitive, or with lower-case names."""
        value = headers.get(self.config.header)
        if value is None:
            raise unauthenticated(f"credentials are required: send {self.expected()}")
        presented = value.strip()
        scheme = self.config.scheme
        if scheme:
            given, _, presented = presented.partition(" ")
            if given.lower() != scheme.lower():
                raise unauthenticated(f"credentials use the wrong scheme: send {self.expected()}")
        digest = _digest(presented.strip())
        accepted = False
        for known in self._digests:  # no early exit: the time does not depend on which token matched
            accepted |= hmac.compare_digest(known, digest)
        if not accepted:
            raise unauthenticated("the credentials are not valid")


def credential_headers(config: CredentialConfig | None) -> dict[str, str]:
    """The header an upstream client sends (first token of the reference)."""
    if config is None:
        return {}
    token = read_secrets(config.token)[0]
    return {config.header: f"{config.scheme} {token}" if config.scheme else token}
