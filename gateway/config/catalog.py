"""What the config asks of the protocols: names and option parsers (handed in by the app)."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.config.node import Node


class ProtocolCatalog(Protocol):
    """What the config asks of the protocols: their names on a side
    ("frontend" or "backend") and each one's class there, for its option
    parsers (``parse_options``, ``parse_route_options``), its listener TLS
    modes (``TLS_CLIENT_AUTH_MODES``) and whether it needs endpoints
    (``needs_endpoints``). The app hands in gateway.protocols.registry, so
    the config imports no protocol."""

    def names(self, side: str) -> list[str]: ...

    def load(self, protocol: str, side: str) -> Any: ...


def protocol_options(node: Node, protocol: str | None, side: str, registry: ProtocolCatalog) -> Any:
    if protocol is None:
        return None
    try:
        component = registry.load(protocol, side)
    except KeyError:
        known = ", ".join(registry.names(side))
        node.error(f"unknown {side} protocol {protocol!r}; known: {known}", "protocol")
        return None
    return component.parse_options(node)
