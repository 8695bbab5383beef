"""The aiohttp application of an HTTP listener: the server the fast path
hands unusual requests to (and every request when ``fast_path`` is off).
Its middleware chain gives the same answers as the fast path's lifecycle:
request context and ids, credentials, the guard's limits, errors in the
protocol's form, the access log; its connection handlers are counted by
the listener's guard and answer malformed HTTP in the protocol's form."""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core.errors import ErrorKind, GatewayError, malformed, too_large
from gateway.core.record import finish_request
from gateway.core.types import RequestContext
from gateway.runtime.budget import Reservation
from gateway.runtime.offload import Offloader
from gateway.runtime.services import GatewayServices
from gateway.transport.acceptor import Acceptor, bind
from gateway.transport.cycle import Form, RequestCycle
from gateway.transport.http_server.body import decompress, request_coding
from gateway.transport.http_server.exchange import (
    HttpReply,
    HttpStatusError,
    new_context,
    outcome_of_status,
    parser_reason,
)
from gateway.transport.http_server.fast import FastConnection, FastListener
from gateway.transport.http_server.guard import ListenerGuard

log = logging.getLogger(__name__)


# What a request holds of the memory budget (HttpFrontend.reservation).
RESERVATION = web.RequestKey("gateway_reservation", Reservation)
# Set on a request whose body was abandoned: its connection must close.
_ABANDONED = web.RequestKey("gateway_body_abandoned", bool)


async def read_body(request: web.Request, limit: int, timeout: float | None, offload: Offloader
                    ) -> bytes | bytearray:
    """The (decompressed) request body; TOO_LARGE past ``limit`` bytes,
    MALFORMED (HTTP 408) when it has not fully arrived within ``timeout`` s.

    With a Content-Length and no compression the body goes straight into one
    buffer of that size: a 64 MiB request occupies 64 MiB, not twice that
    while aiohttp joins its chunks, and it is not kept on the request."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    encoding = request_coding(request.headers.get("Content-Encoding", "identity"))
    try:
        async with asyncio.timeout(timeout):
            if declared is not None and encoding in ("identity", ""):
                return await _read_exactly(request, declared)
            body: bytes | bytearray = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(f"request body exceeds the limit of {limit} bytes") from None
    except TimeoutError:
        request[_ABANDONED] = True
        raise HttpStatusError(ErrorKind.MALFORMED_REQUEST, f"the request body did not arrive within {timeout:g}s "
                              "(limits.body_timeout)", 408) from None
    if encoding in ("gzip", "deflate"):
        # sized by what it may inflate to (a thousandfold), not by what it is
        body = await offload.run(len(body) << 10, decompress, body, encoding, limit)
    return body


async def _read_exactly(request: web.Request, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    async for chunk in request.content.iter_any():
        end = filled + len(chunk)
        if end > size:
            raise malformed(f"the request body is longer than its Content-Length of {size} bytes")
        view[filled:end] = chunk
        filled = end
    if filled != size:
        raise malformed(f"the request body ended after {filled} of {size} bytes")
    return buffer



def error_middleware(respond: Callable[[GatewayError, int | None], web.StreamResponse],
                     http_kinds: Mapping[int, ErrorKind]) -> Middleware:
    """Middleware that answers every failure as ``respond(error, status)``:
    a GatewayError with its kind's status (``status`` None), aiohttp's HTTP
    errors (unknown path, wrong method, ...) with their own status and the
    kind ``http_kinds`` gives, anything else as INTERNAL. Never a text page."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as error:
            note_error(request, error)
            response = respond(error, getattr(error, "http_status", None))
            retry_after = getattr(error, "retry_after", None)
            if retry_after is not None:
                response.headers["Retry-After"] = str(retry_after)
            return response
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = http_kinds.get(exc.status, ErrorKind.MALFORMED_REQUEST)
            message = {404: f"no such endpoint: {request.method} {request.path[:200]}",
                       405: f"method {request.method} is not allowed on {request.path[:200]}"}.get(
                exc.status, exc.reason)
            refusal = GatewayError(kind, message)
            note_error(request, refusal)  # the kind the protocol gave, not one guessed from the status
            response = respond(refusal, exc.status)
            if "Allow" in exc.headers:  # a 405 names the methods allowed (RFC 9110)
                response.headers["Allow"] = exc.headers["Allow"]
            return response
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            internal = GatewayError(ErrorKind.INTERNAL, "internal error")
            note_error(request, internal)
            return respond(internal, None)

    return middleware
