"""HttpUpstreamClient: what every upstream client over the gateway's
HTTP/1.1 client shares (transport/http_client/): one keep-alive pool per
endpoint, made when the cluster starts the client — certificates are read
then (docs/security.md) — and closed with it. No total timeout: the data
plane bounds every call by the route's deadline."""

from __future__ import annotations

from gateway.core.errors import ErrorKind, GatewayError
from gateway.protocols.base import UpstreamClient
from gateway.runtime.tls import http_client_tls
from gateway.transport.http_client.pool import UpstreamHttp


class HttpUpstreamClient(UpstreamClient):
    http: UpstreamHttp | None = None
    # The pool's bounds, set by each client from its options: a reply over
    # max_response is refused naming limit_name.
    max_response: int
    limit_name = "max_response_bytes"
    max_connections: int | None = None
    keepalive = True

    async def start(self) -> None:
        assert self.endpoint is not None
        self.http = UpstreamHttp(self.endpoint, http_client_tls(self.upstream.tls), self.label,
                                 max_response=self.max_response, limit_name=self.limit_name,
                                 max_connections=self.max_connections, keepalive=self.keepalive)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    def started(self) -> UpstreamHttp:
        """The pool; INTERNAL when the client was never started."""
        if self.http is None:
            raise GatewayError(ErrorKind.INTERNAL, f"upstream {self.label} is not started")
        return self.http
