"""The effective configuration as JSON, with secrets redacted (``/config``;
the route table, ``/routes`` and ``gateway routes``, follows the same rule).

Redaction is by key name: the value of any key whose name contains one of
:data:`SECRET_WORDS` (``token``, ``password``, ``secret``, ``key``, ...) is
replaced, whatever it holds, including TLS key paths and route header
matchers such as ``authorization``. Objects the gateway does not know are
shown by type name only, so an unknown options object cannot leak its fields.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any

from gateway.config.address import Address
from gateway.config.model import GatewayConfig
from gateway.config.routes import StringMatch

REDACTED = "<redacted>"
SECRET_WORDS = ("token", "password", "passwd", "secret", "key", "credential", "auth", "cookie", "private")
_SECRET = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)


def is_secret_key(name: str) -> bool:
    return _SECRET.search(name) is not None


def redacted(name: str, value: Any) -> Any:
    """``value``, or :data:`REDACTED` when ``name`` names a secret and a value
    is set: the one rule of ``/config``, ``/routes`` and ``gateway routes``."""
    return REDACTED if is_secret_key(name) and value not in (None, "") else value


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Address):
        return str(value)
    if isinstance(value, StringMatch):
        return value.describe()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _mapping({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        return _mapping(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        if value and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in value):
            return _mapping(dict(value))  # (name, value) pairs such as route header matchers
        return [_plain(x) for x in value]
    return f"<{type(value).__name__}>"


def _mapping(items: Mapping[Any, Any]) -> dict[str, Any]:
    return {str(k): _plain(redacted(str(k), v)) for k, v in items.items()}


def effective_config(config: GatewayConfig) -> dict[str, Any]:
    """The running configuration, defaults filled in, secrets redacted."""
    return _plain(config)  # type: ignore[no-any-return]