# --- request context and observability ----------------------------------------

CONTEXT = web.RequestKey("gateway_context", RequestContext)

def request_context(request: web.Request, listener: str, protocol: str) -> RequestContext:
    """The request's context: made once per request by the observing
    middleware of :class:`HttpFrontend`, built here for other callers."""
    ctx = request.get(CONTEXT)
    if ctx is not None:
        return ctx
    headers = {k.lower(): v for k, v in request.headers.items()}
    if len(connection := request.headers.getall("connection", ())) > 1:  # every hop-by-hop name counts
        headers["connection"] = ", ".join(connection)
    return new_context(listener, protocol, headers)


def note_error(request: web.Request, error: GatewayError) -> None:
    """Tell the metrics and access log which error a response carries."""
    ctx = request.get(CONTEXT)
    if ctx is not None:
        ctx.record.fail(error.kind.value, error.message)


def _operation(request: web.Request) -> str:
    """The handler's name: a small fixed set per frontend, fit for a label."""
    match_info = request.match_info
    if match_info.http_exception is not None:
        return "unmatched"
    return getattr(match_info.handler, "__name__", "other")


def cycle_middleware(cycle: RequestCycle, form: Form[web.StreamResponse], guard: ListenerGuard,
                     draining: Callable[[], bool]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Outermost middleware: the aiohttp app's adapter to the listener's
    request cycle (gateway/transport/cycle.py), shared with the fast path:
    context and ids, admission, errors in the protocol's form, 499. The
    access-log hook below finishes the request once its answer is sent."""

    @web.middleware
    async def serve(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        ctx = request_context(request, cycle.listener, cycle.protocol)
        request[CONTEXT] = ctx
        cycle.begin(ctx, _operation(request), request.method, request.path, request.remote or "")
        # The client may also go away while the answer is written, after this
        # returns: aiohttp then cancels the request's task and logs nothing.
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(functools.partial(_finish_if_cancelled, cycle, ctx, request))
        try:
            if getattr(request.protocol, "over_limit", False):
                response = cycle.refuse(ctx, GatewayError(ErrorKind.OVERLOADED, guard.over_connections_message()),
                                        None, form)
                response.force_close()
            else:
                response = await cycle.run(ctx, request.path in cycle.probes,
                                           lambda: _admitted(guard, request, handler), form)
        except web.HTTPException as exc:
            cycle.stamp(exc.headers, ctx)
            raise
        except asyncio.CancelledError:
            cycle.cancelled(ctx, "499", request.content.total_bytes)
            raise
        finally:
            cycle.end()
            held = request.get(RESERVATION)  # what it held of the memory budget
            if held is not None:
                held.release()
        if draining():
            # Clients move their keep-alive connections elsewhere before the listener closes.
            response.force_close()
        cycle.stamp(response.headers, ctx)
        return response

    return serve


async def _admitted(guard: ListenerGuard, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """An admitted request: `Expect` answered (or refused) from its head,
    then the handler; a request whose body was abandoned closes its connection."""
    if _EXPECT in request:
        refusal = await _answer_expectation(guard, request)
        if refusal is not None:
            return refusal
    response = await handler(request)
    if request.get(_ABANDONED):
        response.force_close()
    return response


def _finish_if_cancelled(cycle: RequestCycle, ctx: RequestContext, request: web.Request,
                         task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        cycle.cancelled(ctx, "499", request.content.total_bytes)


class RecordingAccessLogger(AbstractAccessLogger):
    """aiohttp calls this once the response is sent (or the send failed):
    the moment sizes and the full duration are known."""

    services: GatewayServices  # set per frontend by access_logger_class
    status_kinds: Mapping[int, ErrorKind] = MappingProxyType({})  # the frontend's (HttpFrontend.status_kinds)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        ctx = request.get(CONTEXT)
        if ctx is None or ctx.record.finished:
            return  # never reached our app (malformed HTTP), or already recorded
        record = ctx.record
        if not record.status:
            record.status = str(response.status)
        if not record.outcome:
            record.outcome = outcome_of_status(response.status, self.status_kinds)
        record.request_bytes = request.content.total_bytes
        # The body as sent (compressed if it was); without a Content-Length
        # (chunked) aiohttp only knows the bytes written, headers included.
        length = response.content_length
        record.response_bytes = length if length is not None else response.body_length
        finish_request(self.services, ctx)


def access_logger_class(services: GatewayServices, status_kinds: Mapping[int, ErrorKind]) -> type[AbstractAccessLogger]:
    return type("GatewayAccessLogger", (RecordingAccessLogger,), {"services": services, "status_kinds": status_kinds})


# --- listener limits: connections, concurrent requests, malformed HTTP --------------

# Set on an HTTP/1.1 request that carried `Expect` (its value) until the
# guard answers `100 Continue`. The header is hidden from aiohttp, which
# would send the 100 before any middleware could refuse the request.
_EXPECT = web.RequestKey("gateway_expect", str)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def _answer_expectation(guard: ListenerGuard, request: web.Request) -> web.StreamResponse | None:
    """What the head alone decides comes before `100 Continue`: 417 for
    another expectation, 413 for a declared body over the limit, an
    unknown route (answered 404/405 by the chain). Then ask for the body."""
    if request[_EXPECT].strip().lower() != "100-continue":
        return _refuse_with(guard, request, HttpStatusError(
            ErrorKind.UNSUPPORTED, "the only expectation supported is 'Expect: 100-continue'", 417))
    if request.match_info.http_exception is not None:
        return None
    declared = request.content_length
    if declared is not None and declared > guard.max_body:
        return _refuse_with(guard, request, too_large(
            f"request body of {declared} bytes exceeds the limit of {guard.max_body} bytes"))
    await request.writer.write(_CONTINUE)
    request.writer.output_size = 0  # as aiohttp's own expect handler: the answer has not started
    del request[_EXPECT]
    return None


def _refuse_with(guard: ListenerGuard, request: web.Request, error: GatewayError) -> web.StreamResponse:
    note_error(request, error)
    response: web.StreamResponse = guard.render(error, getattr(error, "http_status", None))
    return response


class _GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler, counted by the listener's guard, with
    malformed HTTP (oversized or too many headers, a bad request line)
    answered in the protocol's own error form instead of a text page."""

    guard: ListenerGuard
    over_limit = False
    counted = False  # by the guard, until closed
    connecting: asyncio.Task[Any] | None = None  # the task connecting it (TLS handshake)
    answered = True  # no request in progress, and the last one's body read to its end

    @property
    def idle(self) -> bool:
        """No request in progress or queued: waiting for the next request
        head (or about to), or still in its TLS handshake."""
        if self.transport is None:
            return True
        # RequestHandler tells its state only through these (no public way).
        if self._messages:  # a pipelined request, parsed
            return False
        waiter = self._waiter
        return not waiter.done() if waiter is not None else self.answered

    def evict(self) -> None:
        if self.transport is not None:
            self.force_close()  # as aiohttp's keep-alive timeout closes an idle connection
        elif self.connecting is not None:
            self.connecting.cancel()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.closed(self)
        super().connection_lost(exc)

    async def _handle_request(self, request: web.BaseRequest, start_time: float | None,
                              request_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
                              ) -> tuple[web.StreamResponse, bool]:
        self.guard.request_started(self)
        self.answered = False
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            # With some of the body unread, aiohttp now reads and drops it
            # (lingering) so the client sees the answer: not idle until done.
            self.answered = request.content.is_eof()
            self.guard.request_finished(self)

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
                              ) -> tuple[web.StreamResponse, bool]:
        if _EXPECT in request:
            # Answered without `100 Continue` (refused from its head): the
            # client holds its body back, so neither wait for it (aiohttp
            # would, up to its lingering time) nor keep the connection.
            resp.force_close()
            self._lingering_time = 0.0  # per handler: aiohttp offers no public setter
        return await super().finish_response(request, resp, start_time)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # No manager (aiohttp's own check): the server is shutting down.
        if status == 500 or request.writer.output_size > 0 or self._manager is None:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)):
            error: GatewayError = HttpStatusError(
                ErrorKind.TOO_LARGE, "the request line or headers are over limits.max_header_line_bytes or "
                "limits.max_headers", 431)
        else:
            # Never the parser's full text: it quotes the offending line (a token, say).
            error = malformed(f"malformed HTTP request: {parse_failure(exc)}")
        log.debug("refused a malformed HTTP request from %s: %s (%s)", request.remote, error.message,
                  type(exc).__name__)
        response = self.guard.render(error, getattr(error, "http_status", status))
        response.force_close()
        return response


