"""Certificates and tokens for the security tests, made fresh per test run
with ``trustme`` (a throwaway CA; nothing leaves the temporary folder)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

# Upstreams and routes of a gateway serving the builtin models, GraphStorm
# invocations on a listener named `gs` with the MovieLens graph schema.
BUILTIN_BACKEND = """
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: gnn, listener: gs}
    upstream: local
    options: {graphstorm: {graph_schema: "builtin:movielens"}}
  - {match: {model: "*"}, upstream: local}
"""

# Names in the server certificates: the loopback address clients dial, and
# a DNS name that only `server_name` overrides can ask for.
SERVER_NAMES = ("127.0.0.1", "upstream.test")


@dataclass(frozen=True)
class Pki:
    """Files of one CA: a server certificate and a client certificate."""

    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def fingerprint(self) -> str:
        """SHA-256 of the server certificate (DER), as a peer sees it."""
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.server_cert.read_text())).hexdigest()


def make_pki(folder: Path, prefix: str = "") -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*SERVER_NAMES)
    client = ca.issue_cert("client.test")
    paths = Pki(folder, folder / f"{prefix}ca.pem", folder / f"{prefix}server.pem", folder / f"{prefix}server.key",
                folder / f"{prefix}client.pem", folder / f"{prefix}client.key")
    ca.cert_pem.write_to_path(str(paths.ca))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    server.private_key_pem.write_to_path(str(paths.server_key))
    client.cert_chain_pems[0].write_to_path(str(paths.client_cert))
    client.private_key_pem.write_to_path(str(paths.client_key))
    return paths


def write_token(path: Path, *tokens: str) -> Path:
    path.write_text("# accepted tokens, one per line\n" + "".join(f"{t}\n" for t in tokens))
    return path


async def served_fingerprint(port: int, ca: Path, client: Pki | None = None, alpn: str | None = None) -> str:
    """Open a TLS connection to 127.0.0.1:port and return the SHA-256 of the
    certificate the server presents (``alpn`` "h2" for gRPC listeners)."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.client_cert, client.client_key)
    if alpn:
        context.set_alpn_protocols([alpn])
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"), 10)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.transport.abort()  # no TLS close exchange to wait for: only the certificate mattered
    return hashlib.sha256(der).hexdigest()
