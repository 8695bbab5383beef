"""The Redis client a worker's filters share (the `redis:` section).

Our own small RESP2 client over one asyncio connection rather than
redis-py's: a filter makes one call per request, and what that call costs
on the loop is the point (docs/traffic-policy.md, "Rate limits", measures both).
One connection per worker, pipelined: calls are written as they come and
their replies, which Redis sends in order, settle the waiting futures in
order; no pool, no lock, no task per call.

Every call is bounded by ``timeout`` (the loop never waits longer, connecting
included) and fails with the one error type :class:`RedisUnavailable`, which
the filters handle by the section's ``on_error``. A lost connection is made
again on the next call, after a backoff (0.1 s doubling to 5 s) while the
server stays unreachable: meanwhile calls fail at once instead of waiting.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Sequence
from typing import Any, cast

from gateway.config.redis import RedisConfig

log = logging.getLogger("gateway.redis")

# Calls written and not yet answered, per connection: past it a call fails
# at once (a server that stopped reading must not grow our buffers).
MAX_PENDING = 4096
# A connection whose oldest call has waited this long with nothing read is
# dropped (a server hung, or a half-open TCP connection) and made again.
STALE_SECONDS = 2.0
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
# Connecting may take longer than one call's timeout: calls stop waiting
# for it at their timeout, the connection is still made for later calls.
MIN_CONNECT_SECONDS = 1.0
# The largest reply accepted (bulk string or array length): our scripts
# answer a few integers; anything bigger is a protocol error.
MAX_REPLY_ITEMS = 1 << 20
MAX_BULK_BYTES = 64 << 20

Arg = bytes | str | int | float


class RedisUnavailable(Exception):
    """Redis did not answer in time, refused the connection, is down, or
    answered with an error: the caller applies its on_error."""


class RedisReplyError(RedisUnavailable):
    """Redis answered with an error reply (``-ERR ...``)."""


class RedisScript:
    """A Lua script run by EVALSHA; loaded by the first call that finds
    it missing (NOSCRIPT) with one EVAL, which also caches it in Redis."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()


