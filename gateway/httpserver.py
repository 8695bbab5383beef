"""What every aiohttp-based frontend shares: binding a listener, reading a
body under the size limit, request decompression, request context."""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import re
import socket
import ssl
import zlib
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
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.acceptor import Acceptor, RefusalLog, bind
from gateway.auth import Authenticator
from gateway.budget import Reservation
from gateway.config import ListenerConfig
from gateway.errors import ErrorKind, GatewayError, malformed, too_large, unsupported
from gateway.http.exchange import Handler, HttpReply, HttpRequest, HttpStatusError, compress, outcome_of_status
from gateway.http.fast import FastConnection, FastListener, FastRoute, FastRoutes
from gateway.observe import (
    OUTCOME_CANCELLED,
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    accept_request_id,
    accept_traceparent,
    accept_tracestate,
    finish_request,
)
from gateway.offload import Offloader
from gateway.protocols.base import Frontend
from gateway.tls import ServerTls
from gateway.types import RequestContext

log = logging.getLogger(__name__)
_DECOMPRESS_CHUNK = 1 << 20
_LINGERING_TIME = 10.0  # aiohttp's default


def decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytearray:
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
        # Inflated a chunk at a time: each call releases the GIL while zlib
        # works, and the output never lands in one more whole-body copy.
        while data or not inflater.eof:
            chunk = inflater.decompress(data, min(_DECOMPRESS_CHUNK, limit + 1 - len(out)))
            out += chunk
            if len(out) > limit:
                raise too_large(f"request body inflates to more than the limit of {limit} bytes")
            data = inflater.unconsumed_tail
            if not chunk and not data:
                break
        out += inflater.flush()
    except zlib.error as exc:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise too_large(f"request body inflates to more than the limit of {limit} bytes")
    if not inflater.eof:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is a truncated {encoding} stream")
    return out


def accepted_coding(accept_encoding: str, offered: tuple[str, ...] = ("gzip", "deflate")) -> str | None:
    """The content coding of ``offered`` the client prefers by its
    Accept-Encoding (RFC 9110 §12.5.3): q-values count, ``q=0`` refuses a
    coding, ``*`` stands for any coding not named; None for identity. Ties
    go to the earlier of ``offered``."""
    weights: dict[str, float] = {}
    for item in accept_encoding.lower().split(","):
        name, _, params = item.partition(";")
        name = name.strip()
        if not name:
            continue
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    weight = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    weight = 0.0  # a q-value that cannot be read accepts nothing
        weights[name] = weight
    best, best_weight = None, 0.0
    for coding in offered:
        weight = weights.get(coding, weights.get("*", 0.0))
        if weight > best_weight:
            best, best_weight = coding, weight
    return best


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
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise unsupported(f"unsupported Content-Encoding '{encoding[:40]}'; use gzip or deflate")
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
                     http_kinds: Mapping[int, ErrorKind]) -> Any:
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
# --- request context and observability (issue 7) ------------------------------

CONTEXT = web.RequestKey("gateway_context", RequestContext)

def request_context(request: web.Request, listener: str, protocol: str) -> RequestContext:
    """The request's context: made once per request by the observing
    middleware of :class:`HttpFrontend`, built here for other callers."""
    ctx = request.get(CONTEXT)
    if ctx is not None:
        return ctx
    headers = {k.lower(): v for k, v in request.headers.items()}
    traceparent = accept_traceparent(headers.get(TRACEPARENT_HEADER))
    return RequestContext(listener=listener, protocol=protocol,
                          request_id=accept_request_id(headers.get(REQUEST_ID_HEADER)), headers=headers,
                          traceparent=traceparent,
                          tracestate=accept_tracestate(headers.get(TRACESTATE_HEADER), traceparent))


def note_error(request: web.Request, error: GatewayError) -> None:
    """Tell the metrics and access log which error a response carries."""
    ctx = request.get(CONTEXT)
    if ctx is not None:
        ctx.record.fail(error.kind.value, error.message)


def _echo_ids(headers: Any, ctx: RequestContext) -> None:
    headers[REQUEST_ID_HEADER] = ctx.request_id
    if ctx.traceparent:
        headers[TRACEPARENT_HEADER] = ctx.traceparent
        if ctx.tracestate:
            headers[TRACESTATE_HEADER] = ctx.tracestate


def _operation(request: web.Request) -> str:
    """The handler's name: a small fixed set per frontend, fit for a label."""
    match_info = request.match_info
    if match_info.http_exception is not None:
        return "unmatched"
    return getattr(match_info.handler, "__name__", "other")


