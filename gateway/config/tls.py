"""The ``tls:`` blocks of the config: file paths only, resolved against the
config file's folder and checked readable at load time. The runtime
(gateway/runtime/tls.py) builds contexts and credentials from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.config.node import Node

CLIENT_AUTH_MODES = ("none", "optional", "require")


@dataclass(frozen=True, slots=True)
class ListenerTls:
    """A listener's certificate, and whether it asks clients for theirs."""

    cert: Path
    key: Path
    ca: Path | None = None  # CA bundle that client certificates must chain to
    client_auth: str = "none"  # none | optional (verified if sent) | require


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """How the gateway verifies an upstream and, for mTLS, presents itself."""

    ca: Path | None = None  # None: the system's trusted CAs
    cert: Path | None = None  # client certificate for mTLS (with key)
    key: Path | None = None
    server_name: str | None = None  # name checked in the upstream's certificate (and SNI)


# --- parsing ---------------------------------------------------------------------


def _path(node: Node, key: str, base_dir: Path) -> Path | None:
    text = node.string(key, None)
    if text is None:
        return None
    path = Path(text) if Path(text).is_absolute() else base_dir / text
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        node.error(f"cannot read {path}: {exc.strerror}", key)
    return path


def parse_listener_tls(node: Node, base_dir: Path, client_auth_modes: tuple[str, ...] = CLIENT_AUTH_MODES
                       ) -> ListenerTls | None:
    """A listener's ``tls`` block; ``client_auth_modes``: what its server
    library can do (grpcio cannot ask for an optional client certificate)."""
    if node.value is None:
        return None
    if not node.is_mapping:
        node.error("must be a mapping with cert, key, ca and client_auth")
        return None
    cert, key, ca = (_path(node, k, base_dir) for k in ("cert", "key", "ca"))
    client_auth = node.choice("client_auth", CLIENT_AUTH_MODES, "none")
    if client_auth not in client_auth_modes:
        node.error(f"{client_auth} is not available on this listener; use {' or '.join(client_auth_modes)}",
                   "client_auth")
        client_auth = "require"  # never weaker than asked
    if client_auth != "none" and ca is None:
        node.error(f"client_auth: {client_auth} needs ca (the bundle client certificates must chain to)", "ca")
    for name, value in (("cert", cert), ("key", key)):
        if value is None:
            node.error("is required on a listener", name)
    node.check_no_unknown_keys()
    if cert is None or key is None:
        return None
    return ListenerTls(cert, key, ca, client_auth)


def parse_upstream_tls(node: Node, base_dir: Path) -> UpstreamTls | None:
    """An upstream's ``tls`` block; ``tls: {}`` is TLS with the system CAs."""
    if node.value is None:
        return None
    if not node.is_mapping:
        node.error("must be a mapping with ca, cert, key and server_name")
        return None
    ca, cert, key = (_path(node, k, base_dir) for k in ("ca", "cert", "key"))
    if (cert is None) != (key is None):
        node.error("cert and key go together (the client certificate for mTLS)", "cert" if cert is None else "key")
    server_name = node.string("server_name", None)
    node.check_no_unknown_keys()
    return UpstreamTls(ca, cert, key, server_name)
