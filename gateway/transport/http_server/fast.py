"""The fast HTTP/1.1 path: an asyncio Protocol on httptools serving a
listener's hot requests (inference), beside the aiohttp application that
serves everything else on the same port.

Each connection starts here. A request head is read whole (bounded), parsed
by httptools, and matched against the listener's fast routes. A request the
fast path takes runs the request lifecycle below, the same steps and
answers as the aiohttp application's middleware chain; at the first request
it does not take (another path, a chunked body, HTTP/1.0, an upgrade) the
connection is handed to an aiohttp connection handler, unparsed bytes
included, and stays there. Only whole messages are ever consumed here: the
head is found before it is parsed and a body is counted by its
Content-Length, so the hand-over starts exactly at a request's first byte.

Requests on a connection are answered in order (pipelining): bytes that
arrive while one is handled wait, up to ``PIPELINE_BYTES``, then reading
pauses. A body goes into one buffer of its declared size, allocated when the
handler reads it (after its budget is reserved), never joined from chunks.
Answers are written part by part with the transport's flow control.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import httptools

from gateway.core.errors import ErrorKind, GatewayError, malformed, too_large
from gateway.core.record import OUTCOME_CANCELLED
from gateway.core.types import RequestContext
from gateway.transport.cycle import Refusals, RequestCycle
from gateway.transport.http_server.body import decompress, request_coding
from gateway.transport.http_server.exchange import (
    Handler,
    HttpReply,
    HttpRequest,
    HttpStatusError,
    new_context,
    outcome_of_status,
    parser_reason,
)

if TYPE_CHECKING:
    from gateway.runtime.budget import Reservation
    from gateway.runtime.services import GatewayServices
    from gateway.transport.http_server.guard import GuardedConnection, ListenerGuard

log = logging.getLogger(__name__)

# Bytes of later requests buffered while one is handled, and of a body not
# yet claimed by its handler: past this, reading pauses (as aiohttp's own
# read buffer, so that idle connections hold little memory).
PIPELINE_BYTES = 64 << 10
# Answers up to this size are written in one call with their head.
SMALL_ANSWER = 256 << 10
# An answer's body is handed to the transport this much at a time, each
# slice once the previous ones have drained below the high-water mark.
WRITE_SLICE = 1 << 20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LINGERING_TIME = 10.0  # s, as aiohttp's: how long an unread body is read and dropped after an early answer
_TIMER_SLACK = 0.001  # s: a timer may run this much before it is due (the loop's clock resolution)


@dataclass(frozen=True, slots=True)
class FastRoute:
    """A request the fast path takes: method, path pattern (named groups
    become the request's params), handler; ``operation`` is the label of
    metrics and the access log (the aiohttp handler's name)."""

    method: str
    pattern: re.Pattern[str]
    handler: Handler
    operation: str


class FastRoutes:
    """The fast routes of a listener. ``fixed_paths``: the paths without
    parameters the aiohttp app routes; those a fast route's pattern would
    also take (``GET /v2/models/stats`` and ``/v2/models/{model}``) are
    handed over, as aiohttp prefers a fixed path to a pattern: both
    servers then answer a request alike."""

    def __init__(self, routes: Sequence[FastRoute], fixed_paths: Iterable[str] = ()) -> None:
        self._by_method: dict[str, list[FastRoute]] = {}
        for route in routes:
            self._by_method.setdefault(route.method, []).append(route)
        own = {route.pattern.pattern for route in routes if not route.pattern.groups}
        self._handed_over = frozenset(
            path for path in fixed_paths
            if re.escape(path) not in own and any(route.pattern.fullmatch(path) for route in routes))

    def __bool__(self) -> bool:
        return bool(self._by_method)

    def match(self, method: str, path: str) -> tuple[FastRoute, dict[str, str]] | None:
        if path in self._handed_over:
            return None
        for route in self._by_method.get(method, ()):
            found = route.pattern.fullmatch(path)
            if found is not None:
                return route, found.groupdict(default="")
        return None


@dataclass
class FastListener:
    """One listener as the fast protocol serves it (made by the listener's HttpFrontend)."""

    name: str
    protocol: str
    services: GatewayServices
    routes: FastRoutes
    guard: ListenerGuard
    render: Callable[[GatewayError, int | None], HttpReply]  # the protocol's error form
    handoff: Callable[[], asyncio.Protocol]  # a new aiohttp connection handler (a GuardedConnection)
    cycle: RequestCycle  # the listener's, shared with its aiohttp app
    draining: Callable[[], bool]
    max_body: int
    status_kinds: Mapping[int, ErrorKind]  # what its HTTP statuses stand for (HttpFrontend.status_kinds)

    def __post_init__(self) -> None:
        self.closing = False
        self.connections: set[FastConnection] = set()
        self.form = Refusals(self.render, _headers_of, lambda: _challenge(self.cycle))

    async def shutdown(self, grace: float) -> None:
        """Close idle connections now and the others once their answer is
        written, waiting up to ``grace`` s before aborting what is left."""
        self.closing = True
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            for connection in list(self.connections):  # also those accepted as the listener closed
                connection.close_when_done()
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.abort()


class _HeadParser:
    """httptools callbacks collecting one request head."""

    __slots__ = ("complete", "header_bytes", "keep_alive", "parser", "url")

    def __init__(self) -> None:
        self.url = b""
        self.header_bytes: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = True
        self.parser: httptools.HttpRequestParser | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True
        # Asked now: once a message without a body is complete, llhttp has
        # reset its flags (`Connection: close` included) for the next one.
        if self.parser is not None:
            self.keep_alive = self.parser.should_keep_alive()
            self.parser = None  # no reference cycle left for the collector


class HeadTooLarge(Exception):
    pass


def _decode_headers(pairs: list[tuple[bytes, bytes]], max_line: int, max_headers: int) -> dict[str, str]:
    if len(pairs) > max_headers:
        raise HeadTooLarge
    headers: dict[str, str] = {}
    for name, value in pairs:
        if len(name) + len(value) + 2 > max_line:
            raise HeadTooLarge
        # As aiohttp reads them: bytes that are no UTF-8 stay visible (as
        # surrogates) to the checks that refuse them.
        key, text = name.decode("utf-8", "surrogateescape").lower(), value.decode("utf-8", "surrogateescape")
        if key == "connection" and key in headers:  # a list over several lines: every hop-by-hop name counts
            text = f"{headers[key]}, {text}"
        headers[key] = text
    return headers


class FastRequest(HttpRequest):
    """A request read by :class:`FastConnection`; its body arrives into
    the connection, and into one buffer once the handler claims it."""

    __slots__ = ("_buffer", "_complete", "_connection", "_handed_over", "_pending", "_pending_size", "_reservation",
                 "_view", "continued", "expect", "expected", "filled", "route")

    def __init__(self, connection: FastConnection, method: str, path: str, params: dict[str, str],
                 headers: dict[str, str], ctx: RequestContext, expected: int, expect: str | None,
                 route: FastRoute) -> None:
        self.method, self.path, self.params, self.headers, self.ctx = method, path, params, headers, ctx
        self._connection = connection
        self.expected = expected  # the Content-Length
        self.filled = 0  # body bytes received
        self.expect = expect  # the Expect header (HTTP/1.1), None without one
        self.continued = False  # whether `100 Continue` was sent
        self.route = route
        self._pending: list[bytes] = []  # body bytes received before the handler claimed the body
        self._pending_size = 0
        self._buffer: bytearray | None = None
        self._view: memoryview | None = None
        self._handed_over = False  # read() gave the body to the handler
        self._complete: asyncio.Future[None] | None = None
        self._reservation: Reservation | None = None

    # --- the body, as the connection receives it ---

    @property
    def missing(self) -> int:
        return self.expected - self.filled

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Take what of ``data`` belongs to the body; how many bytes that was."""
        size = min(len(data), self.expected - self.filled)
        if size <= 0:
            return 0
        if self._view is not None:
            self._view[self.filled:self.filled + size] = data[:size]
        else:
            self._pending.append(bytes(data[:size]))
            self._pending_size += size
        self.filled += size
        if self.filled == self.expected and self._complete is not None and not self._complete.done():
            self._complete.set_result(None)
        return size

    @property
    def unclaimed(self) -> int:
        return self._pending_size

    # --- the handler's side ---

    def reservation(self) -> Reservation:
        if self._reservation is None:
            self._reservation = self._connection.listener.services.budget.reserve()
        return self._reservation

    def release(self) -> None:
        if self._reservation is not None:
            self._reservation.release()
        self._pending = []
        self._buffer = self._view = None

    async def read(self) -> bytes | bytearray:
        listener = self._connection.listener
        limit = listener.max_body
        if self.expected > limit:
            raise too_large(f"request body of {self.expected} bytes exceeds the limit of {limit} bytes")
        encoding = request_coding(self.headers.get("content-encoding", "identity"))
        if self._handed_over:
            raise RuntimeError("the request body was read already")
        if self._buffer is None:
            self.reservation().grow(self.expected)
            self._buffer = bytearray(self.expected)
            self._view = memoryview(self._buffer)
            offset = 0
            for chunk in self._pending:
                self._view[offset:offset + len(chunk)] = chunk
                offset += len(chunk)
            self._pending, self._pending_size = [], 0
            self._connection.claimed()
        if self.filled < self.expected:
            if self.expect is not None and not self.continued:
                self.continued = True
                self._connection.write_raw(_CONTINUE)
            self._complete = asyncio.get_running_loop().create_future()
            timeout = listener.services.config.limits.body_timeout
            try:
                async with asyncio.timeout(timeout):
                    await self._complete
            except TimeoutError:
                self._connection.abandoned = True
                raise HttpStatusError(ErrorKind.MALFORMED_REQUEST, f"the request body did not arrive within "
                                      f"{timeout:g}s (limits.body_timeout)", 408) from None
        body: bytes | bytearray = self._buffer
        # The handler owns the body from here: a big one is freed as soon as
        # the handler lets go of it, not when the answer has been written.
        self._buffer = self._view = None
        self._handed_over = True
        if encoding in ("gzip", "deflate"):
            body = await listener.services.offload.run(len(body) << 10, decompress, body, encoding, limit)
            self.reservation().grow(len(body))
        return body


_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


class _Date:
    """The Date header, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True).encode()
        return cls.value


class FastConnection(asyncio.Protocol):
    """One client connection, while it is served by the fast path."""

    # What the listener's guard reads of each connection (ListenerGuard).
    over_limit = False
    counted = False
    connecting: asyncio.Task[Any] | None = None

    def __init__(self, listener: FastListener) -> None:
        self.listener = listener
        limits = listener.services.config.limits
        self._max_line = limits.max_header_line_bytes
        self._max_headers = limits.max_headers
        self._max_head = self._max_line * (self._max_headers + 2)
        self._idle_timeout = limits.idle_timeout
        self.transport: asyncio.Transport | None = None
        self.peername = ""
        self._buffer = bytearray()  # bytes of requests not yet begun
        self.request: FastRequest | None = None  # the request being handled
        self._task: asyncio.Task[None] | None = None
        self._discard = 0  # body bytes of an answered request still to drop
        self._timer: asyncio.TimerHandle | None = None  # lingering over an unread body
        # Idle since (loop time; None while a request is handled): one timer
        # checks it, moved on when it fires early, never made per request.
        self._idle_since: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reading = True
        self._writable: asyncio.Future[None] | None = None
        self._closing = False  # close once the current answer is written
        self._writing = False  # the current answer is being written
        self._handed_off = False
        self.abandoned = False  # a body never arrived in time: close after the answer

    # --- what the guard asks ---

    @property
    def idle(self) -> bool:
        return self.transport is None or (self.request is None and self._discard == 0)

    def evict(self) -> None:
        if self.transport is not None:
            self.transport.close()
        elif self.connecting is not None:
            self.connecting.cancel()

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        peer = transport.get_extra_info("peername")
        self.peername = peer[0] if isinstance(peer, tuple) else str(peer or "")
        self.listener.connections.add(self)
        if self.listener.closing:
            self._close()
            return
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections.discard(self)
        if not self._handed_off:
            self.listener.guard.closed(self)
        self._stop_timers()
        self.transport = None
        if self._task is not None and not self._task.done() and not self._writing:
            self._task.cancel()  # the client went away: so does its upstream call
        # (An answer being written fails on its own: its write waits end in an error.)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)  # a write waiting for it finds the transport gone

    def data_received(self, data: bytes) -> None:
        if self._discard:
            dropped = min(self._discard, len(data))
            self._discard -= dropped
            if dropped == len(data):
                if not self._discard:
                    self._after_answer()
                return
            data = data[dropped:]
            if not self._discard:
                self._buffer += data
                self._after_answer()
                return
        request = self.request
        if request is not None and request.missing:
            used = request.feed(data)
            if used == len(data):
                if request.unclaimed > PIPELINE_BYTES:
                    self._pause_reading()
                return
            data = data[used:]
        self._buffer += data
        if request is None:
            self._next_request()
        elif len(self._buffer) > PIPELINE_BYTES:
            self._pause_reading()

    def eof_received(self) -> bool | None:
        return None  # closes the transport (a half-closed client gets no answer over HTTP/1.1)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # --- reading requests ---

    def _next_request(self) -> None:
        """Begin the request at the start of the buffer, if its head is whole."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n", 0, self._max_head + 4)
        if end < 0:
            if len(buffer) > self._max_head:
                self._refuse_head(HeadTooLarge())
            return
        head_size = end + 4
        parser = _HeadParser()
        try:
            raw = parser.parser = httptools.HttpRequestParser(parser)
            raw.feed_data(bytes(buffer[:head_size]))
            if not parser.complete:
                raise httptools.HttpParserError("incomplete head")
            headers = _decode_headers(parser.header_bytes, self._max_line, self._max_headers)
            method = raw.get_method().decode("ascii")
            url = httptools.parse_url(parser.url)
        except httptools.HttpParserUpgrade:
            self._hand_off()  # aiohttp answers an upgrade as it does today
            return
        except (httptools.HttpParserError, HeadTooLarge, UnicodeDecodeError) as exc:
            self._refuse_head(exc)
            return
        if len(parser.url) + len(method) + 11 > self._max_line:
            self._refuse_head(HeadTooLarge())
            return
        path = url.path.decode("utf-8", "surrogateescape") if url.path else "/"
        if "%" in path:
            path = unquote(path, errors="surrogateescape")
        matched = self.listener.routes.match(method, path)
        if (matched is None or raw.get_http_version() != "1.1" or raw.should_upgrade()
                or "transfer-encoding" in headers):
            self._hand_off()
            return
        length = headers.get("content-length", "0")
        if not length.isdigit() or len(length) > 18:  # httptools has checked its form; bound its size
            self._refuse_head(httptools.HttpParserError("bad Content-Length"))
            return
        del buffer[:head_size]
        self._idle_since = None  # busy: a head is whole
        route, params = matched
        listener = self.listener
        ctx = new_context(listener.name, listener.protocol, headers)
        request = FastRequest(self, method, path, params, headers, ctx, int(length), headers.get("expect"), route)
        self.request = request
        if not parser.keep_alive:
            self._closing = True
        if buffer and request.missing:
            used = request.feed(buffer)
            del buffer[:used]
        self.listener.guard.request_started(self)
        self._task = asyncio.get_running_loop().create_task(self._serve(request))

    def claimed(self) -> None:
        """The handler took the body into its buffer: read on."""
        if not self._reading and len(self._buffer) <= PIPELINE_BYTES:
            self._resume_reading()

    def _refuse_head(self, exc: BaseException) -> None:
        """A head that cannot be read: answered in the protocol's form, then closed."""
        if isinstance(exc, HeadTooLarge):
            error: GatewayError = HttpStatusError(
                ErrorKind.TOO_LARGE, "the request line or headers are over limits.max_header_line_bytes or "
                "limits.max_headers", 431)
        else:
            reason = parser_reason(str(exc)) or "the request could not be parsed"
            error = malformed(f"malformed HTTP request: {reason}")
        log.debug("refused a malformed HTTP request from %s: %s (%s)", self.peername, error.message,
                  type(exc).__name__)
        self._closing = True
        reply = self.listener.render(error, getattr(error, "http_status", 400))
        self._write_small(reply, reply.size)
        self._close()

    def _hand_off(self) -> None:
        """Give the connection, from the current request's first byte on, to
        an aiohttp connection handler."""
        transport = self.transport
        assert transport is not None
        self._stop_timers()
        self._handed_off = True
        self.listener.connections.discard(self)
        handler = self.listener.handoff()
        self.listener.guard.replace(self, cast("GuardedConnection", handler))
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if not self._reading:
            transport.resume_reading()
        data, self._buffer = bytes(self._buffer), bytearray()
        if data:
            handler.data_received(data)

    # --- the request lifecycle ---

    async def _serve(self, request: FastRequest) -> None:
        listener = self.listener
        cycle = listener.cycle
        ctx = request.ctx
        record = ctx.record
        cycle.begin(ctx, request.route.operation, request.method, request.path, self.peername)
        try:
            if self.over_limit:
                self._closing = True
                reply = cycle.refuse(ctx, GatewayError(ErrorKind.OVERLOADED, listener.guard.over_connections_message()),
                                     None, listener.form)
            else:
                reply = await cycle.run(ctx, request.path in cycle.probes, lambda: self._handle(request),
                                        listener.form)
        except asyncio.CancelledError:
            cycle.cancelled(ctx, "499", request.filled)
            raise
        finally:
            cycle.end()
            request.release()
        cycle.stamp(reply.headers, ctx)
        if listener.draining() or self.abandoned:
            self._closing = True
        if request.missing and (request.expect is not None and not request.continued):
            self._closing = True  # the client holds its body back for a `100 Continue` that never came
        if not record.status:
            record.status = str(reply.status)
        if not record.outcome:
            record.outcome = outcome_of_status(reply.status, listener.status_kinds)
        record.request_bytes = request.filled
        try:
            size = reply.size
        except TypeError:  # a handler's bug (a part that is not bytes-like): its 500, never a hung client
            log.exception("the answer to %s %s is not bytes", request.method, request.path)
            reply = listener.render(GatewayError(ErrorKind.INTERNAL, "internal error"), None)
            record.status, record.outcome, size = str(reply.status), ErrorKind.INTERNAL.value, reply.size
        self._writing = True
        try:
            record.response_bytes = await self._write(reply, size)
        except ConnectionError:
            record.status, record.outcome = "499", OUTCOME_CANCELLED
        finally:
            cycle.finish(ctx)
        self._finish(request)

    def _handle(self, request: FastRequest) -> Awaitable[HttpReply]:
        """The route's handler, after the `Expect` check HTTP/1.1 asks for."""
        if request.expect is not None and request.expect.strip().lower() != "100-continue":
            raise HttpStatusError(ErrorKind.UNSUPPORTED, "the only expectation supported is 'Expect: 100-continue'",
                                  417)
        return request.route.handler(request)

    def _finish(self, request: FastRequest) -> None:
        """After an answer: drop what is left of its body, then the next request."""
        self._writing = False
        self.request = None
        self._task = None
        self.listener.guard.request_finished(self)
        if self.transport is None:
            return
        withheld = request.expect is not None and not request.continued  # the client holds its body back
        if request.missing and not withheld:
            # The client is still sending a body nobody reads: read and drop it
            # (for a while) before the next request, or before closing, so that
            # it sees the answer.
            self._discard = request.missing
            self._lingering(min(LINGERING_TIME, self.listener.services.config.limits.body_timeout))
            return
        self._after_answer()

    def _after_answer(self) -> None:
        if self.transport is None:
            return
        if self._closing:
            self._close()
            return
        self._cancel_timer()
        self._arm_idle_timer()
        if not self._reading:
            self._resume_reading()
        if self._buffer:
            self._next_request()

    # --- writing answers ---

    def write_raw(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _head(self, reply: HttpReply, size: int) -> bytes:
        status = reply.status
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown")),
                 b"Date: " + _Date.now() + b"\r\n"]
        if reply.content_type is not None:
            lines.append(b"Content-Type: " + reply.content_type.encode("latin-1") + b"\r\n")
        lines.append(b"Content-Length: %d\r\n" % size)
        if self._closing:
            lines.append(b"Connection: close\r\n")
        for name, value in reply.headers.items():
            lines.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
        lines.append(b"\r\n")
        return b"".join(lines)

    def _write_small(self, reply: HttpReply, size: int) -> int:
        if self.transport is not None:
            self.transport.write(b"".join([self._head(reply, size), *reply.parts]))
        return size

    async def _write(self, reply: HttpReply, size: int) -> int:
        """Write the answer (``size``: its body's); that size. Big bodies go a
        slice at a time, each once the transport's buffer has drained (no
        whole copy there)."""
        if self._writable is not None and not self._writable.done():
            await self._writable  # a client that does not read its answers gets no more of them meanwhile
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if size <= SMALL_ANSWER:
            return self._write_small(reply, size)
        transport.write(self._head(reply, size))
        for part in reply.parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), WRITE_SLICE):
                if self._writable is not None:
                    await self._writable
                if self.transport is None or self.transport.is_closing():  # the client left
                    raise ConnectionResetError("the client closed the connection")
                self.transport.write(view[start:start + WRITE_SLICE])
        if self._writable is not None and not self._writable.done():
            await self._writable  # written out (below the low-water mark): else the client left
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        return size

    # --- timers and flow control ---

    def _arm_idle_timer(self) -> None:
        """Idle from now: closed after ``idle_timeout`` unless a head is whole by then."""
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_at(self._idle_since + self._idle_timeout, self._idle_expired)

    def _lingering(self, seconds: float) -> None:
        """Drop the rest of an answered request's body; close if it has not
        arrived within ``seconds``."""
        self._cancel_timer()
        if not self._reading:
            self._resume_reading()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._close)

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self._idle_since is None or self.request is not None:
            return  # busy: armed again after the answer
        loop = asyncio.get_running_loop()
        due = self._idle_since + self._idle_timeout
        if loop.time() + _TIMER_SLACK < due:  # idle again since the timer was set: wait for the rest
            self._idle_timer = loop.call_at(due, self._idle_expired)
            return
        self._close()  # no head in time: idle keep-alive, or a head sent too slowly

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stop_timers(self) -> None:
        self._cancel_timer()
        self._idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _pause_reading(self) -> None:
        if self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and self.transport is not None:
            self._reading = True
            self.transport.resume_reading()

    def close_when_done(self) -> None:
        """The listener stops: close now if idle, else after the answer."""
        self._closing = True
        if self.request is None:
            self._close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        self._stop_timers()
        if self.transport is not None:
            self.transport.close()


def _headers_of(reply: HttpReply) -> dict[str, str]:
    return reply.headers


def _challenge(cycle: RequestCycle) -> str:
    return str(getattr(cycle.credentials, "challenge", "") or "")


def route(method: str, path: str, handler: Handler) -> FastRoute:
    """A fast route from an aiohttp-style path: ``{name}`` matches one
    segment and becomes a param; the handler's name is the operation."""
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
    return FastRoute(method, re.compile(pattern), handler, str(getattr(handler, "__name__", "other")))


__all__ = ["FastConnection", "FastListener", "FastRequest", "FastRoute", "FastRoutes", "route"]
