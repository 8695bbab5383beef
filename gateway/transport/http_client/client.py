"""The one HTTP/1.1 client of every HTTP upstream (V2 REST, UM-Bridge,
GraphStorm): a bounded keep-alive pool of raw connections to one endpoint.

Adapters hand it a method, a path, headers and body bytes and get back the
status, the headers and the body in one buffer; they own no sessions and see
no transport exceptions. It knows no protocol.

Why not aiohttp's ClientSession: its machinery dominated a hop's latency
(docs/performance.md). Here a connection is an ``asyncio.BufferedProtocol``
whose replies are parsed by httptools (llhttp); a body of known length is
read straight into its final buffer.

Policies (docs/routing-and-resilience.md, "The upstream HTTP transport"):

- At most ``max_connections`` connections per endpoint; further requests
  wait for one, as long as the data plane's deadline lets them (it cancels
  the wait). Idle connections are closed after ``idle_timeout``, before
  common servers close them (uvicorn, under MLServer and KServe: 5 s).
- A pooled connection the server closed while it was idle is noticed
  before anything is written on it (the loop saw the close, or the socket
  polls readable: an idle connection has nothing to say but EOF); the
  request then goes to another connection. Once any byte of a request is
  written, a failure is a connection reset and the route's retry policy
  decides whether to send it again.
- A connection goes back to the pool only after a complete reply that lets
  it live (HTTP/1.1 without ``Connection: close``, all of the request
  written, a status below 500: some servers close silently after an
  error); one whose exchange failed or was cancelled is closed.
- Redirects are answers (never followed); replies are asked uncompressed
  (``Accept-Encoding: identity``) and a compressed one is refused.
- :meth:`UpstreamHttp.stream` reads a reply's body as it comes (server-sent
  events): chunks wait in a buffer of ``buffer_bytes``; past it the socket
  is not read until the consumer takes some, so a slow consumer slows the
  server (TCP's flow control) and nothing grows without bound.
- Every failure leaves as a named :class:`~gateway.core.errors.GatewayError`:
  :func:`~gateway.core.errors.connect_failure` (refused, DNS, TLS handshake,
  connect timeout), :func:`~gateway.core.errors.connection_reset` (lost before a
  complete reply), UPSTREAM_BAD_RESPONSE (not HTTP, over the size limit) —
  naming the upstream, never the address, never quoting the reply. The
  transport's own exception is chained for the log.
"""

from __future__ import annotations

import asyncio
import errno
import select
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import httptools

from gateway.core.errors import ErrorKind, GatewayError, connect_failure, connection_reset
from gateway.runtime.tls import HttpClientTls
from gateway.transport.upstream import CONNECT_TIMEOUT, connect_error_words, too_large_reply

if TYPE_CHECKING:
    from gateway.config.model import Address

Body = bytes | bytearray | memoryview

# Idle pooled connections are dropped before common servers close them
# (uvicorn closes after 5 s): a request written onto a connection the
# server is closing is lost.
IDLE_KEEPALIVE_S = 4.0
# A reply's status line and headers; more is not an HTTP server's reply.
MAX_HEAD_BYTES = 64 << 10
# Reads before a body's length is known go through one scratch buffer per pool.
_READ_BUFFER_BYTES = 256 << 10
# Bodies up to this size leave in one write with their head (one send, one
# segment); bigger ones are written in pieces of this size as the socket drains.
_WRITE_PIECE_BYTES = 64 << 10
# Header names the transport writes itself; callers' values for them are dropped.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "accept-encoding"})
_NO_BODY_STATUSES = (204, 304)


