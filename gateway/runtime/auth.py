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
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError

AUTHORIZATION = "authorization"
BEARER = "Bearer"
_SEPARATORS = re.compile(r"[\s,]+")


class SecretError(OSError):
    """A token file or variable that cannot be read (or holds nothing)."""


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Where a secret lives: a file, or an environment variable."""

    file: Path | None = None
    env: str | None = None

    def describe(self) -> str:
        return f"file {self.file}" if self.file is not None else f"environment variable {self.env}"


def read_secrets(ref: SecretRef) -> list[str]:
    """The tokens a reference holds: a file has one per line (blank lines
    and ``#`` comments skipped), a variable one or more separated by commas
    or whitespace."""
    if ref.file is not None:
        try:
            text = ref.file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"cannot read token file {ref.file}: {getattr(exc, 'strerror', None) or exc}") from None
        tokens = [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]
    else:
        value = os.environ.get(ref.env or "")
        if value is None:
            raise SecretError(f"environment variable {ref.env} is not set")
        tokens = [s for s in _SEPARATORS.split(value) if s]
    if not tokens:
        raise SecretError(f"{ref.describe()} holds no token")
    return tokens


def parse_secret_ref(node: Node, base_dir: Path) -> SecretRef | None:
    """``{file: PATH}`` (relative to the config file) or ``{env: VAR}``; a
    plain string is refused, so tokens are never written in the config."""
    if not (node.is_mapping and len(node.value) == 1 and set(node.value) <= {"file", "env"}):
        node.error("must be {file: PATH} or {env: VARIABLE}; tokens are never written in the config itself")
        return None
    file, env = node.string("file", None), node.string("env", None)
    if file is not None:
        ref = SecretRef(file=Path(file) if Path(file).is_absolute() else base_dir / file)
    elif env is not None:
        ref = SecretRef(env=env)
    else:
        return None
    try:
        read_secrets(ref)  # `gateway check` reports a missing file or variable now
    except SecretError as exc:
        node.error(str(exc))
    return ref


@dataclass(frozen=True, slots=True)
class CredentialConfig:
    """``auth:`` of a listener (tokens it accepts) or of an upstream (the
    token the gateway sends): which header carries it, with which scheme."""

    token: SecretRef
    header: str = AUTHORIZATION
    scheme: str = BEARER  # "" for a bare value such as an API key header


def parse_credential_config(node: Node, base_dir: Path) -> CredentialConfig | None:
    if node.value is None:
        return None
    if not node.is_mapping:
        node.error("must be a mapping with token, header and scheme")
        return None
    token = parse_secret_ref(node.child("token"), base_dir)
    header = node.string("header", AUTHORIZATION).strip().lower()
    if not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", header):
        node.error(f"is not a valid header name: {header!r}", "header")
    scheme = node.string("scheme", BEARER if header == AUTHORIZATION else "")
    if scheme and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", scheme):
        node.error(f"is not a valid authentication scheme: {scheme!r}", "scheme")
    node.check_no_unknown_keys()
    return CredentialConfig(token, header, scheme) if token is not None else None


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
