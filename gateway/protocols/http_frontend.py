"""HttpFrontend: what every HTTP protocol's listener is: one port, the
fast path first (gateway/transport/http_server/fast.py), the aiohttp app behind it
(gateway/transport/http_server/aiohttp_app.py), one guard and one set of handlers for both."""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.core.errors import ErrorKind, GatewayError
from gateway.protocols.base import Frontend
from gateway.runtime.auth import Authenticator
from gateway.runtime.budget import Reservation
from gateway.runtime.tls import ServerTls
from gateway.transport.cycle import Refusals, RequestCycle
from gateway.transport.http_server.aiohttp_app import (
    RESERVATION,
    _GuardedServer,
    _GuardedSite,
    _reply_headers,
    access_logger_class,
    aiohttp_reply,
    cycle_middleware,
    read_body,
    request_context,
)
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest
from gateway.transport.http_server.fast import LINGERING_TIME, FastListener, FastRoute, FastRoutes, route
from gateway.transport.http_server.guard import ListenerGuard

log = logging.getLogger(__name__)


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

    def handlers(self) -> list[tuple[str, str, Handler]]:
        """The protocol's hot requests, (method, path, handler), written once
        for both servers: the fast path serves them (gateway/transport/http_server/fast.py)
        and :meth:`add_routes` routes them in the aiohttp app, which serves
        them on connections the fast path handed over."""
        return []

    def fast_routes(self) -> list[FastRoute]:
        return [route(method, path, handler) for method, path, handler in self.handlers()]

    def add_routes(self, app: web.Application) -> None:
        """Route :meth:`handlers` in the aiohttp app; GET routes answer HEAD
        too, as aiohttp's own ``add_get`` does."""
        for method, path, handler in self.handlers():
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
            guard = self._guard = ListenerGuard(self.listener.name, limits.max_connections, self.max_body,
                                                self.render_error)
        return guard

    @property
    def cycle(self) -> RequestCycle:
        """The listener's request cycle, driven by both its servers."""
        cycle = getattr(self, "_cycle", None)
        if cycle is None:
            cycle = self._cycle = RequestCycle(self.listener.name, self.listener.protocol, self.services,
                                               self.services.config.limits.max_concurrent_requests, self.probe_paths,
                                               self.listener.server_timing)
            cycle.passes = (web.HTTPException,)
        return cycle

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

    def new_app(self, middlewares: list[Middleware]) -> web.Application:
        # aiohttp's own 1 MiB default is far too small for tensors; the body
        # limit is applied deliberately, one byte over so our check answers.
        cycle = self.cycle
        if self.listener.auth is not None:  # tokens are read here, when the listener starts
            cycle.credentials = self._authenticator = Authenticator(self.listener.auth)
        form = Refusals(self.render_error, _response_headers, self._challenge)
        first = cycle_middleware(cycle, form, self.guard, lambda: self.dataplane.draining)
        return web.Application(client_max_size=self.max_body + 1, middlewares=[first, *middlewares])

    def _challenge(self) -> str:
        """What a 401 says of the credentials it wants (WWW-Authenticate)."""
        return self._authenticator.challenge if self._authenticator is not None else ""

    async def start(self) -> None:
        # auto_decompress off: read_body inflates under the size limit itself.
        # The access-log hook records metrics and the access log of every request.
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
                                     lingering_time=min(LINGERING_TIME, limits.body_timeout),
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
        fixed = [r.canonical for r in self._runner.app.router.resources() if isinstance(r, web.PlainResource)]
        routes = FastRoutes(self.fast_routes(), fixed) if self.listener.fast_path else FastRoutes(())
        self._fast = FastListener(
            self.listener.name, self.listener.protocol, self.services, routes, self.guard, self.error_reply,
            handoff=factory, cycle=self.cycle,
            draining=lambda: self.dataplane.draining, max_body=self.max_body,
            status_kinds=self.status_kinds) if routes else None
        factory.install(self.guard, self._fast)
        address = self.listener.address
        # SO_REUSEPORT only under `gateway serve --workers N` (services.reuse_port).
        self._tls = ServerTls(self.listener.tls) if self.listener.tls is not None else None
        site = _GuardedSite(self._runner, address.host, address.port, reuse_port=self.services.reuse_port,
                            ssl_context=self._tls.ssl_context if self._tls is not None else None)
        await site.start()
        for bound in self._runner.addresses:  # (host, port[, flowinfo, scope_id]) of an IP socket
            if isinstance(bound, tuple):
                self._port = bound[1]
                break
        log.info("listener %s (%s) on %s:%d%s", self.listener.name, self.listener.protocol, address.host,
                 self._port, " (TLS)" if self._tls is not None else "")

    async def stop(self, grace: float) -> None:
        if self._runner is not None:
            # aiohttp waits this long for in-flight handlers after closing the
            # socket; it takes it only from the runner's constructor (no public
            # setter), and the grace is known only now.
            self._runner._shutdown_timeout = grace
            closing = [self._runner.shutdown()]
            if self._fast is not None:  # its connections (aiohttp closes those handed over)
                closing.append(self._fast.shutdown(grace))
            await asyncio.gather(*closing)
            await self._runner.cleanup()
            self._runner = None


def _response_headers(response: web.StreamResponse) -> MutableMapping[str, str]:
    return response.headers


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