def observing_middleware(frontend: Frontend) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Outermost middleware: request context, in-flight gauge, ids echoed on
    every answer. The access-log hook below records the request once sent."""
    listener, protocol = frontend.listener.name, frontend.listener.protocol
    in_flight = frontend.services.metrics.requests_in_flight(listener, protocol)
    services = frontend.services
    tracing = services.tracing

    @web.middleware
    async def observe(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        ctx = request_context(request, listener, protocol)
        request[CONTEXT] = ctx
        record = ctx.record
        record.operation = _operation(request)
        record.method, record.path, record.peer = request.method, request.path, request.remote or ""
        if tracing is not None:
            tracing.start(ctx)
        in_flight.inc()
        # The client may also go away while the answer is written, after this
        # returns: aiohttp then cancels the request's task and logs nothing.
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(functools.partial(_finish_if_cancelled, services, ctx, request))
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            _echo_ids(exc.headers, ctx)
            raise
        except asyncio.CancelledError:
            _finish_cancelled(services, ctx, request)
            raise
        finally:
            in_flight.dec()
            held = request.get(RESERVATION)  # what it held of the memory budget
            if held is not None:
                held.release()
        _echo_ids(response.headers, ctx)
        return response

    return observe


def _finish_if_cancelled(services: Any, ctx: RequestContext, request: web.Request, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        _finish_cancelled(services, ctx, request)


def _finish_cancelled(services: Any, ctx: RequestContext, request: web.Request) -> None:
    """Record a request whose client went away before its answer was sent:
    nginx's 499, at the access log's level (never an error)."""
    record = ctx.record
    if record.finished:
        return
    record.status, record.outcome = "499", OUTCOME_CANCELLED
    record.request_bytes = request.content.total_bytes
    finish_request(services, ctx)


class RecordingAccessLogger(AbstractAccessLogger):
    """aiohttp calls this once the response is sent (or the send failed):
    the moment sizes and the full duration are known."""

    services: Any = None  # set per frontend by access_logger_class
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


def access_logger_class(services: Any, status_kinds: Mapping[int, ErrorKind]) -> type[AbstractAccessLogger]:
    return type("GatewayAccessLogger", (RecordingAccessLogger,), {"services": services, "status_kinds": status_kinds})


def auth_middleware(authenticator: Authenticator, public_paths: frozenset[str],
                    respond: Callable[[GatewayError, int | None], web.StreamResponse]
                    ) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse requests without an accepted token, in the protocol's own
    error form (``respond``), except on ``public_paths`` (health probes)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if request.path not in public_paths:
            try:
                authenticator.check(request.headers)
            except GatewayError as error:
                note_error(request, error)
                response = respond(error, 401)
                if authenticator.challenge:
                    response.headers["WWW-Authenticate"] = authenticator.challenge
                return response
        return await handler(request)

    return authenticate


# --- listener limits: connections, concurrent requests, malformed HTTP --------------

Render = Callable[[GatewayError, "int | None"], web.StreamResponse]

# Set on an HTTP/1.1 request that carried `Expect` (its value) until the
# guard answers `100 Continue`. The header is hidden from aiohttp, which
# would send the 100 before any middleware could refuse the request.
_EXPECT = web.RequestKey("gateway_expect", str)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ListenerGuard:
    """Counts one listener's connections and requests in flight (issue 9).

    Requests past ``max_requests`` are refused at once as OVERLOADED; they
    never wait in a queue. A connection accepted at ``max_connections``
    makes room by closing the connection idle the longest (waiting for its
    next request head, or still in its TLS handshake), as nginx does. Only
    when none is idle is it over the limit: it gets the OVERLOADED answer to
    its first request and is closed; past twice the limit it is closed at
    once, so a flood costs no more than a socket. Refusals are logged,
    rate-limited (``refusals``).
    """

    def __init__(self, listener: str, max_connections: int, max_requests: int, max_body: int, render: Render,
                 probe_paths: frozenset[str] = frozenset()) -> None:
        self.max_connections = max_connections
        self.max_requests = max_requests
        self.max_body = max_body  # a declared body over it is refused before `100 Continue`
        self.render = render
        self.probe_paths = probe_paths  # health probes: answered even when busy
        self.connections = 0  # accepted and not closed yet
        self.requests = 0
        self.refusals = RefusalLog(listener)
        # Connections between requests, in the order they got there (oldest first).
        self._waiting: dict[Any, None] = {}  # aiohttp handlers and fast connections

    # --- connections (called by the listener's Acceptor and handlers) ---

    def admit(self) -> bool | None:
        """A connection was accepted: whether it is over the limit, or None
        when it must be closed at once. It is counted from now."""
        if self.connections >= self.max_connections:
            self.close_oldest_idle()
        if self.connections >= 2 * self.max_connections:
            self.refusals.refused(f"past twice limits.max_connections ({self.max_connections}), none idle: "
                                  "closed at once")
            return None
        self.connections += 1
        over_limit = self.connections > self.max_connections
        if over_limit:
            self.refusals.refused(f"past limits.max_connections ({self.max_connections}), none idle: "
                                  "answered overloaded")
        return over_limit

    def opened(self, handler: Any, over_limit: bool) -> None:
        """An admitted connection has its handler (it is not connected yet)."""
        handler.over_limit = over_limit
        handler.counted = True
        self._waiting[handler] = None

    def closed(self, handler: Any) -> None:
        """A connection is gone."""
        if handler.counted:
            handler.counted = False
            self.connections -= 1
            self._waiting.pop(handler, None)

    def request_started(self, handler: Any) -> None:
        self._waiting.pop(handler, None)

    def request_finished(self, handler: Any) -> None:
        if handler.counted:
            self._waiting[handler] = None  # the newest to wait

    def close_oldest_idle(self) -> bool:
        """Close the connection idle the longest; False if none is idle."""
        for handler in self._waiting:  # a few may be between states (lingering): skipped
            if handler.idle:
                self.closed(handler)
                handler.evict()
                log.debug("listener %s: closed the connection idle the longest (%s) to make room",
                          self.refusals.listener, handler.peername)
                return True
        return False

    def replace(self, old: Any, new: Any) -> None:
        """Connection ``old`` is handed over to protocol ``new`` (the fast
        path's to aiohttp's): counted once, as ``new`` from now on."""
        new.over_limit = old.over_limit
        new.counted, old.counted = old.counted, False
        self._waiting.pop(old, None)
        if new.counted:
            self._waiting[new] = None

    # --- requests ---

    def over_connections_message(self) -> str:
        return f"the listener has more than {self.max_connections} connections (limits.max_connections); retry later"

    def busy_message(self) -> str:
        return (f"the listener is handling {self.requests} requests, its limit (limits.max_concurrent_requests); "
                "retry later")

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def admit(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            if getattr(request.protocol, "over_limit", False):
                return self._refuse(request, self.over_connections_message(), close=True)
            probe = request.path in self.probe_paths
            if not probe and self.requests >= self.max_requests:
                return self._refuse(request, self.busy_message())
            if _EXPECT in request:
                refusal = await self._answer_expectation(request)
                if refusal is not None:
                    return refusal
            if probe:
                return await handler(request)
            self.requests += 1
            try:
                response = await handler(request)
            finally:
                self.requests -= 1
            if request.get(_ABANDONED):
                response.force_close()
            return response

        return admit

    async def _answer_expectation(self, request: web.Request) -> web.StreamResponse | None:
        """What the head alone decides comes before `100 Continue`: 417 for
        another expectation, 413 for a declared body over the limit, an
        unknown route (answered 404/405 by the chain). Then ask for the body."""
        if request[_EXPECT].strip().lower() != "100-continue":
            return self._refuse_with(request, HttpStatusError(
                ErrorKind.UNSUPPORTED, "the only expectation supported is 'Expect: 100-continue'", 417))
        if request.match_info.http_exception is not None:
            return None
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            return self._refuse_with(request, too_large(
                f"request body of {declared} bytes exceeds the limit of {self.max_body} bytes"))
        await request.writer.write(_CONTINUE)
        request.writer.output_size = 0  # as aiohttp's own expect handler: the answer has not started
        del request[_EXPECT]
        return None

    def _refuse(self, request: web.Request, message: str, close: bool = False) -> web.StreamResponse:
        response = self._refuse_with(request, GatewayError(ErrorKind.OVERLOADED, message))
        if close:
            response.force_close()
        return response

    def _refuse_with(self, request: web.Request, error: GatewayError) -> web.StreamResponse:
        note_error(request, error)
        return self.render(error, getattr(error, "http_status", None))


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
            self._lingering_time = 0.0
        return await super().finish_response(request, resp, start_time)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
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
_PARSER_REASON = re.compile(r"[A-Za-z][A-Za-z0-9 ,./_-]{0,80}")
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
    text = str(getattr(exc, "message", "") or "")
    reason = text.split(":\n", 1)[0]  # llhttp: "<reason>:\n\n  b'<data>'\n  ^"
    if _PARSER_REASON.fullmatch(reason):
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
    the listener's :class:`~gateway.acceptor.Gate`."""

    guard: ListenerGuard
    fast: FastListener | None = None  # connections start on the fast path when the listener has one

    def install(self, guard: ListenerGuard, fast: FastListener | None) -> None:
        self.guard = guard
        self.fast = fast
        self.request_factory = _hiding_expect(self.request_factory)

    def __call__(self) -> RequestHandler:
        return self._handler()

    def _handler(self) -> _GuardedRequestHandler:
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
        self.guard.closed(protocol)

    def free_idle(self) -> bool:
        return self.guard.close_oldest_idle()