# What the parser's messages say without the data they quote: llhttp's
# reasons are fixed texts; aiohttp's pure-Python parser quotes the line.
_FAILURE_OF_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (BadHttpMethod, "bad method in the request line"),
    (BadStatusLine, "bad request line"),
    (InvalidURLError, "bad request target"),
    (InvalidHeader, "bad header"),
    (TransferEncodingError, "bad Transfer-Encoding"),
    (ContentLengthError, "bad Content-Length"),
    (ContentEncodingError, "bad Content-Encoding"),
)


def parse_failure(exc: BaseException | None) -> str:
    """A fixed description of why a request could not be parsed, quoting
    nothing the client sent."""
    reason = parser_reason(str(getattr(exc, "message", "") or ""))
    if reason is not None:
        return reason
    for cls, description in _FAILURE_OF_CLASS:
        if isinstance(exc, cls):
            return description
    return "the request could not be parsed"


def _hiding_expect(make: Callable[..., web.BaseRequest]) -> Callable[..., web.BaseRequest]:
    """A request factory that takes `Expect` out of the headers aiohttp sees
    and notes it on the request (HTTP/1.1; HTTP/1.0 ignores it, RFC 9110)."""

    def request(message: RawRequestMessage, *args: Any) -> web.BaseRequest:
        expect = message.headers.get(hdrs.EXPECT)
        if expect is None:
            return make(message, *args)
        headers = CIMultiDict(message.headers)
        headers.popall(hdrs.EXPECT)
        raw = tuple(pair for pair in message.raw_headers if pair[0].lower() != b"expect")
        made = make(message._replace(headers=CIMultiDictProxy(headers), raw_headers=raw), *args)
        if message.version == HttpVersion11:
            made[_EXPECT] = expect
        return made

    return request


