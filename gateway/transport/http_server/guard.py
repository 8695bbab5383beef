"""One HTTP listener's connections, both servers' (gateway/transport/http_server/fast.py and
the aiohttp app): counted, idle ones evicted, refusals logged."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from gateway.core.errors import GatewayError
from gateway.transport.acceptor import RefusalLog

# An error in the listener's protocol form, for its aiohttp app (the fast path renders its own).
Render = Callable[[GatewayError, "int | None"], web.StreamResponse]

log = logging.getLogger(__name__)


class GuardedConnection(Protocol):
    """What the guard needs of a connection: the fast path's FastConnection
    and the aiohttp app's request handler both are one."""

    over_limit: bool  # admitted past limits.max_connections: its first request is refused
    counted: bool  # among the guard's connections until closed

    @property
    def idle(self) -> bool:
        """Waiting for its next request head (or still in its TLS handshake)."""

    @property
    def peername(self) -> object: ...

    def evict(self) -> None:
        """Close it now (it is idle)."""


class ListenerGuard:
    """Counts one HTTP listener's connections (its requests in flight are
    the request cycle's: gateway/transport/cycle.py).

    A connection accepted at ``max_connections``
    makes room by closing the connection idle the longest (waiting for its
    next request head, or still in its TLS handshake), as nginx does. Only
    when none is idle is it over the limit: it gets the OVERLOADED answer to
    its first request and is closed; past twice the limit it is closed at
    once, so a flood costs no more than a socket. Refusals are logged,
    rate-limited (``refusals``).
    """

    def __init__(self, listener: str, max_connections: int, max_body: int, render: Render) -> None:
        self.max_connections = max_connections
        self.max_body = max_body  # a declared body over it is refused before `100 Continue`
        self.render = render
        self.connections = 0  # accepted and not closed yet
        self.refusals = RefusalLog(listener)
        # Connections between requests, in the order they got there (oldest first).
        self._waiting: dict[GuardedConnection, None] = {}  # aiohttp handlers and fast connections

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

    def opened(self, handler: GuardedConnection, over_limit: bool) -> None:
        """An admitted connection has its handler (it is not connected yet)."""
        handler.over_limit = over_limit
        handler.counted = True
        self._waiting[handler] = None

    def closed(self, handler: GuardedConnection) -> None:
        """A connection is gone."""
        if handler.counted:
            handler.counted = False
            self.connections -= 1
            self._waiting.pop(handler, None)

    def request_started(self, handler: GuardedConnection) -> None:
        self._waiting.pop(handler, None)

    def request_finished(self, handler: GuardedConnection) -> None:
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

    def replace(self, old: GuardedConnection, new: GuardedConnection) -> None:
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

