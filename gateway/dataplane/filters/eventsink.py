"""CloudEvents to an HTTP sink, sent off the request path.

A request only appends an event to a bounded queue (:meth:`EventSink.offer`,
never awaited); a few sender tasks, each holding one keep-alive HTTP/1.1
connection to the sink, take events from it and POST them in CloudEvents'
binary content mode (the attributes as ``ce-`` headers, the data as the
body). What the queue holds is bounded by events and by bytes, and each
event's bytes are charged to the worker's memory budget until it is sent or
dropped. A full queue, a refused charge or a closing sink drops the event;
a sink that refuses, errs or does not answer within the timeout fails it;
both are counted, neither reaches a client.

HTTP is written here over asyncio streams: the data plane imports no
transport, and a sink needs only POST with a small answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

from gateway.core.errors import GatewayError
from gateway.runtime.budget import InflightBudget, Reservation

log = logging.getLogger(__name__)

SENT, DROPPED, FAILED = "sent", "dropped", "failed"  # gateway_payload_log_total{result}
# What an event costs beyond its body while queued: its tuple, strings and reservation.
EVENT_OVERHEAD = 512
# An answer from the sink is read to its end (so the connection can be kept)
# up to this size; a longer one closes the connection.
MAX_ANSWER_BYTES = 1 << 20
MAX_ANSWER_HEAD = 64 << 10
# After a failed send a sender waits before its next try, doubling up to the
# maximum, so a dead sink costs a connect attempt per pause, not per event.
FIRST_PAUSE, MAX_PAUSE = 0.05, 1.0
# CloudEvents' HTTP binding (3.1.3.2): printable ASCII except space, '"' and '%' go as they are.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ' "%')
_NEEDS_QUOTING = re.compile(r'[^\x21\x23\x24\x26-\x7e]')


@dataclass(frozen=True, slots=True)
class SinkAddress:
    """Where events go: from an ``http://`` or ``https://`` URL."""

    tls: bool
    host: str
    port: int
    target: str  # path and query, for the request line

    @classmethod
    def parse(cls, url: str) -> SinkAddress:
        """ValueError with the reason when ``url`` is no http(s) URL of a host."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("names no host")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials (use headers)")
        port = parts.port or (443 if parts.scheme == "https" else 80)  # ValueError on a bad port
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme == "https", parts.hostname, port, target)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.tls else 80) else f"{host}:{self.port}"


def header_value(value: str) -> str:
    """An attribute value as a ``ce-`` header carries it (percent-encoded)."""
    return quote(value, safe=_HEADER_SAFE) if _NEEDS_QUOTING.search(value) else value


class Event:
    """One queued CloudEvent: its ``ce-`` headers already written (the
    request path's part), its time and body, and the budget it holds."""

    __slots__ = ("body", "ce_headers", "held", "size", "time")

    def __init__(self, ce_headers: str, body: bytes, when: float) -> None:
        self.ce_headers = ce_headers  # "ce-x: v\r\n" lines, ce-time excepted
        self.body = body
        self.time = when  # time.time() at the event
        self.size = len(body) + len(ce_headers) + EVENT_OVERHEAD
        self.held: Reservation | None = None


class EventSink:
    """One sink's queue and senders (one set per payload_log policy)."""

    def __init__(self, address: SinkAddress, extra_headers: tuple[tuple[str, str], ...], timeout: float,
                 connections: int, max_queue: int, max_queue_bytes: int, budget: InflightBudget,
                 count: Callable[[str, int], None]) -> None:
        self.address = address
        self.timeout = timeout
        self.connections = connections
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.queued_bytes = 0
        self._budget = budget
        self._count = count  # count(result, n): gateway_payload_log_total
        self._fixed_head = (f"Host: {address.authority}\r\nContent-Type: application/json\r\n"
                            + "".join(f"{name}: {value}\r\n" for name, value in extra_headers))
        self._events: deque[Event] = deque()
        self._ready = asyncio.Event()
        self._senders: list[asyncio.Task[None]] = []
        self._closed = False

    def has_room(self) -> bool:
        """Whether an event may be queued now (else it is counted as
        dropped): asked before the event is written, so a full queue costs
        a request nothing more."""
        if len(self._events) < self.max_queue and not self._closed:
            return True
        self._count(DROPPED, 1)
        return False

    def drop(self) -> None:
        """An event that could not be written: counted as dropped."""
        self._count(DROPPED, 1)

    def offer(self, event: Event) -> None:
        """Queue ``event`` or drop it (counted); never waits, never raises."""
        if self._closed or len(self._events) >= self.max_queue \
                or self.queued_bytes + event.size > self.max_queue_bytes:
            self._count(DROPPED, 1)
            return
        held = self._budget.reserve()
        try:
            held.grow(event.size)
        except GatewayError:  # the worker's memory budget is spent: requests come first
            self._count(DROPPED, 1)
            return
        event.held = held
        self.queued_bytes += event.size
        self._events.append(event)
        if not self._senders:
            self._senders = [asyncio.get_running_loop().create_task(self._send_all(), name="payload-log sender")
                             for _ in range(self.connections)]
        self._ready.set()

    def _take(self) -> Event | None:
        """The next event; it holds its charge until :meth:`_done`."""
        if not self._events:
            return None
        event = self._events.popleft()
        self.queued_bytes -= event.size
        return event

    @staticmethod
    def _done(event: Event) -> None:
        if event.held is not None:
            event.held.release()

    async def _send_all(self) -> None:
        """One sender: its own connection, events in queue order."""
        connection: _Connection | None = None
        pause = 0.0
        try:
            while True:
                event = self._take()
                if event is None:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                if connection is None:
                    connection = _Connection(self.address)
                try:
                    async with asyncio.timeout(self.timeout):
                        status = await connection.post(self._head(event), event.body)
                except asyncio.CancelledError:  # the sink closes: this event goes unsent
                    self._count(DROPPED, 1)
                    raise
                except Exception as exc:  # refused, reset, timed out, garbled: this event failed
                    connection.close()
                    connection = None
                    self._count(FAILED, 1)
                    pause = min(max(pause * 2, FIRST_PAUSE), MAX_PAUSE)
                    log.debug("payload log: an event to the sink failed: %s", type(exc).__name__)
                    await asyncio.sleep(pause)
                    continue
                finally:
                    self._done(event)
                if connection.spent:
                    connection.close()
                    connection = None
                if 200 <= status < 300:
                    self._count(SENT, 1)
                    pause = 0.0
                else:
                    self._count(FAILED, 1)
                    log.debug("payload log: the sink answered %d", status)
        finally:
            if connection is not None:
                connection.close()

    def _head(self, event: Event) -> bytes:
        when = datetime.fromtimestamp(event.time, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        return (f"POST {self.address.target} HTTP/1.1\r\n{self._fixed_head}Content-Length: {len(event.body)}\r\n"
                f"{event.ce_headers}ce-time: {when}\r\n\r\n").encode("latin-1")

    async def close(self) -> None:
        """Stop the senders; what is still queued is dropped (counted)."""
        self._closed = True
        for task in self._senders:
            task.cancel()
        for task in self._senders:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._senders = []
        dropped = 0
        while (event := self._take()) is not None:
            self._done(event)
            dropped += 1
        if dropped:
            self._count(DROPPED, dropped)


class _Connection:
    """One keep-alive HTTP/1.1 connection to the sink, opened on first use."""

    def __init__(self, address: SinkAddress) -> None:
        self.address = address
        self.spent = False  # the sink closes it after this answer
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, head: bytes, body: bytes) -> int:
        """Send one request and read its answer; the status."""
        if self._writer is None:
            context = ssl.create_default_context() if self.address.tls else None
            self._reader, self._writer = await asyncio.open_connection(
                self.address.host, self.address.port, ssl=context, limit=MAX_ANSWER_HEAD)
        assert self._reader is not None
        self._writer.writelines((head, body))
        await self._writer.drain()
        return await self._answer(self._reader)

    async def _answer(self, reader: asyncio.StreamReader) -> int:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError("not an HTTP/1 answer")
        status = int(parts[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        self.spent = fields.get("connection") == "close" or parts[0] == "HTTP/1.0"
        if status in (204, 304) or 100 <= status < 200:
            return status
        if "chunked" in fields.get("transfer-encoding", ""):
            await _skip_chunks(reader)
        elif "content-length" in fields:
            length = int(fields["content-length"])
            if length > MAX_ANSWER_BYTES:
                self.spent = True
            else:
                await reader.readexactly(length)
        else:  # the answer ends with the connection
            self.spent = True
        return status

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


async def _skip_chunks(reader: asyncio.StreamReader) -> None:
    total = 0
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        total += size
        if total > MAX_ANSWER_BYTES:
            raise ValueError("the sink's answer is too long")
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailer fields
                pass
            return
        await reader.readexactly(size + 2)