class _GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, accepting through an :class:`~gateway.acceptor.Acceptor`."""

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
        self._server = acceptor


class HttpFrontend(Frontend):
    """A frontend served by one aiohttp application on the listener address."""

    _runner: web.AppRunner | None = None
    _fast: FastListener | None = None
    _port = 0
    _tls: ServerTls | None = None
    _authenticator: Authenticator | None = None

    @abc.abstractmethod
    def build_app(self) -> web.Application:
        """The frontend's routes (each HTTP frontend defines its own)."""

    @property
    def bound_port(self) -> int:
        return self._port

    @property
    def max_body(self) -> int:
        return self.services.config.limits.max_request_bytes

    # Health probes: answered without credentials when the listener has
    # `auth`, and even past limits.max_concurrent_requests.
    probe_paths: frozenset[str] = frozenset()

    @property
    @abc.abstractmethod
    def status_kinds(self) -> Mapping[int, ErrorKind]:
        """What this protocol's HTTP statuses stand for when no handler noted
        an error (metrics' outcome): its error table read backwards, from its
        errors.py (core code knows no protocol's statuses)."""

    @abc.abstractmethod
    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        """An error in this protocol's form; ``status`` overrides the kind's
        HTTP status."""

    def render_error(self, error: GatewayError, status: int | None) -> web.StreamResponse:
        reply = self.error_reply(error, status)
        return web.Response(status=reply.status, body=b"".join(reply.parts), headers=_reply_headers(reply))

    def fast_routes(self) -> list[FastRoute]:
        """The requests the fast path serves (gateway/http/fast.py); each
        handler is also routed in the aiohttp app (:meth:`serving`), which
        serves it on connections the fast path handed over."""
        return []

    def add_routes(self, app: web.Application, handlers: list[tuple[str, str, Handler]]) -> None:
        """Route each (method, path, handler) in the aiohttp app; GET routes
        answer HEAD too, as aiohttp's own ``add_get`` does."""
        for method, path, handler in handlers:
            if method == "GET":
                app.router.add_get(path, self.serving(handler))
            else:
                app.router.add_route(method, path, self.serving(handler))

    def serving(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler`` as an aiohttp handler (of the same name: the
        request's ``operation`` label)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            return await aiohttp_reply(request, await handler(AiohttpRequest(self, request)))

        handle.__name__ = handle.__qualname__ = getattr(handler, "__name__", "other")
        return handle

    @property
    def guard(self) -> ListenerGuard:
        guard = getattr(self, "_guard", None)
        if guard is None:
            limits = self.services.config.limits
            guard = self._guard = ListenerGuard(self.listener.name, limits.max_connections,
                                                limits.max_concurrent_requests, self.max_body, self.render_error,
                                                self.probe_paths)
        return guard

    def reservation(self, request: web.Request) -> Reservation:
        """What this request holds of the memory budget (released when its
        handler ends, by the observing middleware)."""
        held = request.get(RESERVATION)
        if held is None:
            held = request[RESERVATION] = self.services.budget.reserve()
        return held

    async def read_buffer(self, request: web.Request) -> bytes | bytearray:
        """The request body under the listener's size limit and read timeout,
        uncopied (tensor payloads decode as views of it), charged to the
        memory budget before it is read (when its length is declared)."""
        reservation = self.reservation(request)
        declared = request.content_length
        if declared is not None and declared <= self.max_body:
            reservation.grow(declared)
        body = await read_body(request, self.max_body, self.services.config.limits.body_timeout,
                               self.services.offload)
        reservation.grow(len(body) - min(declared or 0, len(body)))  # inflated, or sent without a length
        return body

    async def read_body(self, request: web.Request) -> bytes:
        """:meth:`read_buffer` as immutable bytes (for JSON, hashing)."""
        body = await self.read_buffer(request)
        return body if isinstance(body, bytes) else bytes(body)

    def new_app(self, middlewares: list[Callable[..., Awaitable[Any]]]) -> web.Application:
        # aiohttp's own 1 MiB default is far too small for tensors; the body
        # limit is applied deliberately, one byte over so our check answers.
        first: list[Callable[..., Awaitable[Any]]] = [observing_middleware(self), self._close_when_draining]
        if self.listener.auth is not None:  # tokens are read here, when the listener starts
            self._authenticator = Authenticator(self.listener.auth)
            first.append(auth_middleware(self._authenticator, self.probe_paths, self.render_error))
        first.append(self.guard.middleware())
        return web.Application(client_max_size=self.max_body + 1, middlewares=[*first, *middlewares])

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
        # The access-log hook records metrics and the access log (issue 7).
        # keepalive_timeout runs from a connection's start and from each
        # answer until the next request head is complete: it also bounds
        # clients that send a head slowly (Slowloris).
        # handler_cancellation: a client that hangs up cancels its handler, and with
        # it the upstream call (docs/routing-and-resilience.md, "Client disconnects").
        limits = self.services.config.limits
        self._runner = web.AppRunner(self.build_app(), handle_signals=False, auto_decompress=False,
                                     handler_cancellation=True, access_log=log,
                                     access_log_class=access_logger_class(self.services, self.status_kinds),
                                     keepalive_timeout=limits.idle_timeout,
                                     # After an early answer (413, 408), an unread body is read and
                                     # dropped this long so the client sees the answer, then closed.
                                     lingering_time=min(_LINGERING_TIME, limits.body_timeout),
                                     max_line_size=limits.max_header_line_bytes,
                                     max_field_size=limits.max_header_line_bytes, max_headers=limits.max_headers)
        await self._runner.setup()
        # Counted connections, our own accept loop, protocol-form answers to
        # malformed HTTP: aiohttp builds its Server inside setup(), so its
        # class is narrowed here.
        factory = self._runner.server
        assert factory is not None
        factory.__class__ = _GuardedServer
        assert isinstance(factory, _GuardedServer)
        routes = FastRoutes(self.fast_routes()) if self.listener.fast_path else FastRoutes(())
        self._fast = FastListener(
            self.listener.name, self.listener.protocol, self.services, routes, self.guard, self.error_reply,
            handoff=factory._handler, authenticator=lambda: self._authenticator,
            draining=lambda: self.dataplane.draining, max_body=self.max_body,
            decompress=decompress, status_kinds=self.status_kinds) if routes else None
        factory.install(self.guard, self._fast)
        address = self.listener.address
        # SO_REUSEPORT only under `gateway serve --workers N` (services.reuse_port).
        self._tls = ServerTls(self.listener.tls) if self.listener.tls is not None else None
        site = _GuardedSite(self._runner, address.host, address.port, reuse_port=self.services.reuse_port,
                            ssl_context=self._tls.ssl_context if self._tls is not None else None)
        await site.start()
        server = site._server  # aiohttp exposes bound sockets only here
        sockets = getattr(server, "sockets", None) or []
        for sock in sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self._port = sock.getsockname()[1]
                break
        log.info("listener %s (%s) on %s:%d%s", self.listener.name, self.listener.protocol, address.host,
                 self._port, " (TLS)" if self._tls is not None else "")

    def reload_security(self, listener: ListenerConfig) -> None:
        if self._tls is not None and listener.tls is not None:
            self._tls.reload(listener.tls)
        if self._authenticator is not None and listener.auth is not None:
            self._authenticator.reload(listener.auth)

    async def stop(self, grace: float) -> None:
        if self._runner is not None:
            # aiohttp waits this long for in-flight handlers after closing the
            # socket; it only takes it from the runner (set when built).
            self._runner._shutdown_timeout = grace
            closing = [self._runner.shutdown()]
            if self._fast is not None:  # its connections (aiohttp closes those handed over)
                closing.append(self._fast.shutdown(grace))
            await asyncio.gather(*closing)
            await self._runner.cleanup()
            self._runner = None


class AiohttpRequest(HttpRequest):
    """An aiohttp request as the handlers written for both servers see it."""

    __slots__ = ("_frontend", "_request")

    def __init__(self, frontend: HttpFrontend, request: web.Request) -> None:
        self._frontend, self._request = frontend, request
        self.method, self.path, self.params = request.method, request.path, request.match_info
        self.ctx = request_context(request, frontend.listener.name, frontend.listener.protocol)
        self.headers = self.ctx.headers

    def reservation(self) -> Reservation:
        return self._frontend.reservation(self._request)

    async def read(self) -> bytes | bytearray:
        return await self._frontend.read_buffer(self._request)


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


__all__ = ["AiohttpRequest", "HttpFrontend", "HttpReply", "HttpRequest", "aiohttp_reply", "compress"]
