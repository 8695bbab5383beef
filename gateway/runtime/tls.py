"""TLS for listeners and upstreams: the contexts and credentials built from
a ``tls:`` config block (gateway/config/tls.py).

Config holds file paths only (resolved against the config file's folder and
checked readable at load time); certificates are read when a listener or an
upstream client starts. The builders below are the one place that turns a
``tls:`` block into an ``ssl.SSLContext`` or gRPC credentials, so a
configuration reload rebuilds TLS by calling them again, and a running
listener re-reads its files through :class:`ServerTls` (see docs/security.md).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config.tls import ListenerTls, UpstreamTls

if TYPE_CHECKING:
    import grpc  # imported where used: only gRPC listeners and upstreams need it

# --- listeners -------------------------------------------------------------------


def server_ssl_context(tls: ListenerTls) -> ssl.SSLContext:
    """A fresh server context for an HTTP listener (TLS 1.2 or newer)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_server_files(context, tls)
    return context


def _load_server_files(context: ssl.SSLContext, tls: ListenerTls) -> None:
    context.load_cert_chain(tls.cert, tls.key)
    if tls.ca is not None:
        context.load_verify_locations(cafile=tls.ca)
    context.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                           "require": ssl.CERT_REQUIRED}[tls.client_auth]


def _grpc_server_configuration(tls: ListenerTls) -> grpc.ServerCertificateConfiguration:
    import grpc

    return grpc.ssl_server_certificate_configuration(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=tls.ca.read_bytes() if tls.ca is not None else None)


class ServerTls:
    """A listener's TLS material, re-readable while it serves.

    HTTP listeners use :attr:`ssl_context`; :meth:`reload` loads new files
    into that same context, so connections accepted afterwards get them.
    gRPC listeners use :meth:`grpc_credentials`, whose fetcher hands grpc the
    re-read files at its next handshake. ``client_auth`` is fixed at start:
    changing it (or removing a CA from an HTTP listener) needs a restart.
    """

    def __init__(self, tls: ListenerTls) -> None:
        self.tls = tls
        self._context: ssl.SSLContext | None = None
        # A new configuration for grpc's next handshake.
        self._grpc_pending: grpc.ServerCertificateConfiguration | None = None

    @property
    def ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = server_ssl_context(self.tls)
        return self._context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        import grpc

        def fetch() -> grpc.ServerCertificateConfiguration | None:  # before handshakes; None: keep the files
            pending, self._grpc_pending = self._grpc_pending, None
            return pending

        return grpc.dynamic_ssl_server_credentials(
            _grpc_server_configuration(self.tls), fetch,
            require_client_authentication=self.tls.client_auth == "require")

    def reload(self, tls: ListenerTls | None = None) -> None:
        """Re-read the files (of ``tls`` when given, else the current ones).
        Raises OSError or ssl.SSLError and keeps the old material if they
        cannot be read."""
        tls = tls or self.tls
        server_ssl_context(tls)  # check the new files before touching the live material
        if self._context is not None:
            _load_server_files(self._context, tls)
        else:
            self._grpc_pending = _grpc_server_configuration(tls)
        self.tls = tls


# --- upstreams -------------------------------------------------------------------


def client_ssl_context(tls: UpstreamTls) -> ssl.SSLContext:
    """A fresh context for an HTTP upstream client: verifies the server
    against ``ca`` (or the system CAs) and presents ``cert`` when set."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert is not None and tls.key is not None:
        context.load_cert_chain(tls.cert, tls.key)
    return context


def grpc_channel_credentials(tls: UpstreamTls) -> grpc.ChannelCredentials:
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca is not None else None,
        private_key=tls.key.read_bytes() if tls.key is not None else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert is not None else None)


def grpc_channel_options(tls: UpstreamTls) -> list[tuple[str, Any]]:
    """Channel options for ``server_name``: the name checked in the
    upstream's certificate and sent as SNI and :authority."""
    if tls.server_name is None:
        return []
    return [("grpc.ssl_target_name_override", tls.server_name), ("grpc.default_authority", tls.server_name)]


@dataclass(frozen=True, slots=True)
class HttpClientTls:
    """What an aiohttp upstream client needs: the URL scheme, the connector's
    ``ssl`` argument and the per-request ``server_hostname``."""

    scheme: str = "http"
    ssl: ssl.SSLContext | bool = True  # aiohttp's default; unused for http
    server_hostname: str | None = None

    def url(self, endpoint: object, path: str = "") -> str:
        return f"{self.scheme}://{endpoint}{path}"


def http_client_tls(tls: UpstreamTls | None) -> HttpClientTls:
    if tls is None:
        return HttpClientTls()
    return HttpClientTls("https", client_ssl_context(tls), tls.server_name)