class ReplyHeaders:
    """A reply's headers, looked up case-insensitively (repeated fields
    joined with ", "). Values are decoded as Latin-1, byte for byte."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __repr__(self) -> str:
        return f"ReplyHeaders({sorted(self._fields)})"  # names only: values may be secrets


class HttpReply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: ReplyHeaders, body: bytes | bytearray) -> None:
        self.status = status
        self.headers = headers
        self.body = body  # a bytearray when it was read into a buffer of the declared length


class HttpStream:
    """A reply whose body is read as it comes (:meth:`UpstreamHttp.stream`).
    ``close`` it when done: the connection goes back to the pool only when
    the whole body was read."""

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, pool: UpstreamHttp, conn: _Connection, reply: HttpReply) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = reply.status
        self.headers = reply.headers

    async def read(self) -> bytes | None:
        """The next piece of the body, None at its end. Raises named GatewayErrors only."""
        if self._conn is None:
            return None
        return await self._conn.read_piece()

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body, up to ``limit`` bytes (more is cut off: for error answers)."""
        pieces: list[bytes] = []
        size = 0
        while size < limit and (piece := await self.read()) is not None:
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces)[:limit]

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.stream_complete():
            self._pool._release(conn, conn.reusable)
        else:
            conn.forget_outcome()
            self._pool._discard(conn)  # a body left unread: the connection cannot carry another exchange


class _Stop(Exception):
    """Ends httptools' parse from inside a callback (the reason is kept aside)."""