class _GuardedServer(web.Server):
    """aiohttp's protocol factory, making :class:`_GuardedRequestHandler` s;
    the listener's :class:`~gateway.transport.acceptor.Gate`."""

    guard: ListenerGuard
    fast: FastListener | None = None  # connections start on the fast path when the listener has one

    def install(self, guard: ListenerGuard, fast: FastListener | None) -> None:
        self.guard = guard
        self.fast = fast
        self.request_factory = _hiding_expect(self.request_factory)

    def __call__(self) -> RequestHandler:
        return self._handler()

    def _handler(self) -> _GuardedRequestHandler:
        # As web.Server.__call__ makes its handlers; it takes no handler class.
        handler = _GuardedRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.guard = self.guard
        return handler

    def admit(self) -> asyncio.BaseProtocol | None:
        over_limit = self.guard.admit()
        if over_limit is None:
            return None
        handler: _GuardedRequestHandler | FastConnection = (
            self._handler() if self.fast is None else FastConnection(self.fast))
        self.guard.opened(handler, over_limit)
        return handler

    def connecting(self, protocol: asyncio.BaseProtocol, task: asyncio.Task[None]) -> None:
        assert isinstance(protocol, (_GuardedRequestHandler, FastConnection))
        protocol.connecting = task

    def failed(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, (_GuardedRequestHandler, FastConnection))
        self.guard.closed(protocol)

    def free_idle(self) -> bool:
        return self.guard.close_oldest_idle()


class _GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, accepting through an :class:`~gateway.transport.acceptor.Acceptor`."""

    __slots__ = ("_host", "_port", "_reuse_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, ssl_context: ssl.SSLContext | None,
                 reuse_port: bool) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._reuse_port = host, port, reuse_port

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert isinstance(server, _GuardedServer)
        sockets = await bind(self._host, self._port, self._reuse_port, self._backlog)
        acceptor = Acceptor(sockets, server, server.guard.refusals, self._ssl_context, self._backlog)
        acceptor.start()
        self._server = acceptor  # BaseSite's slot: stop() closes it, runner.addresses lists its sockets



# Binary answers from this size on are written part by part (tensors straight
# from their arrays) instead of joined into one more copy first.
STREAM_MIN_BYTES = 1 << 20


def _reply_headers(reply: HttpReply) -> dict[str, str]:
    if reply.content_type is None:
        return reply.headers
    return {"Content-Type": reply.content_type, **reply.headers}


async def aiohttp_reply(request: web.Request, reply: HttpReply) -> web.StreamResponse:
    headers = _reply_headers(reply)
    parts = reply.parts
    if len(parts) > 1:
        size = reply.size
        if size >= STREAM_MIN_BYTES:
            response = web.StreamResponse(status=reply.status, headers=headers)
            response.content_length = size
            await response.prepare(request)
            for part in parts:
                await response.write(part)
            await response.write_eof()
            return response
    body = parts[0] if len(parts) == 1 else b"".join(parts)
    return web.Response(status=reply.status, body=body, headers=headers)


