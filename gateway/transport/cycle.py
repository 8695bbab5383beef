"""The request cycle: the steps every request of a listener goes through,
whichever server read it — the fast HTTP path, the aiohttp app behind it,
gRPC unary calls and each request of a gRPC stream. The servers are
adapters: they read a request, hand the cycle its context, run the
protocol's handler inside :meth:`RequestCycle.run`, and write what comes
back; the steps themselves are written here once.

    begin      the context's record (operation, method, path, peer), the
               trace span, the in-flight gauge
    admission  an over-limit connection, credentials (probes exempt), the
               listener's concurrency limit (probes exempt); refused at
               once, never queued
    handler    the protocol's (decode, data plane with the route's filter
               chain — gateway/dataplane/filters/ —, encode)
    errors     every GatewayError and every bug answered in the protocol's
               own form (``Form``), Retry-After where the wire has it
    cancelled  the client went away: nginx's 499, at the access log's level
    finish     metrics, statistics, access log, trace (core/record.py)

The memory reservation a request holds is its server's (each reads bodies
its own way) and is given back on every path by the adapter's ``finally``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Generic, Protocol, TypeVar

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import OUTCOME_CANCELLED, SERVER_TIMING_HEADER, echo_ids, finish_request, server_timing
from gateway.core.types import RequestContext
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)

UNAUTHORIZED_STATUS = 401


class Form(Protocol[A_co]):
    """A protocol's answer to a refused or failed request, in its own form
    (an HTTP reply with Retry-After / WWW-Authenticate; a gRPC status)."""

    def refusal(self, error: GatewayError, status: int | None) -> A_co: ...


class Credentials(Protocol):
    """What the cycle asks of a listener's token checker (runtime/auth.py)."""

    def check(self, headers: Mapping[str, str]) -> None: ...


