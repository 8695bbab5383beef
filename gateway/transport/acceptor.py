"""Accepting HTTP listeners' connections ourselves, so every refused one is seen.

The event loops' own accept paths cannot report refusals reliably: uvloop
(libuv) accepts and silently closes connections when the process is out of
file descriptors, and closes the listening socket for good if that fails;
asyncio logs a traceback per failed accept, unbounded. :class:`Acceptor`
accepts in a loop reader instead and hands each connection to the loop with
``connect_accepted_socket`` (the same transports, TLS included). Out of file
descriptors it pauses accepting (pending connections wait in the kernel's
backlog) after asking its :class:`Gate` to close an idle connection, as nginx
does; every refusal is counted in a :class:`RefusalLog`.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

log = logging.getLogger(__name__)

REFUSAL_LOG_INTERVAL = 10.0  # s: at most one line per listener this often
# After an accept failed for want of file descriptors: retry this soon when
# an idle connection was closed to free one, else after the longer pause.
_RETRY_AFTER_FREEING = 0.01
_RETRY_PAUSE = 0.5
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class RefusalLog:
    """Refused (or delayed) connections of one listener, logged as warnings
    at most once per ``interval``: the first at once, then the count of the
    rest by reason."""

    def __init__(self, listener: str, interval: float = REFUSAL_LOG_INTERVAL) -> None:
        self.listener = listener
        self.interval = interval
        self._counts: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # loop time the counts run from

    def refused(self, reason: str) -> None:
        if self._timer is None:  # the first after a quiet interval
            log.warning("listener %s: refused or delayed a connection: %s (more are counted and logged every %gs)",
                        self.listener, reason, self.interval)
            self._schedule()
        else:
            self._counts[reason] += 1

    def _tick(self) -> None:
        self._timer = None
        if self._counts:  # else quiet: the next refusal is logged at once
            self._report()
            self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        self._timer = loop.call_later(self.interval, self._tick)

    def _report(self) -> None:
        count = sum(self._counts.values())
        reasons = "; ".join(f"{n} {reason}" for reason, n in self._counts.most_common())
        elapsed = asyncio.get_running_loop().time() - self._since
        log.warning("listener %s: refused or delayed %d more connection%s in the last %.0fs: %s", self.listener,
                    count, "" if count == 1 else "s", elapsed, reasons)
        self._counts.clear()

    def close(self) -> None:
        """Log what is still counted (the listener stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counts:
            self._report()


class Gate(Protocol):
    """What an :class:`Acceptor` asks its listener about each connection."""

    def admit(self) -> asyncio.BaseProtocol | None:
        """A connection was accepted: its protocol, or None to close it at
        once (the gate logs why)."""

    def connecting(self, protocol: asyncio.BaseProtocol, task: asyncio.Task[None]) -> None:
        """``task`` connects ``protocol`` (TLS handshake included); cancelling
        it closes the connection."""

    def failed(self, protocol: asyncio.BaseProtocol) -> None:
        """An admitted connection closed before its protocol was connected
        (a failed TLS handshake, or cancelled)."""

    def free_idle(self) -> bool:
        """Out of file descriptors: close an idle connection; True if one was."""


async def bind(host: str, port: int, reuse_port: bool, backlog: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to, set up as
    asyncio's ``create_server`` does (SO_REUSEADDR, IPv6-only IPv6 sockets)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address {address!r}: "
                                         f"{exc.strerror}") from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Acceptor(asyncio.AbstractServer):
    """Accepts connections on listening sockets and connects each to a
    protocol from ``gate`` (plain or TLS); stands in for the asyncio Server
    of aiohttp's sites."""

    def __init__(self, sockets: Iterable[socket.socket], gate: Gate, refusals: RefusalLog,
                 ssl_context: ssl.SSLContext | None, backlog: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._sockets = list(sockets)
        self._gate = gate
        self._refusals = refusals
        self._ssl = ssl_context
        self._batch = max(1, backlog)  # accepts per wake-up, as asyncio's own server
        self._connecting: set[asyncio.Task[None]] = set()
        self._paused: asyncio.TimerHandle | None = None
        self._serving = False
        self._closed = asyncio.Event()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    def start(self) -> None:
        self._serving = True
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting; connections still in their TLS handshake are
        closed (the others are the web server's to close)."""
        if not self._serving:
            return
        self._serving = False
        self._stop_reading()
        if self._paused is not None:
            self._paused.cancel()
        for sock in self._sockets:
            sock.close()
        for task in list(self._connecting):
            task.cancel()
        self._refusals.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        if self._connecting:
            await asyncio.wait(self._connecting)

    async def start_serving(self) -> None:
        if not self._serving:
            self.start()

    async def serve_forever(self) -> None:
        """Accept until :meth:`close` (asyncio's Server contract)."""
        if not self._serving:
            self.start()
        await self._closed.wait()

    def _stop_reading(self) -> None:
        for sock in self._sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())

    def _resume(self) -> None:
        self._paused = None
        if self._serving:
            self.start()

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the backlog
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                if exc.errno in _OUT_OF_RESOURCES:
                    self._out_of_resources(name)
                    return
                # Linux reports a pending connection's network error here: that one is lost.
                self._refusals.refused(f"accept failed ({name})")
                continue
            # The protocol is made now, so that the connection can be closed
            # to make room before its task has even started.
            protocol = self._gate.admit()
            if protocol is None:
                conn.close()
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn, protocol))
            self._connecting.add(task)
            task.add_done_callback(functools.partial(self._connected, conn, protocol))
            self._gate.connecting(protocol, task)

    def _out_of_resources(self, name: str) -> None:
        freed = self._gate.free_idle()
        then = "closed an idle connection to retry" if freed else f"accepting paused for {_RETRY_PAUSE:g}s"
        self._refusals.refused(f"out of file descriptors or socket memory ({name}; see the open-file limit in "
                               f"docs/security.md): {then}")
        # Stop reading for a while: the listening sockets stay readable and
        # would spin the loop until a descriptor is free again.
        self._stop_reading()
        if self._paused is None:
            self._paused = self._loop.call_later(_RETRY_AFTER_FREEING if freed else _RETRY_PAUSE, self._resume)

    async def _connect(self, conn: socket.socket, protocol: asyncio.BaseProtocol) -> None:
        await self._loop.connect_accepted_socket(lambda: protocol, conn, ssl=self._ssl)

    def _connected(self, conn: socket.socket, protocol: asyncio.BaseProtocol, task: asyncio.Task[None]) -> None:
        self._connecting.discard(task)
        failure = "cancelled" if task.cancelled() else task.exception()
        if failure is None:
            return
        # Failed (a TLS handshake), or cancelled, even before it started: either way gone.
        conn.close()  # a no-op once a transport has closed it
        self._gate.failed(protocol)
        log.debug("a connection closed before it was set up: %r", failure)
