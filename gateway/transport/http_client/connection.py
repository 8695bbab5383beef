"""One keep-alive HTTP/1.1 connection to an upstream endpoint: an asyncio
BufferedProtocol reading replies with httptools into the pool's buffer,
bounded by the reply limit, failing with named GatewayErrors. The pool
(gateway/transport/http_client/pool.py) opens, reuses and closes them."""

from __future__ import annotations

import asyncio
import select
from collections import deque
from typing import Protocol, cast

import httptools

from gateway.core.errors import ErrorKind, GatewayError, connection_reset
from gateway.transport.http_client.reply import ReplyHeaders, UpstreamReply
from gateway.transport.upstream import too_large_reply

Body = bytes | bytearray | memoryview  # a request body, or a piece of one
# A reply's status line and headers; more is not an HTTP server's reply.
MAX_HEAD_BYTES = 64 << 10
# Bodies up to this size leave in one write with their head (one send, one
# segment); bigger ones are written in pieces of this size as the socket drains.
_WRITE_PIECE_BYTES = 64 << 10
_NO_BODY_STATUSES = (204, 304)


class ConnectionPool(Protocol):
    """What a connection asks of the pool that opened it
    (gateway/transport/http_client/pool.py: UpstreamHttp)."""

    label: str
    max_response: int
    limit_name: str  # the setting named when a reply is over max_response
    keepalive: bool
    read_buffer: memoryview

    def lost_while_idle(self, conn: Connection) -> None: ...


class _Stop(Exception):
    """Ends httptools' parse from inside a callback (the reason is kept aside)."""


# What a connection is reading.
_HEAD, _SIZED, _PARSED, _UNTIL_CLOSE, _DONE = range(5)


class Connection(asyncio.BufferedProtocol):
    """One connection: one exchange at a time, replies parsed by httptools.

    A body of declared length is read by the transport straight into its
    final buffer (``get_buffer``); chunked and close-delimited bodies go
    through the parser.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.reusable = False
        self._poll: select.poll | None = None
        self._reply: asyncio.Future[UpstreamReply] | None = None
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
                self._reply.set_result(UpstreamReply(status, ReplyHeaders(fields), b""))
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
                       stream_buffer: int | None = None) -> UpstreamReply:
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
            self._reply.set_result(UpstreamReply(self._status, ReplyHeaders(self._fields), self._body))
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