class RequestCycle:
    """One listener's request cycle; its servers drive it (see the module)."""

    def __init__(self, listener: str, protocol: str, services: GatewayServices, max_requests: int,
                 probes: frozenset[str] = frozenset(), server_timing: bool = False) -> None:
        self.listener = listener
        self.protocol = protocol
        self.services = services
        self.max_requests = max_requests  # limits.max_concurrent_requests
        self.probes = probes  # answered without credentials, and even past the limit
        self.server_timing = server_timing  # the listener's `server_timing`: answers say the gateway's time
        self.requests = 0  # in flight, probes not counted
        self.credentials: Credentials | None = None  # set when the listener starts, if it has `auth`
        # Exceptions a server answers itself (aiohttp's routing errors: its
        # protocol's error middleware renders them), never turned into a 500 here.
        self.passes: tuple[type[BaseException], ...] = ()
        self._in_flight = services.metrics.requests_in_flight(listener, protocol)

    # --- begin and end ---------------------------------------------------------

    def begin(self, ctx: RequestContext, operation: str, method: str, path: str, peer: str) -> None:
        record = ctx.record
        record.operation, record.method, record.path, record.peer = operation, method, path, peer
        tracing = self.services.tracing
        if tracing is not None:
            tracing.start(ctx)
        self._in_flight.inc()

    def stamp(self, headers: MutableMapping[str, str], ctx: RequestContext) -> None:
        """What every HTTP answer carries, put on its ``headers`` as it is
        about to be written: the request's ids and, when the listener asks
        for it, its Server-Timing up to now."""
        echo_ids(headers, ctx)
        if self.server_timing:
            headers[SERVER_TIMING_HEADER] = server_timing(ctx)

    def trailers(self, ctx: RequestContext) -> tuple[tuple[str, str], ...]:
        """A gRPC call's trailing metadata, as :meth:`stamp` for HTTP."""
        trailers = tuple(ctx.upstream_headers().items())
        if self.server_timing:
            trailers += ((SERVER_TIMING_HEADER, server_timing(ctx)),)
        return trailers

    def end(self) -> None:
        """The request's handling is over (its answer may still be being written)."""
        self._in_flight.dec()

    def cancelled(self, ctx: RequestContext, status: str, received: int) -> None:
        """The client went away before its answer was sent."""
        record = ctx.record
        if record.finished:
            return
        record.status, record.outcome = status, OUTCOME_CANCELLED
        record.request_bytes = received
        finish_request(self.services, ctx)

    def finish(self, ctx: RequestContext) -> None:
        """The answer has left (``record.status`` and sizes set): metrics,
        statistics, access log, trace; once."""
        finish_request(self.services, ctx)

    # --- admission, handler, errors ---------------------------------------------

    def busy_message(self) -> str:
        return (f"the listener is handling {self.requests} requests, its limit (limits.max_concurrent_requests); "
                "retry later")

    def admission(self, ctx: RequestContext, probe: bool) -> tuple[GatewayError, int | None] | None:
        """Why the request is refused before its handler runs (with the
        HTTP status that says it), or None."""
        if probe:
            return None
        if self.credentials is not None:
            try:
                self.credentials.check(ctx.headers)
            except GatewayError as error:
                return error, UNAUTHORIZED_STATUS
        busy = self.over_limit()
        return (busy, None) if busy is not None else None

    def over_limit(self) -> GatewayError | None:
        """OVERLOADED when one more request would pass the listener's limit."""
        if self.requests >= self.max_requests:
            return GatewayError(ErrorKind.OVERLOADED, self.busy_message())
        return None

    async def run(self, ctx: RequestContext, probe: bool, handler: Callable[[], Awaitable[A]], form: Form[A]) -> A:
        """Admission, then ``handler()``; a refusal or failure in the
        protocol's form. A cancellation goes through (the adapter records it)."""
        refused = self.admission(ctx, probe)
        if refused is not None:
            return self.refuse(ctx, refused[0], refused[1], form)
        if probe:
            return await self._guarded(ctx, handler, form)
        self.requests += 1
        try:
            return await self._guarded(ctx, handler, form)
        finally:
            self.requests -= 1

    async def _guarded(self, ctx: RequestContext, handler: Callable[[], Awaitable[A]], form: Form[A]) -> A:
        try:
            return await handler()
        except GatewayError as error:
            return self.refuse(ctx, error, getattr(error, "http_status", None), form)
        except self.passes:
            raise
        except Exception:
            log.exception("unhandled error on %s %s (listener %s)", ctx.record.method, ctx.record.path,
                          self.listener)
            return self.refuse(ctx, GatewayError(ErrorKind.INTERNAL, "internal error"), None, form)

    @staticmethod
    def refuse(ctx: RequestContext, error: GatewayError, status: int | None, form: Form[A]) -> A:
        """``error`` noted on the record and answered in the protocol's form."""
        ctx.record.fail(error.kind.value, error.message)
        return form.refusal(error, status)


class Refusals(Generic[A]):
    """A Form from a protocol's error renderer: ``render(error, status)``,
    then what HTTP says beside it (Retry-After; the challenge of a 401)."""

    __slots__ = ("_challenge", "_headers", "_render")

    def __init__(self, render: Callable[[GatewayError, int | None], A],
                 headers: Callable[[A], MutableMapping[str, str]], challenge: Callable[[], str] = lambda: "") -> None:
        self._render = render
        self._headers = headers  # the answer's header mapping
        self._challenge = challenge

    def refusal(self, error: GatewayError, status: int | None) -> A:
        answer = self._render(error, status)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            self._headers(answer)["Retry-After"] = str(retry_after)
        if status == UNAUTHORIZED_STATUS:
            challenge = self._challenge()
            if challenge:
                self._headers(answer)["WWW-Authenticate"] = challenge
        return answer


class StreamSlots:
    """A listener's open streams (SSE answers, gRPC streams), bounded by
    limits.max_open_streams: one more is refused at once, never queued."""

    __slots__ = ("_gauge", "limit", "open")

    def __init__(self, listener: str, protocol: str, services: GatewayServices) -> None:
        self.limit = services.config.limits.max_open_streams
        self.open = 0
        self._gauge = services.metrics.streams_open(listener, protocol)

    def take(self) -> None:
        """One more open stream (give it back with :meth:`give_back`), or OVERLOADED."""
        if self.open >= self.limit:
            raise GatewayError(ErrorKind.OVERLOADED, f"the listener has {self.limit} open streams, its limit "
                               "(limits.max_open_streams); retry later")
        self.open += 1
        self._gauge.inc()

    def give_back(self) -> None:
        self.open -= 1
        self._gauge.dec()
