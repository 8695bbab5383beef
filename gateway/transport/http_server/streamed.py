"""A streamed answer of server-sent events on the aiohttp app, what every
HTTP listener that streams shares (Triton's generate_stream, OpenAI's
`stream: true`): sent with its first event, so an error before it is an
ordinary error answer with its status; after it, an error goes as one
more event; each write waits while the transport is full, so a slow reader
slows the upstream; counted for the stream metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import OUTCOME_CANCELLED, REQUEST_ID_HEADER
from gateway.core.types import RequestContext
from gateway.runtime.services import GatewayServices
from gateway.transport.http_server.aiohttp_app import note_error
from gateway.transport.http_server.sse import SSE_CONTENT_TYPE

log = logging.getLogger(__name__)


class StreamedAnswer:
    def __init__(self, raw: web.Request, ctx: RequestContext) -> None:
        self.raw, self.ctx = raw, ctx
        self.answer = web.StreamResponse(status=200, headers={
            "Content-Type": SSE_CONTENT_TYPE, "Cache-Control": "no-cache", REQUEST_ID_HEADER: ctx.request_id})
        self.events = 0  # written so far
        self.first_seconds: float | None = None  # until the first event
        self._started = time.monotonic()
        self._gone = False

    async def send(self, event: bytes) -> None:
        if not self.answer.prepared:
            await self.answer.prepare(self.raw)
        self.events += 1
        if self.first_seconds is None:
            self.first_seconds = time.monotonic() - self._started
        await self.answer.write(event)

    async def failed(self, exc: Exception, error_event: Callable[[GatewayError], bytes]) -> None:
        """``exc`` ended the stream: raised again before the first event (the
        protocol's error answer), else written as ``error_event`` — or, when
        the client has gone, recorded as nginx's 499."""
        if not self.answer.prepared:
            raise exc
        if self.raw.transport is None or self.raw.transport.is_closing():
            self.ctx.record.status, self.ctx.record.outcome = "499", OUTCOME_CANCELLED
            self._gone = True
            return
        error = exc if isinstance(exc, GatewayError) else GatewayError(ErrorKind.INTERNAL, "internal error")
        if error is not exc:
            log.error("unhandled error in a stream of %s", self.raw.path, exc_info=exc)
        note_error(self.raw, error)
        await self.answer.write(error_event(error))

    def observe(self, services: GatewayServices) -> None:
        services.metrics.observe_stream_request(self.ctx.listener, self.ctx.protocol, self.events,
                                                self.first_seconds)

    async def end(self, tail: bytes = b"") -> web.StreamResponse:
        """The stream's last bytes (``tail``), then its end; an answer with
        no event at all is an empty stream."""
        if self._gone:
            return self.answer
        if not self.answer.prepared:
            await self.answer.prepare(self.raw)
        if tail:
            await self.answer.write(tail)
        await self.answer.write_eof()
        return self.answer
