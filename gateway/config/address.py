"""``host:port`` addresses: parsed, printed, and compared as binds."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gateway.config.node import Node


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    # Set on an address found by DNS discovery: the name it was resolved
    # from, which clients present (Host, :authority, TLS server name).
    name: str | None = None

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]/\s]+)):(?P<port>\d{1,5})$")


def parse_address(node: Node) -> Address | None:
    text = node.value
    if not isinstance(text, str):
        node.error("must be an address 'host:port'")
        return None
    match = _ADDRESS.match(text.strip())
    port = int(match.group("port")) if match else -1
    if not match or port > 65535:
        node.error(f"must be an address 'host:port' with a port 0-65535; got {text!r}")
        return None
    return Address(match.group("v6") or match.group("host"), port)


def _bind_host(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | str:
    """An IP literal as its address (so spellings compare equal), a name lower-cased."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host.lower()


def addresses_overlap(a: Address, b: Address) -> bool:
    """Whether two sockets bound to ``a`` and ``b`` would take the same
    connections. A wildcard (``0.0.0.0``, ``::``) overlaps every address of
    its own family on that port; names are not resolved (only the same name
    overlaps); port 0 never overlaps, as each bind picks its own port."""
    if a.port != b.port or a.port == 0:
        return False
    ha, hb = _bind_host(a.host), _bind_host(b.host)
    if ha == hb:
        return True
    if isinstance(ha, str) or isinstance(hb, str) or ha.version != hb.version:
        return False
    return ha.is_unspecified or hb.is_unspecified