class UpstreamHttp:
    """Requests to one endpoint over a bounded pool of kept-alive connections.

    ``label`` names the upstream in errors (clients see them); ``endpoint``
    is cut from any transport words that still name it. ``max_connections``
    None: no bound (each request opens what it needs). ``keepalive`` False:
    every request asks ``Connection: close`` and uses a new connection.
    """

    def __init__(self, endpoint: Address, tls: HttpClientTls, label: str, *, max_response: int,
                 max_connections: int | None = None, keepalive: bool = True,
                 idle_timeout: float = IDLE_KEEPALIVE_S, limit_name: str = "max_response_bytes") -> None:
        self.endpoint = endpoint
        self.label = label
        self.max_response = max_response
        self.limit_name = limit_name  # the setting named when a reply is over max_response
        self.max_connections = max_connections
        self.keepalive = keepalive
        self.idle_timeout = idle_timeout
        self.connect_timeout = CONNECT_TIMEOUT
        self._ssl: ssl.SSLContext | None = None
        self._server_hostname: str | None = None
        if tls.scheme == "https":
            self._ssl = tls.ssl if isinstance(tls.ssl, ssl.SSLContext) else ssl.create_default_context()
            # A discovered address presents the name it was found under.
            self._server_hostname = tls.server_hostname or endpoint.name
        # Host: as aiohttp wrote it, without the scheme's default port.
        default_port = 443 if self._ssl is not None else 80
        identity = endpoint.name or endpoint.host
        host = identity if endpoint.port == default_port else f"{identity}:{endpoint.port}"
        if ":" in identity:
            host = f"[{identity}]" if endpoint.port == default_port else str(endpoint)
        self._fixed_head = f"Host: {host}\r\nAccept-Encoding: identity\r\n" + (
            "" if keepalive else "Connection: close\r\n")
        self._fixed_lines = 2 if keepalive else 3
        self.read_buffer = memoryview(bytearray(_READ_BUFFER_BYTES))
        self._idle: list[_Connection] = []  # the most recently used last (taken first: warm)
        self._open = 0  # connections open or being opened
        self._all: set[_Connection] = set()
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    # --- requests ----------------------------------------------------------------

    async def request(self, method: str, path: str, headers: Mapping[str, str] | None = None,
                      body: Body | Sequence[Body] | None = None) -> HttpReply:
        """One exchange. ``body``: bytes-like, or a sequence of parts written
        in order without joining them. Raises named GatewayErrors only."""
        head, parts, size = self._encode(method, path, headers, body)
        conn = await self._acquire()
        try:
            reply = await conn.exchange(head, parts, size)
        except BaseException:
            conn.forget_outcome()
            self._discard(conn)  # failed or cancelled mid-exchange: never reused
            raise
        self._release(conn, conn.reusable)
        return reply

    async def stream(self, method: str, path: str, headers: Mapping[str, str] | None = None,
                     body: Body | Sequence[Body] | None = None, *, buffer_bytes: int = 256 << 10) -> HttpStream:
        """One exchange whose reply body is read as it comes: returns at the
        reply's head. At most ``buffer_bytes`` (plus one socket read) of it
        wait unread. The reply's size is not bounded here: the reader bounds
        what it keeps."""
        head, parts, size = self._encode(method, path, headers, body)
        conn = await self._acquire()
        try:
            reply = await conn.exchange(head, parts, size, stream_buffer=buffer_bytes)
        except BaseException:
            conn.forget_outcome()
            self._discard(conn)
            raise
        return HttpStream(self, conn, reply)

    def _encode(self, method: str, path: str, headers: Mapping[str, str] | None,
                body: Body | Sequence[Body] | None) -> tuple[bytes, list[Body], int]:
        if body is None:
            parts: list[Body] = []
        elif isinstance(body, (bytes, bytearray, memoryview)):
            parts = [body]
        else:
            parts = list(body)
        parts = [p.cast("B") if isinstance(p, memoryview) and p.format != "B" else p for p in parts]
        size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
        lines = [f"{method} {path} HTTP/1.1\r\n", self._fixed_head]
        count = 1 + self._fixed_lines + 1  # the request line, the fixed fields, the blank line
        if headers:
            for name, value in headers.items():
                if name.lower() not in _OWN_HEADERS:
                    lines.append(f"{name}: {value}\r\n")
                    count += 1
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {size}\r\n")
            count += 1
        lines.append("\r\n")
        text = "".join(lines)
        # A line break inside a name, value or path would smuggle a header or a request.
        if text.count("\n") != count or text.count("\r") != count:
            raise GatewayError(ErrorKind.INVALID_INPUT,
                               f"a header or path for upstream {self.label} holds a line break")
        return text.encode("utf-8", "surrogateescape"), parts, size

    # --- the pool ------------------------------------------------------------------

    async def _acquire(self) -> _Connection:
        while True:
            if self._closed:
                raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"upstream {self.label} is closed")
            while self._idle:
                conn = self._idle.pop()
                if conn.usable_after_idle(self.idle_timeout):
                    return conn
                self._discard(conn)  # nothing of the request was written on it
            if self.max_connections is None or self._open < self.max_connections:
                return await self._connect()
            handed = await self._wait_for_connection()
            if handed is not None:
                if handed.usable_after_idle(self.idle_timeout):
                    return handed
                self._discard(handed)
            # None, or a handed connection that had gone stale: a slot is free, go round.

    async def _wait_for_connection(self) -> _Connection | None:
        """Wait until a busy connection is handed over (or None: one closed,
        so a new one may be opened). The data plane's deadline cancels it."""
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed something just before the cancel
                handed = waiter.result()
                if handed is not None:
                    self._release(handed, True)
                else:
                    self._wake_one()
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    async def _connect(self) -> _Connection:
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(self), self.endpoint.host, self.endpoint.port, ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl is not None else None)
            if transport.get_extra_info("sockname") == transport.get_extra_info("peername"):
                # Nothing listens on a local port and the kernel picked that very port as
                # ours (TCP simultaneous open): the "upstream" would answer our own bytes,
                # and we would hold the port its server is about to bind.
                transport.abort()
                raise ConnectionRefusedError(errno.ECONNREFUSED, "connected to itself: nothing listens there")
        except BaseException as exc:
            self._open -= 1
            self._wake_one()
            if isinstance(exc, TimeoutError):  # this timeout's own (a deadline's is a CancelledError here)
                raise connect_failure(self.label, f"no connection within {self.connect_timeout:g}s") from exc
            if isinstance(exc, OSError):  # refused, unresolvable, TLS handshake (ssl.SSLError)
                raise connect_failure(self.label, connect_error_words(exc, self.endpoint)) from exc
            raise
        if self._closed:
            conn.abort()
            self._open -= 1
            raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"upstream {self.label} is closed")
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection, reusable: bool) -> None:
        """After a complete reply: back to the pool (or to a waiter), or closed."""
        if not reusable or self._closed or not conn.is_open:
            self._discard(conn, graceful=True)
            return
        conn.idle_since = asyncio.get_running_loop().time()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self.idle_timeout, self._sweep)

    def _discard(self, conn: _Connection, graceful: bool = False) -> None:
        """Close ``conn`` and free its slot: at once if it may hold half an
        exchange, else ``graceful`` (a TLS close_notify, anything queued sent)."""
        if graceful:
            conn.close()
        else:
            conn.abort()
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        """A slot is free: the first waiter may open a connection."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def lost_while_idle(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)
            self._discard(conn)

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_timeout``; come back for the rest."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self.idle_timeout
        expired = [c for c in self._idle if c.idle_since <= cutoff]
        if expired:
            self._idle = [c for c in self._idle if c.idle_since > cutoff]
            for conn in expired:
                self._discard(conn, graceful=True)
        if self._idle:
            oldest = min(c.idle_since for c in self._idle)
            self._sweeper = loop.call_at(oldest + self.idle_timeout, self._sweep)

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        """Close every connection; requests in progress fail, later ones are refused."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._idle.clear()
        for conn in list(self._all):
            self._discard(conn)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"upstream {self.label} is closed"))


