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
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.core.errors import ErrorKind, GatewayError, connect_failure
from gateway.runtime.tls import HttpClientTls
from gateway.transport.http_client.connection import Body, Connection
from gateway.transport.http_client.reply import UpstreamReply
from gateway.transport.upstream import CONNECT_TIMEOUT, connect_error_words

if TYPE_CHECKING:
    from gateway.config.address import Address


# Idle pooled connections are dropped before common servers close them
# (uvicorn closes after 5 s): a request written onto a connection the
# server is closing is lost.
IDLE_KEEPALIVE_S = 4.0
# Reads before a body's length is known go through one scratch buffer per pool.
_READ_BUFFER_BYTES = 256 << 10
# Header names the transport writes itself; callers' values for them are dropped.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "accept-encoding"})


class HttpStream:
    """A reply whose body is read as it comes (:meth:`UpstreamHttp.stream`).
    ``close`` it when done: the connection goes back to the pool only when
    the whole body was read."""

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, pool: UpstreamHttp, conn: Connection, reply: UpstreamReply) -> None:
        self._pool = pool
        self._conn: Connection | None = conn
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
        self._idle: list[Connection] = []  # the most recently used last (taken first: warm)
        self._open = 0  # connections open or being opened
        self._all: set[Connection] = set()
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    # --- requests ----------------------------------------------------------------

    async def request(self, method: str, path: str, headers: Mapping[str, str] | None = None,
                      body: Body | Sequence[Body] | None = None) -> UpstreamReply:
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
            size = 0
        elif isinstance(body, (bytes, bytearray)):  # the usual body: one part, its length
            parts = [body]
            size = len(body)
        else:
            parts = [body] if isinstance(body, memoryview) else list(body)
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

    async def _acquire(self) -> Connection:
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

    async def _wait_for_connection(self) -> Connection | None:
        """Wait until a busy connection is handed over (or None: one closed,
        so a new one may be opened). The data plane's deadline cancels it."""
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
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

    async def _connect(self) -> Connection:
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn = await loop.create_connection(
                    lambda: Connection(self), self.endpoint.host, self.endpoint.port, ssl=self._ssl,
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

    def _release(self, conn: Connection, reusable: bool) -> None:
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

    def _discard(self, conn: Connection, graceful: bool = False) -> None:
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

    def lost_while_idle(self, conn: Connection) -> None:
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


