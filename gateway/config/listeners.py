"""The `listeners:` section: where the gateway serves which protocol, with
which TLS and credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.address import Address, addresses_overlap, parse_address
from gateway.config.auth import CredentialConfig, parse_credential_config
from gateway.config.catalog import ProtocolCatalog, protocol_options
from gateway.config.node import Node
from gateway.config.tls import CLIENT_AUTH_MODES, ListenerTls, parse_listener_tls


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    protocol: str
    address: Address
    options: Any = None  # the frontend's own parsed options
    tls: ListenerTls | None = None  # HTTPS / gRPC TLS (docs/security.md)
    auth: CredentialConfig | None = None  # tokens clients must present
    # HTTP listeners: serve hot requests on the httptools fast path (gateway/transport/http_server/fast.py)
    fast_path: bool = True
    # Tell clients the gateway's and the upstream's share of each request (Server-Timing; gRPC: trailing metadata)
    server_timing: bool = False


def _client_auth_modes(protocol: str | None, registry: ProtocolCatalog) -> tuple[str, ...]:
    """The TLS client_auth modes a frontend's server library offers."""
    try:
        return registry.load(protocol or "", "frontend").TLS_CLIENT_AUTH_MODES  # type: ignore[no-any-return]
    except KeyError:
        return CLIENT_AUTH_MODES


def _check_overlap(item: Node, name: str | None, address: Address, bound: list[tuple[str, Address]]) -> None:
    """Two listeners on one address: without SO_REUSEPORT the second bind
    fails at start; with it (``--workers N``) both bind and the kernel splits
    connections between them, silently. Either way, a config error."""
    for owner, other in bound:
        if addresses_overlap(address, other):
            item.error(f"listener {name!r} at {address} overlaps {owner} at {other}; "
                       "two sockets cannot serve one address", "address")


def parse_listeners(node: Node, admin: Address | None, base_dir: Path,
                    protocols: ProtocolCatalog) -> list[ListenerConfig]:
    """The `listeners:` list; ``admin``: the admin server's address, which no listener may share."""
    listeners: list[ListenerConfig] = []
    bound: list[tuple[str, Address]] = [("the admin server", admin)] if admin else []
    for index, item in enumerate(node.items()):
        name, protocol = item.string("name"), item.string("protocol")
        address = parse_address(item.child("address"))
        options = protocol_options(item, protocol, "frontend", protocols)
        tls = parse_listener_tls(item.child("tls", None), base_dir, _client_auth_modes(protocol, protocols))
        auth = parse_credential_config(item.child("auth", None), base_dir)
        fast_path = item.flag("fast_path", True)
        server_timing = item.flag("server_timing", False)
        item.check_no_unknown_keys()
        if name and protocol and address:
            listeners.append(ListenerConfig(name, protocol, address, options, tls, auth, fast_path, server_timing))
        if address:
            _check_overlap(item, name, address, bound)
            bound.append((f"listener {name!r} (listeners[{index}])", address))
    return listeners