# What a connection is reading.
_HEAD, _SIZED, _PARSED, _UNTIL_CLOSE, _DONE = range(5)


class _Connection(asyncio.BufferedProtocol):
    """One connection: one exchange at a time, replies parsed by httptools.

    A body of declared length is read by the transport straight into its
    final buffer (``get_buffer``); chunked and close-delimited bodies go
    through the parser.
    """

    def __init__(self, pool: UpstreamHttp) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.reusable = False
        self._poll: select.poll | None = None
        self._reply: asyncio.Future[HttpReply] | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._state = _DONE
        self._received = 0  # bytes of the current reply
        self._status = 0
        self._interim = False  # parsing a 1xx reply that precedes the real one
        self._fields: dict[str, str] = {}
        self._length: int | None = None
        self._chunked = False
        self._encoded = False
        self._keep_alive = False
        self._body: bytes | bytearray = b""
        self._view: memoryview | None = None  # the unfilled part of a sized body
        self._filled = 0
        self._sent_all = False
        self._failure: GatewayError | None = None
        # A streamed reply (stream_buffer set): its body's pieces wait here for read_piece.
        self._stream_buffer: int | None = None
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._reading_paused = False
        self._ended = False  # the streamed body is complete
        self._readable: asyncio.Future[None] | None = None

    # --- asyncio's side ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        sock = self.transport.get_extra_info("socket")
        if sock is not None and hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._poll = None
        self._wake_writer()
        if self._streaming_body():
            if self._state == _UNTIL_CLOSE and exc is None:
                self._complete()
            else:
                error = connection_reset(self.pool.label, "closed the connection mid-reply")
                error.__cause__ = exc
                self._fail(error)
            return
        if self._reply is None or self._reply.done():
            self.pool.lost_while_idle(self)
            return
        if self._state == _UNTIL_CLOSE and exc is None:
            self._complete()
            return
        detail = "closed the connection without answering" if self._received == 0 else \
            "closed the connection mid-reply"
        error = connection_reset(self.pool.label, detail)
        error.__cause__ = exc
        self._fail(error)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost tells the rest

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._view is not None:
            return self._view[self._filled:]
        return self.pool.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._view is not None:
            self._filled += nbytes
            self._received += nbytes
            if self._filled == len(self._view):
                self._view.release()
                self._view = None
                self._complete()
            return
        if self._reply is None or (self._reply.done() and not self._streaming_body()) or self._state == _DONE:
            self.abort()  # bytes nobody asked for: this connection's framing cannot be trusted
            return
        self._received += nbytes
        try:
            assert self._parser is not None
            self._parser.feed_data(self.pool.read_buffer[:nbytes])
        except (httptools.HttpParserError, _Stop) as exc:
            if self._failure is None:
                reason = str(exc)[:100] if isinstance(exc, httptools.HttpParserError) else ""
                self._failure = GatewayError(
                    ErrorKind.UPSTREAM_BAD_RESPONSE,
                    f"upstream {self.pool.label} sent an unreadable HTTP reply" + (f" ({reason})" if reason else ""))
            self._fail(self._failure)
            return
        if self._state == _HEAD and self._received > MAX_HEAD_BYTES:
            self._fail(self._bad(f"a reply head over {MAX_HEAD_BYTES} bytes"))
        elif self._stream_buffer is None and self._received > self.pool.max_response + MAX_HEAD_BYTES:  # framing
            self._fail(self._too_large(self._received))
        elif self._state == _SIZED:
            self._parser = None  # the rest of the body is read straight into its buffer
            if self._view is None:
                self._start_buffer()

    # --- httptools' side -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._state == _DONE:
            raise _Stop  # bytes after the reply: this connection's framing cannot be trusted

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state != _HEAD:
            return  # trailers: nothing reads them
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in self._fields:
            self._fields[key] += ", " + text
        else:
            self._fields[key] = text

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                self._failure = self._bad("a protocol switch (101)")
                raise _Stop
            self._interim = True  # 100 Continue and the like: the real reply follows
            self._fields = {}
            return
        self._status = status
        self._keep_alive = parser.should_keep_alive()
        fields = self._fields
        encoding = fields.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            self._failure = self._bad("a compressed reply (Content-Encoding) though asked for identity")
            raise _Stop
        length = fields.get("content-length")
        self._chunked = "transfer-encoding" in fields
        if self._stream_buffer is not None:  # the body goes to the reader as it comes, whatever its size
            self._state = _UNTIL_CLOSE if length is None and not self._chunked and not self._keep_alive \
                and status not in _NO_BODY_STATUSES else _PARSED
            if self._reply is not None and not self._reply.done():
                self._reply.set_result(HttpReply(status, ReplyHeaders(fields), b""))
            return
        if length is not None and not self._chunked and status not in _NO_BODY_STATUSES:
            self._length = int(length)  # llhttp checked it is digits
            if self._length > self.pool.max_response:
                self._failure = self._too_large(self._length)
                raise _Stop
            self._state = _SIZED
        elif self._chunked or status in _NO_BODY_STATUSES:
            self._state = _PARSED
        elif self._keep_alive:  # neither length nor chunks yet kept alive: no body
            self._state = _PARSED
        else:
            self._state = _UNTIL_CLOSE

    def on_body(self, body: bytes) -> None:
        if self._stream_buffer is not None:
            self._pieces.append(body)
            self._buffered += len(body)
            self._wake_reader()
            if self._buffered >= self._stream_buffer and not self._reading_paused and self.transport is not None:
                self._reading_paused = True
                self.transport.pause_reading()  # the consumer is behind: the server waits (TCP flow control)
            return
        if self._state == _SIZED:
            if self._view is None and self._filled == 0 and len(body) == self._length:
                self._body = body  # the whole body in one read: kept as it came
                self._filled = len(body)
                return
            if self._view is None:
                self._start_buffer()
            assert self._view is not None
            self._view[self._filled:self._filled + len(body)] = body
            self._filled += len(body)
            return
        body_buffer = self._body
        assert isinstance(body_buffer, bytearray)
        if len(body_buffer) + len(body) > self.pool.max_response:
            self._failure = self._too_large(len(body_buffer) + len(body))
            raise _Stop
        body_buffer += body

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._view is not None:
            self._view.release()
            self._view = None
        self._complete()

    # --- one exchange --------------------------------------------------------------

    async def exchange(self, head: bytes, parts: list[Body], size: int,
                       stream_buffer: int | None = None) -> HttpReply:
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        self._reply = reply = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._state = _HEAD
        self._received = self._filled = 0
        self._fields = {}
        self._length = None
        self._interim = self._chunked = self._sent_all = self.reusable = False
        self._body = bytearray()
        self._failure = None
        self._stream_buffer = stream_buffer
        self._pieces.clear()
        self._buffered = 0
        self._ended = self._reading_paused = False
        if size <= _WRITE_PIECE_BYTES:
            transport.write(head + b"".join(parts) if len(parts) > 1 else head + parts[0] if parts else head)
        else:
            transport.write(head)
            for part in parts:
                view = memoryview(part)
                for start in range(0, len(view), _WRITE_PIECE_BYTES):
                    if reply.done():
                        break  # answered (or lost) before the request was written: the rest is moot
                    transport.write(view[start:start + _WRITE_PIECE_BYTES])
                    if self._paused:
                        await self._writable()
        self._sent_all = not reply.done()
        result = await reply
        # Not after a 5xx: some servers close the connection after an error
        # without saying so (uvicorn, under KServe, after a model's
        # exception), and a request written before the close is seen resets.
        self.reusable = self._keep_alive and self._sent_all and self.pool.keepalive and result.status < 500
        return result

    async def _writable(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await self._drained
        finally:
            self._drained = None

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _start_buffer(self) -> None:
        """The body's final buffer, of the declared length."""
        assert self._length is not None
        buffer = bytearray(self._length)
        self._body = buffer
        self._view = memoryview(buffer)
        self._filled = 0

    # --- a streamed body -------------------------------------------------------------

    def _streaming_body(self) -> bool:
        """Whether a streamed reply's head has gone to its reader and its body is still coming."""
        return self._stream_buffer is not None and self._reply is not None and self._reply.done() and not self._ended

    async def read_piece(self) -> bytes | None:
        while not self._pieces:
            if self._ended:
                if self._failure is not None:
                    raise self._failure
                return None
            self._readable = asyncio.get_running_loop().create_future()
            try:
                await self._readable
            finally:
                self._readable = None
        piece = self._pieces.popleft()
        self._buffered -= len(piece)
        if self._reading_paused and self._buffered < (self._stream_buffer or 0) // 2 and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return piece

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)

    def stream_complete(self) -> bool:
        """Whether a streamed body was read to its end without failure."""
        return self._ended and self._failure is None and not self._pieces

    def _complete(self) -> None:
        if self._stream_buffer is not None:
            self._ended = True
            self._wake_reader()
        self._state = _DONE
        self._parser = None
        self._wake_writer()  # answered before the request was all written: stop writing it
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(HttpReply(self._status, ReplyHeaders(self._fields), self._body))
        self._body = b""
        self._fields = {}

    def _too_large(self, size: int) -> GatewayError:
        return too_large_reply(self.pool.label, size, self.pool.max_response, self.pool.limit_name)

    def _bad(self, what: str) -> GatewayError:
        return GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream {self.pool.label} sent {what}")

    def _fail(self, error: GatewayError) -> None:
        if self._stream_buffer is not None and self._reply is not None and self._reply.done():
            self._failure = self._failure or error
            self._ended = True  # what was buffered is read first, then the error
            self._wake_reader()
        self._state = _DONE
        self._parser = None
        self._wake_writer()
        if self._view is not None:
            self._view.release()
            self._view = None
        self._body = b""
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(error)
        self.abort()

    def forget_outcome(self) -> None:
        """Mark a failed reply's exception as seen (the caller was cancelled
        before it could read it), so asyncio does not log it."""
        if self._reply is not None and self._reply.done() and not self._reply.cancelled():
            self._reply.exception()

    # --- the pool's side -----------------------------------------------------------

    def usable_after_idle(self, idle_timeout: float) -> bool:
        """Whether this idle connection can carry a request: open, not idle
        too long, and not readable (an idle connection has nothing to say
        but EOF: the server closed it and the loop has not seen it yet)."""
        if not self.is_open:
            return False
        if asyncio.get_running_loop().time() - self.idle_since >= idle_timeout:
            return False
        return not (self._poll is not None and self._poll.poll(0))

    @property
    def is_open(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # also when closing gracefully already: now

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
