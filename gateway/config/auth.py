"""The ``auth:`` blocks of the config: where a secret lives (a file or an
environment variable) and which header carries a credential with which
scheme; reading the tokens a reference holds. The runtime's checker and
credential headers (gateway/runtime/auth.py) use these."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.config.node import Node

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
