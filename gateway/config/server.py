"""The gateway's own sections: `server:` (identity, extensions), `admin:`,
`drain:`, `readiness:` and `reload:`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.config.address import Address, parse_address
from gateway.config.auth import SecretRef, parse_secret_ref
from gateway.config.extensions import DEFAULT_EXTENSIONS, GATEWAY_EXTENSIONS
from gateway.config.node import Node, positive_duration, section

DEFAULT_MAX_SHARED_MEMORY_REGIONS = 256  # per listener and credential: one small file each


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    name: str = "inference-gateway"
    version: str = ""  # empty: the package version
    # Triton extensions the gateway serves itself (listed in server metadata).
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    # System shared-memory regions one listener and credential may register (all workers together).
    max_shared_memory_regions: int = DEFAULT_MAX_SHARED_MEMORY_REGIONS


@dataclass(frozen=True, slots=True)
class AdminConfig:
    address: Address | None = Address("127.0.0.1", 8002)
    allow_remote_reload: bool = False  # POST /reload from non-loopback clients
    # Bearer token for every non-GET admin endpoint; without one such
    # endpoints answer only on a loopback address (docs/security.md).
    token: SecretRef | None = None


@dataclass(frozen=True, slots=True)
class DrainConfig:
    """SIGTERM: readiness false at once, keep serving ``delay`` seconds (load
    balancers lag), then close listeners and give in-flight work ``timeout``."""

    delay: float = 0.0
    timeout: float = 20.0


READINESS_MODES = ("any", "all", "ignore")


@dataclass(frozen=True, slots=True)
class ReadinessConfig:
    # any: some routed upstream has an available endpoint; all: every one has;
    # ignore: readiness does not depend on upstreams.
    upstreams: str = "any"


@dataclass(frozen=True, slots=True)
class ReloadConfig:
    watch_interval: float | None = None  # poll the config file for changes


def parse_server(node: Node) -> ServerIdentity:
    server = ServerIdentity(node.string("name", "inference-gateway"), node.string("version", ""),
                            _extensions(node.child("extensions", list(DEFAULT_EXTENSIONS))),
                            node.integer("max_shared_memory_regions", DEFAULT_MAX_SHARED_MEMORY_REGIONS, minimum=1))
    node.check_no_unknown_keys()
    return server


def parse_admin(node: Node, base_dir: Path) -> AdminConfig:
    address = node.child("address", "127.0.0.1:8002")
    token = parse_secret_ref(node.child("token"), base_dir) if node.has("token") else None
    admin = AdminConfig(parse_address(address) if address.value is not None else None,
                        node.flag("allow_remote_reload", False), token)
    node.check_no_unknown_keys()
    return admin


def parse_drain(node: Node) -> DrainConfig:
    d = DrainConfig()
    if not section(node):
        return d
    drain = DrainConfig(node.duration("delay", d.delay), node.duration("timeout", d.timeout))
    node.check_no_unknown_keys()
    return drain


def parse_readiness(node: Node) -> ReadinessConfig:
    if not section(node):
        return ReadinessConfig()
    readiness = ReadinessConfig(node.choice("upstreams", READINESS_MODES, "any"))
    node.check_no_unknown_keys()
    return readiness


def parse_reload(node: Node) -> ReloadConfig:
    if not section(node):
        return ReloadConfig()
    reload = ReloadConfig(positive_duration(node, "watch_interval", None))
    node.check_no_unknown_keys()
    return reload


def _extensions(node: Node) -> tuple[str, ...]:
    names: list[str] = []
    for item in node.items():
        if item.value not in GATEWAY_EXTENSIONS:
            item.error(f"unknown extension {item.value!r}; known: {', '.join(GATEWAY_EXTENSIONS)}")
        elif item.value not in names:
            names.append(item.value)
    return tuple(names)
