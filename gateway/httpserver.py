"""What every aiohttp-based frontend shares: binding a listener, reading a
body under the size limit, request decompression, request context."""

from __future__ import annotations

import logging
import socket
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.errors import ErrorKind, GatewayError, too_large, unsupported
from gateway.protocols.base import Frontend
from gateway.types import RequestContext

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_DECOMPRESS_CHUNK = 1 << 20


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip/deflate body, refusing to inflate past ``limit`` bytes."""
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()  # zlib-wrapped, as HTTP's "deflate" is
    else:
        raise unsupported(f"unsupported Content-Encoding '{encoding[:40]}'; use gzip or deflate")
    out = bytearray()
    data = body
    try:
        while data:
            out += inflater.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise too_large(f"request body inflates to more than the limit of {limit} bytes")
            data = inflater.unconsumed_tail
        out += inflater.flush()
    except zlib.error as exc:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise too_large(f"request body inflates to more than the limit of {limit} bytes")
    if not inflater.eof:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is a truncated {encoding} stream")
    return bytes(out)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The (decompressed) request body; TOO_LARGE past ``limit`` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise unsupported(f"unsupported Content-Encoding '{encoding[:40]}'; use gzip or deflate")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(f"request body exceeds the limit of {limit} bytes") from None
    if encoding in ("gzip", "deflate"):
        body = decompress(body, encoding, limit)
    return body


def request_context(request: web.Request, listener: str, protocol: str) -> RequestContext:
    headers = {k.lower(): v for k, v in request.headers.items()}
    request_id = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
    return RequestContext(listener=listener, protocol=protocol, request_id=request_id, headers=headers)


class HttpFrontend(Frontend):
    """A frontend served by one aiohttp application on the listener address."""

    _runner: web.AppRunner | None = None
    _port = 0

    def build_app(self) -> web.Application:
        raise NotImplementedError  # each HTTP frontend defines its routes

    @property
    def bound_port(self) -> int:
        return self._port

    @property
    def max_body(self) -> int:
        return self.services.config.limits.max_request_bytes

    def new_app(self, middlewares: list[Callable[..., Awaitable[Any]]]) -> web.Application:
        # aiohttp's own 1 MiB default is far too small for tensors; the body
        # limit is applied deliberately, one byte over so our check answers.
        return web.Application(client_max_size=self.max_body + 1,
                               middlewares=[self._close_when_draining, *middlewares])

    @web.middleware
    async def _close_when_draining(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """While draining, answer with ``Connection: close`` so clients move
        their keep-alive connections elsewhere before the listener closes."""
        response: web.StreamResponse = await handler(request)
        if self.dataplane.draining:
            response.force_close()
        return response

    async def start(self) -> None:
        # auto_decompress off: read_body inflates under the size limit itself.
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False,
                                     auto_decompress=False)
        await self._runner.setup()
        address = self.listener.address
        site = web.TCPSite(self._runner, address.host, address.port, reuse_address=True)
        await site.start()
        server = site._server  # aiohttp exposes bound sockets only here
        sockets = getattr(server, "sockets", None) or []
        for sock in sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self._port = sock.getsockname()[1]
                break
        log.info("listener %s (%s) on %s:%d", self.listener.name, self.listener.protocol, address.host, self._port)

    async def stop(self, grace: float) -> None:
        if self._runner is not None:
            # aiohttp waits this long for in-flight handlers after closing the
            # socket; it only takes it from the runner (set when built).
            self._runner._shutdown_timeout = grace
            await self._runner.shutdown()
            await self._runner.cleanup()
            self._runner = None
