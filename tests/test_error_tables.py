"""Every ErrorKind has an entry in every protocol's error table, so no
failure can leave a frontend without its protocol's own error form."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.errors import ErrorKind

# protocol -> "module:TABLE" mapping ErrorKind to that protocol's error form.
ERROR_TABLES = {
    "v2-rest": "gateway.protocols.v2_rest.codec:STATUS_OF_KIND",
    "v2-grpc": "gateway.protocols.v2_grpc.codec:CODE_OF_KIND",
    "umbridge": "gateway.protocols.umbridge.codec:ERROR_TYPES",
    "graphstorm": "gateway.protocols.graphstorm.status:STATUS_OF_KIND",
}


def _table(protocol: str) -> Mapping[ErrorKind, Any]:
    module, _, name = ERROR_TABLES[protocol].partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.name)
@pytest.mark.parametrize("protocol", sorted(ERROR_TABLES))
def test_every_kind_is_mapped(protocol: str, kind: ErrorKind) -> None:
    assert kind in _table(protocol), f"{protocol} has no error form for {kind.name}"


def test_every_frontend_has_a_table() -> None:
    from gateway.protocols import registry

    assert set(registry.names("frontend")) <= set(ERROR_TABLES)