def encode_command(args: Sequence[Arg]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Incomplete(Exception):
    pass


def parse_reply(buffer: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from ``buffer[pos:]``: (value, position after it);
    an error reply is returned as a RedisReplyError. Raises _Incomplete
    when the buffer ends inside the reply, ValueError when it is malformed."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind, line = buffer[pos], bytes(buffer[pos + 1:end])
    pos = end + 2
    if kind == 0x3A:  # ':'
        return int(line), pos
    if kind == 0x2B:  # '+'
        return line, pos
    if kind == 0x2D:  # '-'
        return RedisReplyError(line.decode("utf-8", "replace")), pos
    if kind == 0x24:  # '$'
        size = int(line)
        if size < 0:
            return None, pos
        if size > MAX_BULK_BYTES:
            raise ValueError(f"a bulk reply of {size} bytes")
        if len(buffer) < pos + size + 2:
            raise _Incomplete
        return bytes(buffer[pos:pos + size]), pos + size + 2
    if kind == 0x2A:  # '*'
        count = int(line)
        if count < 0:
            return None, pos
        if count > MAX_REPLY_ITEMS:
            raise ValueError(f"an array reply of {count} items")
        items = []
        for _ in range(count):
            item, pos = parse_reply(buffer, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"unknown reply type {chr(kind)!r}")


class _Connection(asyncio.Protocol):
    """One connection: commands written in order, replies settling the
    pending futures in the same order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.buffer = bytearray()
        self.outgoing: list[bytes] = []  # commands of this loop pass, not yet written
        self.alive = False
        self.last_read = loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.alive = cast(asyncio.Transport, transport), True  # uvloop's is no subclass

    def send(self, command: bytes) -> asyncio.Future[Any]:
        if len(self.pending) >= MAX_PENDING:
            raise RedisUnavailable(f"{MAX_PENDING} calls already wait for Redis")
        future = self.loop.create_future()
        if not self.pending:
            self.last_read = self.loop.time()  # the wait for this reply starts now
        self.pending.append(future)
        if self.outgoing:
            self.outgoing.append(command)
        else:  # written once this loop pass is over: the calls it makes share one send
            self.outgoing = [command]
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        outgoing, self.outgoing = self.outgoing, []
        if self.alive and self.transport is not None:
            self.transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        buffer = self.buffer
        buffer += data
        pos = 0
        try:
            while pos < len(buffer) and self.pending:
                value, pos = parse_reply(buffer, pos)
                future = self.pending.popleft()
                if future.done():
                    continue  # its caller timed out; the reply only keeps the order
                if isinstance(value, RedisReplyError):
                    future.set_exception(value)
                else:
                    future.set_result(value)
        except _Incomplete:
            pass
        except ValueError as exc:  # not RESP: nothing after it can be trusted
            self.abort(f"a malformed reply ({exc})")
            return
        del buffer[:pos]
        if buffer and not self.pending:
            self.abort("a reply nobody asked for")

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self._fail_pending(RedisUnavailable("the connection to Redis was lost"))

    def abort(self, why: str) -> None:
        log.warning("dropping the connection to Redis: %s", why)
        self.alive = False
        if self.transport is not None:
            self.transport.abort()
        self._fail_pending(RedisUnavailable(f"the connection to Redis was dropped: {why}"))

    def _fail_pending(self, error: RedisUnavailable) -> None:
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(error)


def _expire(future: asyncio.Future[Any], timeout: float) -> None:
    if not future.done():
        future.set_exception(RedisUnavailable(f"Redis did not answer within {timeout * 1000:g} ms"))


class RedisClient:
    """One worker's client of the `redis:` server."""

    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        self.timeout = config.timeout
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._retry_at = 0.0  # no connection attempt before this loop time
        self._backoff = FIRST_BACKOFF
        self._closed = False

    async def call(self, *args: Arg) -> Any:
        """One command's reply; RedisUnavailable when there is none within the timeout."""
        return await self._send(encode_command(args))

    async def call_encoded(self, command: bytes) -> Any:
        """:meth:`call` for a command already encoded (:func:`encode_command`),
        so that a big value is framed off the loop."""
        return await self._send(command)

    async def evalsha(self, script: RedisScript, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """``script``'s result: one round trip, two the first time (NOSCRIPT, then EVAL)."""
        tail = [len(keys), *keys, *args]
        try:
            return await self._send(encode_command([b"EVALSHA", script.sha, *tail]))
        except RedisReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self._send(encode_command([b"EVAL", script.source, *tail]))

    async def _send(self, command: bytes) -> Any:
        loop = asyncio.get_running_loop()
        connection, wait = self._connection, self.timeout
        if connection is None or not connection.alive:
            started = loop.time()
            connection = await self._connect(loop)
            wait -= loop.time() - started  # connecting and the call share the one timeout
        future = connection.send(command)
        expiry = loop.call_later(wait, _expire, future, self.timeout)
        try:
            return await future
        except RedisUnavailable:
            if connection.alive and connection.pending and loop.time() - connection.last_read > STALE_SECONDS:
                connection.abort(f"no reply for {STALE_SECONDS:g} s")
            raise
        finally:
            expiry.cancel()

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        """The connection, made now if there is none (one attempt at a time,
        none before the backoff ends); waits at most the call's timeout."""
        if self._closed:
            raise RedisUnavailable("the Redis client is closed")
        if self._connecting is None:
            if loop.time() < self._retry_at:
                raise RedisUnavailable("Redis is unreachable (retrying shortly)")
            self._connecting = loop.create_task(self._open(loop))
        try:
            await asyncio.wait_for(asyncio.shield(self._connecting), self.timeout)
        except TimeoutError:
            raise RedisUnavailable(f"no connection to Redis within {self.timeout * 1000:g} ms") from None
        connection = self._connection
        if connection is None or not connection.alive:
            raise RedisUnavailable("Redis is unreachable")
        return connection

    async def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        host, port = self.config.host_port()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), host, port),
                max(self.timeout, MIN_CONNECT_SECONDS))
        except Exception as exc:  # refused, unreachable, timed out, a name that does not resolve
            log.warning("cannot connect to Redis at %s (%s); next attempt in %g s", self.config.address,
                        exc or type(exc).__name__, self._backoff)
            self._retry_at = loop.time() + self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF)
            return
        finally:
            self._connecting = None
        if self._closed:
            connection.abort("the client is closed")
            return
        self._connection, self._backoff = connection, FIRST_BACKOFF
        log.info("connected to Redis at %s", self.config.address)

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None


class RedisClients:
    """The worker's one Redis client, made when a filter first asks for it
    (a gateway whose policies need no Redis never connects)."""

    def __init__(self) -> None:
        self._client: RedisClient | None = None

    def client(self, config: RedisConfig) -> RedisClient:
        # `redis:` changes need a restart (gateway/app/server.py), so one config per process.
        if self._client is None or self._client.config != config:
            self._client = RedisClient(config)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
