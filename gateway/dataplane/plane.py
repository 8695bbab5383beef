"""The data plane: route a canonical request to a cluster and back.

Frontends call :class:`DataPlane`; it resolves the route, applies the
route's rewrite, picks the target upstream (split), starts mirrors, and runs
the attempts against the cluster under the route's timeout and retry policy.
Routes and clusters live in a :class:`Generation`; a reload swaps in a new
generation while requests that started on the old one finish there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from gateway.config.model import GatewayConfig, starvation_warnings
from gateway.config.routes import BatchingConfig
from gateway.core.addresses import without_addresses
from gateway.core.contracts import Backend, StreamedResponse
from gateway.core.errors import (
    CONNECT_FAILURE,
    CONNECTION_RESET,
    ErrorKind,
    GatewayError,
    connect_failure,
    connection_reset,
    invalid,
    model_not_found,
)
from gateway.core.modelnames import check_model
from gateway.core.record import RequestRecord
from gateway.core.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RequestContext,
    UpstreamAttempt,
)
from gateway.dataplane.affinity import SequencePins, SequenceStep, sequence_step
from gateway.dataplane.batching import Batcher, Member, batch_context, compatibility, share_facts
from gateway.dataplane.cluster.cluster import Backends, ClientFactory, Cluster, Lease
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.dataplane.filters import registry as filter_registry
from gateway.dataplane.filters.base import INFER, STREAM, Filter, FilterCall, FilterChain
from gateway.dataplane.priority import parameter_priority, request_priority
from gateway.dataplane.retry import PER_TRY_TIMEOUT, TIMEOUT, backoff_delay, error_chain, failure_reason
from gateway.dataplane.routing import NO_FRAMING_HEADERS, FramingHeaders, Route, RouteTable, shadow_warnings
from gateway.observability.counters import Counters, Event
from gateway.observability.metrics import metrics_hook, metrics_of
from gateway.observability.statistics import batch_size
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)
T = TypeVar("T")

# A mirror copy is bounded even when neither route nor upstream sets a timeout.
MIRROR_DEFAULT_TIMEOUT = 30.0

__all__ = ["Cluster", "DataPlane", "Generation", "select_outputs"]


class Generation:
    """One configuration's routes and clusters, and how many requests use them."""

    def __init__(self, config: GatewayConfig, routes: RouteTable, clusters: dict[str, Cluster],
                 filters: dict[str, Filter] | None = None) -> None:
        self.config = config
        self.routes = routes
        self.clusters = clusters
        self.filters = filters or {}  # by policy name
        # The filter chain of each route that lists policies, by route name.
        self.chains = {route.name: FilterChain(tuple(self.filters[name] for name in route.config.policies))
                       for route in routes.routes if route.config.policies}
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.batchers: dict[str, Batcher] = {}  # by route name, made on first use (gateway/dataplane/batching.py)

    @contextlib.contextmanager
    def use(self) -> Iterator[Generation]:
        self.enter()
        try:
            yield self
        finally:
            self.exit()

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


class DataPlane:
    def __init__(self, config: GatewayConfig, services: GatewayServices, counters: Counters | None = None, *,
                 backends: Backends | None = None, client_factory: ClientFactory | None = None,
                 framing_headers: FramingHeaders = NO_FRAMING_HEADERS, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.counters = counters or Counters()
        self.metrics = metrics_of(services)
        self.counters.subscribe(metrics_hook(self.metrics))
        self._backends = backends
        self._client_factory = client_factory
        self._framing_headers = framing_headers
        self._services = services
        self._clock = clock
        self._rng = rng or random.Random()
        # A sequence on a split route stays with the upstream its first request went to.
        self._sequence_upstreams = SequencePins(clock=clock)
        self._current = self._build(config, services, {}, {})
        self._live: list[Generation] = [self._current]  # current + retiring ones
        self._tasks: set[asyncio.Task[None]] = set()  # mirrors and retirements
        self.draining = False

    @property
    def config(self) -> GatewayConfig:
        return self._current.config

    @property
    def routes(self) -> RouteTable:
        return self._current.routes

    @property
    def clusters(self) -> dict[str, Cluster]:
        return self._current.clusters

    # --- lifecycle ----------------------------------------------------------

    def _build(self, config: GatewayConfig, services: GatewayServices, reuse: dict[str, Cluster],
               reuse_filters: dict[str, Filter]) -> Generation:
        """Routes, clusters and filters for ``config``; an upstream whose
        config did not change keeps its cluster (health, ejections,
        connections), a policy its filter (its state)."""
        for warning in starvation_warnings(config) + shadow_warnings(config):
            log.warning("%s", warning)
        clusters: dict[str, Cluster] = {}
        for upstream in config.upstreams:
            old = reuse.get(upstream.name)
            clusters[upstream.name] = old if old is not None and old.config == upstream else Cluster(
                upstream, services, self.counters, backends=self._backends, client_factory=self._client_factory,
                clock=self._clock, rng=self._rng)
        filters: dict[str, Filter] = {}
        for policy in config.policies:
            old_filter = reuse_filters.get(policy.name)
            same = old_filter is not None and (old_filter.kind, old_filter.options) == (policy.kind, policy.options)
            filters[policy.name] = old_filter if same and old_filter is not None else \
                filter_registry.load(policy.kind)(policy.name, policy.options, services)
        return Generation(config, RouteTable(config, self._framing_headers), clusters, filters)

    async def start(self) -> None:
        await asyncio.gather(*(cluster.start() for cluster in self.clusters.values()))

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for g in self._live for b in g.batchers.values()))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        clusters = {id(c): c for g in self._live for c in g.clusters.values()}
        await asyncio.gather(*(c.close() for c in clusters.values()))
        filters = {id(f): f for g in self._live for f in g.filters.values()}
        for step in filters.values():
            await _close_filter(step)

    async def swap(self, config: GatewayConfig, services: GatewayServices) -> None:
        """Build and start routes and clusters for ``config`` and switch to
        them at once. Requests in flight finish on the old ones, which are
        closed when the last of them is done. Raises if a new cluster cannot
        start; the old configuration then keeps serving."""
        old = self._current
        self._services = services
        new = self._build(config, services, old.clusters, old.filters)
        kept = {id(c) for c in old.clusters.values()}
        fresh = [c for c in new.clusters.values() if id(c) not in kept]
        try:
            await asyncio.gather(*(c.start() for c in fresh))
        except BaseException:
            await asyncio.gather(*(c.close() for c in fresh), return_exceptions=True)
            raise
        self._current = new
        self._live.append(new)
        self._spawn(self._retire(old), f"retire configuration of {old.config.source}")

    async def _retire(self, generation: Generation) -> None:
        await generation.idle.wait()
        self._live.remove(generation)
        still_used = {id(c) for g in self._live for c in g.clusters.values()}
        await asyncio.gather(*(c.close() for c in generation.clusters.values() if id(c) not in still_used))
        await _close_filters(generation, self._live)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- routing --------------------------------------------------------

    def resolve(self, model: str, version: str, ctx: RequestContext) -> Route:
        """The route for a request whose body is not read yet: unknown models
        are refused now, also behind a catch-all route when every upstream it
        sends to can tell it does not serve the model (builtin)."""
        generation = self._current
        route = self._resolve(generation, model, version, ctx)
        target, target_version = self._target(route, model, version)
        for name in route.upstreams:
            if generation.clusters[name].clients[0].knows_model(target, target_version) is not False:
                return route  # served, or the upstream cannot tell
        if route.upstreams:
            raise model_not_found(model, version)
        return route

    @staticmethod
    def _resolve(generation: Generation, model: str, version: str, ctx: RequestContext) -> Route:
        resolved = ctx.resolved
        if resolved is not None and resolved[0] is generation and resolved[1] == model and resolved[2] == version:
            known: Route = resolved[3]
            return known  # resolved before the body was read (resolve()): once per request
        check_model(model, version)  # every frontend's names pass here (docs/security.md)
        route = generation.routes.resolve(model, version, ctx.listener, ctx.protocol, ctx.headers)
        if route is None:
            raise model_not_found(model, version)
        ctx.route = route.name
        ctx.forward_authorization = route.forwards_authorization(ctx.headers)
        ctx.forward_headers = route.forward_headers(ctx.headers, ctx.request_id)
        ctx.record.model, ctx.record.version, ctx.record.route = model, version, route.name
        ctx.resolved = (generation, model, version, route)
        return route

    def _target(self, route: Route, model: str, version: str) -> tuple[str, str]:
        rewrite = route.config.rewrite
        return rewrite.model or model, rewrite.version if rewrite.version is not None else version

    # --- one request: deadline and attempts ----------------------------------

    async def _call(self, generation: Generation, route: Route, ctx: RequestContext,
                    call: Callable[[Backend], Awaitable[T]], upstream: str | None = None,
                    sequence: SequenceStep | None = None) -> T:
        """Run ``call`` on endpoints of the route's upstream, retrying as the
        route's policy allows, all within one deadline: the route's timeout
        (else the upstream's), or the client's own deadline when sooner. A
        request of a sequence goes where its sequence went before."""
        if upstream is None and sequence is not None and len(route.upstreams) > 1:
            upstream = self._sequence_upstream(route, ctx, sequence)
        cluster = generation.clusters[upstream or route.pick_upstream(ctx.headers, self._rng)]
        ctx.record.upstream = cluster.name
        configured = route.config.timeout if route.config.timeout is not None else cluster.config.timeout
        client_left = ctx.remaining()
        if client_left is not None and client_left <= 0:
            cluster.stats.timeouts_total += 1
            raise GatewayError(ErrorKind.UPSTREAM_TIMEOUT, "the request's deadline passed before it was sent upstream")
        by_client = client_left is not None and (configured is None or client_left < configured)
        budget = client_left if by_client else configured
        if budget is None:  # no deadline: no timer either
            return await self._attempts(cluster, route, ctx, call, None, blame_timeouts=True, sequence=sequence)
        if not by_client:
            # Backends see the effective deadline and can pass it on (gRPC timeout).
            ctx.deadline = time.monotonic() + budget
        try:
            async with asyncio.timeout(budget) as deadline:
                return await self._attempts(cluster, route, ctx, call, deadline, blame_timeouts=not by_client,
                                            sequence=sequence)
        except TimeoutError:
            if not deadline.expired():
                raise
            cluster.stats.timeouts_total += 1
            self.counters.emit(Event("timeout", cluster.name))
            whose = "the client's deadline" if by_client else "the route's timeout"
            raise GatewayError(ErrorKind.UPSTREAM_TIMEOUT,
                               f"upstream '{cluster.name}' did not answer within {budget:g}s ({whose})") from None

    async def _attempts(self, cluster: Cluster, route: Route, ctx: RequestContext,
                        call: Callable[[Backend], Awaitable[T]], deadline: asyncio.Timeout | None,
                        blame_timeouts: bool, sequence: SequenceStep | None = None) -> T:
        policy = route.config.retry
        hash_header = cluster.config.load_balancing.header
        key = ctx.headers.get(hash_header) if hash_header else None
        pinned = _sequence_endpoint(cluster, sequence) if sequence is not None else None
        priority = ctx.priority or request_priority(ctx.headers, route.config.priority)
        tried: set[Endpoint] = set()
        attempt = 0
        budgeted = False  # whether the current try is a retry held against the budget
        while True:
            attempt += 1
            try:
                waiting = time.monotonic()
                target = pinned
                if target is None and sequence is not None:  # no pin in this process: the id decides
                    target = cluster.sequence_endpoint(sequence.key, tried)
                lease = await cluster.acquire(key, tried, target, priority)
                ctx.record.queue_seconds += time.monotonic() - waiting
                tried.add(lease.endpoint)
                record = UpstreamAttempt(cluster.name, lease.endpoint.address, time.monotonic())
                ctx.attempts.append(record)
                per_try = None
                try:
                    # One measured attempt; outside the per-try timeout so it sees TimeoutError.
                    with self.metrics.upstream_call(ctx.record, cluster.name, lease.endpoint.address, deadline):
                        if policy.per_try_timeout is None:
                            result = await call(lease.client)
                        else:
                            async with asyncio.timeout(policy.per_try_timeout) as per_try:
                                result = await call(lease.client)
                except asyncio.CancelledError:
                    # The request's deadline (the endpoint's fault only if the
                    # gateway set it) or the downstream going away.
                    timed_out = deadline is not None and deadline.expired()
                    lease.release(TIMEOUT if timed_out else None, blame_endpoint=blame_timeouts)
                    record.outcome = TIMEOUT if timed_out else "cancelled"
                    raise
                except Exception as exc:
                    reason, error = self._failure(exc, per_try is not None and per_try.expired(),
                                                  policy.per_try_timeout, lease.endpoint, cluster)
                    lease.release(reason)
                    record.outcome = reason or error.kind.value
                    _log_failure(ctx, attempt, cluster.name, lease.endpoint.address, reason, error, exc)
                    if reason is not None:  # a transport's words (an answer's, e.g. "unknown model", are kept)
                        error = _without_address(error, lease.endpoint.address)
                else:
                    lease.release(None)
                    if sequence is not None:
                        _sequence_answered(cluster, sequence, lease.endpoint)
                    return result
                finally:
                    record.duration = time.monotonic() - record.started
            finally:
                if budgeted:
                    cluster.end_retry()
            # A try that never reached an endpoint added no load anywhere, so
            # its retry is outside the budget: a dead endpoint costs no errors.
            budgeted = reason != CONNECT_FAILURE
            # A sequence's step that reached its endpoint may have changed its state: never sent twice.
            once = sequence is not None and reason != CONNECT_FAILURE
            if (once or attempt >= policy.attempts or reason not in policy.retry_on
                    or not cluster.begin_retry(budgeted)):
                if attempt > 1:
                    raise GatewayError(error.kind, f"{error.message} (after {attempt} attempts)") from error
                raise error
            self.counters.emit(Event("retry", cluster.name, lease.endpoint.address, reason or ""))
            try:
                await asyncio.sleep(backoff_delay(policy, attempt, self._rng))
            except BaseException:
                if budgeted:
                    cluster.end_retry()
                raise

    def _sequence_upstream(self, route: Route, ctx: RequestContext, sequence: SequenceStep) -> str:
        """The upstream of a sequence on a split route: by its id's hash, so
        every replica agrees; once pinned, the one its START went to,
        whatever the weights say now."""
        key = f"{route.name}|{sequence.key}"
        upstream = None if sequence.start else self._sequence_upstreams.endpoint_of(key)
        if upstream is None or upstream not in route.upstreams:
            upstream = route.pick_upstream(ctx.headers, self._rng, sequence.key)
        if sequence.end:
            self._sequence_upstreams.unpin(key)
        else:
            self._sequence_upstreams.pin(key, upstream)
        return upstream

    def _failure(self, exc: Exception, per_try_expired: bool, per_try_timeout: float | None, endpoint: Endpoint,
                 cluster: Cluster) -> tuple[str | None, GatewayError]:
        """An attempt's exception as (failure reason, error for the client).
        Errors name the upstream, never the endpoint: clients see them."""
        label = f"'{cluster.name}'"
        if isinstance(exc, TimeoutError):
            if per_try_expired:
                cluster.stats.per_try_timeouts_total += 1
                message = f"upstream {label} did not answer within {per_try_timeout:g}s (per try)"
                return PER_TRY_TIMEOUT, GatewayError(ErrorKind.UPSTREAM_TIMEOUT, message)
            return TIMEOUT, GatewayError(ErrorKind.UPSTREAM_TIMEOUT, f"upstream {label} timed out")
        reason = failure_reason(exc)
        if isinstance(exc, GatewayError):
            return reason, exc
        detail = type(exc).__name__  # its text may name the address: that goes to the log only
        if reason == CONNECT_FAILURE:
            return reason, connect_failure(label, detail)
        if reason == CONNECTION_RESET:
            return reason, connection_reset(label, detail)
        # A bug in a client: never leak a traceback to the wire.
        log.error("upstream client %s (%s) failed", label, endpoint.address, exc_info=exc)
        return reason, GatewayError(ErrorKind.INTERNAL,
                                    f"internal error calling upstream {label}: {type(exc).__name__}")

    # --- mirrors ---------------------------------------------------------------

    def _start_mirrors(self, generation: Generation, route: Route, request: InferRequest,
                       ctx: RequestContext) -> None:
        """Fire-and-forget copies to shadow upstreams. They never wait for a
        slot (a busy shadow drops the copy) and their answers are discarded."""
        for mirror in route.config.mirror:
            if mirror.percent < 100 and self._rng.random() * 100 >= mirror.percent:
                continue
            cluster = generation.clusters[mirror.upstream]
            lease = cluster.try_acquire()
            if lease is None:
                cluster.stats.mirror_dropped_total += 1
                self.counters.emit(Event("mirror_dropped", cluster.name))
                continue
            cluster.stats.mirrored_total += 1
            timeout = route.config.timeout or cluster.config.timeout or MIRROR_DEFAULT_TIMEOUT
            # A record of its own: what the shadow's client notes must not land on the client's request.
            shadow_ctx = dataclasses.replace(ctx, attempts=[], deadline=time.monotonic() + timeout,
                                             record=RequestRecord())
            generation.enter()
            self._spawn(self._mirror(generation, cluster, lease, request, shadow_ctx, timeout),
                        f"mirror to {cluster.name}")

    async def _mirror(self, generation: Generation, cluster: Cluster, lease: Lease, request: InferRequest,
                      ctx: RequestContext, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await lease.client.infer(request, ctx)
        except asyncio.CancelledError:
            lease.release(None)
            raise
        except Exception as exc:
            reason = TIMEOUT if isinstance(exc, TimeoutError) else failure_reason(exc)
            lease.release(reason)
            cluster.stats.mirror_failures_total += 1
            self.counters.emit(Event("mirror_failure", cluster.name, lease.endpoint.address, reason or ""))
            log.debug("mirror to %s failed: %r", cluster.name, exc)
        else:
            lease.release(None)
        finally:
            generation.exit()

    # --- operations -------------------------------------------------------

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        generation = self._current
        generation.enter()  # generation.use(), without a generator-based context manager on the hot path
        try:
            route = self._resolve(generation, request.model_name, request.model_version, ctx)
            ctx.record.batch_size = batch_size(request.inputs)  # a routed inference, for the statistics
            chain = generation.chains.get(route.name) if generation.chains else None
            if chain is None:
                return await self._infer(generation, route, request, ctx)
            return await chain.run(FilterCall(request, ctx, route, INFER),
                                   lambda: self._infer(generation, route, request, ctx))
        finally:
            generation.exit()

    async def _infer(self, generation: Generation, route: Route, request: InferRequest,
                     ctx: RequestContext) -> InferResponse:
        """The upstream half of :meth:`infer`: rewrite, mirrors, batching or attempts."""
        asked_model, asked_version = request.model_name, request.model_version
        model, version = self._target(route, asked_model, asked_version)
        # A copy when renamed, or for mirrors: they outlive the call, and the
        # frontend drops the request's inputs once it has its answer.
        copied = model != asked_model or version != asked_version or route.config.mirror
        upstream_request = dataclasses.replace(request, model_name=model, model_version=version) \
            if copied else request
        if route.config.mirror:
            self._start_mirrors(generation, route, upstream_request, ctx)
        sequence = None
        if request.parameters:
            sequence = sequence_step(request.parameters)
            ctx.priority = parameter_priority(request.parameters)
        if route.config.batching is None or sequence is not None:  # a sequence's step is never batched
            response = await self._call(generation, route, ctx, lambda c: c.infer(upstream_request, ctx),
                                        sequence=sequence)
        else:
            response = await self._batched(generation, route, route.config.batching, upstream_request, ctx)
        return _as_asked(response, request, route)

    async def infer_stream(self, request: InferRequest, ctx: RequestContext,
                           deliver: Callable[[StreamedResponse], Awaitable[None]]) -> None:
        """``infer`` for a stream (no mirrors): each of the upstream's responses
        goes to ``deliver`` as it comes, awaited, so a slow reader slows the
        upstream. The route's timeout bounds the whole request. Retried as
        ``infer`` until a response was delivered; a failure after that ends
        the request unretried (the client holds part of the answer)."""
        generation = self._current
        generation.enter()
        try:
            route = self._resolve(generation, request.model_name, request.model_version, ctx)
            ctx.record.batch_size = batch_size(request.inputs)
            chain = generation.chains.get(route.name) if generation.chains else None
            if chain is None:
                await self._infer_stream(generation, route, request, ctx, deliver)
                return
            call = FilterCall(request, ctx, route, STREAM)
            ran, early = await chain.before(call)
            try:
                if early is not None:
                    await deliver(StreamedResponse(early, final=True))
                    return

                async def filtered(part: StreamedResponse) -> None:
                    part.response = await chain.after(ran, call, part.response)
                    await deliver(part)

                await self._infer_stream(generation, route, request, ctx, filtered)
            except GatewayError as error:
                chain.failed(ran, call, error)
                raise
        finally:
            generation.exit()

    async def _infer_stream(self, generation: Generation, route: Route, request: InferRequest, ctx: RequestContext,
                            deliver: Callable[[StreamedResponse], Awaitable[None]]) -> None:
        """The upstream half of :meth:`infer_stream`."""
        model, version = self._target(route, request.model_name, request.model_version)
        upstream_request = request if (model, version) == (request.model_name, request.model_version) \
            else dataclasses.replace(request, model_name=model, model_version=version)
        broken: list[Exception] = []

        async def relay(client: Backend) -> None:
            delivered = False
            try:
                parts = client.infer_stream(upstream_request, ctx)
                try:
                    async for part in parts:
                        part.response = _as_asked(part.response, request, route)
                        delivered = True
                        await deliver(part)
                finally:
                    # Closed at once when this ends early (cancel, deadline): the upstream's stream ends too.
                    close = getattr(parts, "aclose", None)
                    if close is not None:
                        await close()
            except Exception as exc:
                if not delivered:
                    raise
                broken.append(exc)

        sequence = None
        if request.parameters:
            sequence = sequence_step(request.parameters)
            ctx.priority = parameter_priority(request.parameters)
        await self._call(generation, route, ctx, relay, sequence=sequence)
        if broken:
            error = broken[0]
            if isinstance(error, GatewayError):  # an upstream's words may name an address: cut, as before a response
                raise _without_address(error, ctx.attempts[-1].endpoint if ctx.attempts else None)
            log.warning("request %s: upstream %s failed mid-stream: %r", ctx.request_id, ctx.record.upstream, error)
            raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"upstream '{ctx.record.upstream}' failed "
                               f"mid-stream ({type(error).__name__})")

    # --- dynamic batching (gateway/dataplane/batching.py) --------------------------------

    async def _batched(self, generation: Generation, route: Route, batching: BatchingConfig, request: InferRequest,
                       ctx: RequestContext) -> InferResponse:
        """``request`` through the route's batcher. Its deadline counts from
        its own arrival, whatever batch it rides in."""
        batcher = generation.batchers.get(route.name)
        if batcher is None:
            batcher = generation.batchers[route.name] = Batcher(
                route.name, batching, lambda r, members: self._send_batch(generation, route, r, members),
                offload=getattr(self._services, "offload", None), budget=getattr(self._services, "budget", None),
                release_inputs=not route.config.mirror,
                observe=lambda rows, waits: self.metrics.observe_batch(route.name, rows, waits))
        if not route.config.split:  # what the upstream refuses without a call never joins a batch
            generation.clusters[route.upstream].clients[0].check_request(request)
        configured = route.config.timeout
        if configured is None and not route.config.split:
            configured = generation.clusters[route.upstream].config.timeout
        due = [t for t in (ctx.deadline, None if configured is None else ctx.started + configured) if t is not None]
        budget = min(due) - time.monotonic() if due else None
        try:
            async with asyncio.timeout(budget) as deadline:
                return await batcher.infer(request, ctx, compatibility(request, ctx))
        except TimeoutError:
            if not deadline.expired():
                raise
            raise GatewayError(ErrorKind.UPSTREAM_TIMEOUT, f"route '{route.name}' did not answer within "
                               f"{max(0.0, budget or 0.0):g}s (the request's deadline, batched)") from None

    async def _send_batch(self, generation: Generation, route: Route, request: InferRequest,
                          members: list[Member]) -> InferResponse:
        """One upstream call for a batch, with the route's retries, under the
        latest deadline of its members (each member keeps its own)."""
        ctx = batch_context(members)
        try:
            return await self._call(generation, route, ctx, lambda c: c.infer(request, ctx))
        finally:
            for member in members:
                share_facts(ctx, member)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        generation = self._current
        with generation.use():
            route = self._resolve(generation, model, version, ctx)
            target, target_version = self._target(route, model, version)
            metadata = await self._call(generation, route, ctx,
                                        lambda c: c.model_metadata(target, target_version, ctx))
        if route.config.rewrite.version is not None:
            return dataclasses.replace(metadata, name=model, versions=(version,) if version else ())
        return dataclasses.replace(metadata, name=model)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        generation = self._current
        with generation.use():
            route = self._resolve(generation, model, version, ctx)
            target, target_version = self._target(route, model, version)
            return await self._call(generation, route, ctx, lambda c: c.model_ready(target, target_version, ctx))

    def offers(self, route: Route, operation: str) -> bool:
        """Whether every upstream the route sends to (a split has several)
        answers ``operation`` through call_operation (the others raise
        UNSUPPORTED for it)."""
        clusters = self.clusters
        return all(operation in clusters[name].clients[0].operations for name in route.upstreams)

    def relays(self, route: Route, protocol: str) -> bool:
        """Whether an upstream of ``route`` speaks ``protocol`` with its
        ``passthrough`` on: a frontend may then hand it the client's bytes."""
        return any(self._relaying(name, protocol) for name in route.upstreams)

    def relays_only(self, route: Route, protocol: str) -> bool:
        """Whether every upstream of ``route`` does: bytes no other protocol
        could read may go wherever a split sends them."""
        return all(self._relaying(name, protocol) for name in route.upstreams)

    def _relaying(self, upstream: str, protocol: str) -> bool:
        config = self.clusters[upstream].config
        return config.protocol == protocol and config.passthrough

    async def call_operation(self, operation: str, request: InferRequest, ctx: RequestContext,
                             arguments: Any = None) -> Any:
        """An operation beyond infer (e.g. ``DERIVATIVE_OPERATION``), routed and
        rewritten exactly like infer; the upstream client's ``call_operation``
        answers it or raises UNSUPPORTED."""
        generation = self._current
        with generation.use():
            route = self._resolve(generation, request.model_name, request.model_version, ctx)
            model, version = self._target(route, request.model_name, request.model_version)
            routed = OperationRequest(dataclasses.replace(request, model_name=model, model_version=version),
                                      arguments)
            return await self._call(generation, route, ctx, lambda c: c.call_operation(operation, routed, ctx))

    async def server_ready(self, ctx: RequestContext) -> bool:
        """False while draining; else as ``readiness.upstreams`` says: whether
        any (or all) upstreams that routes send to have an available endpoint."""
        if self.draining:
            return False
        generation = self._current
        mode = generation.config.readiness.upstreams
        names = generation.routes.upstreams()
        if mode == "ignore" or not names:
            return True
        states = (generation.clusters[name].has_available_endpoint() for name in sorted(names))
        return any(states) if mode == "any" else all(states)

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """Models reachable from ``ctx.listener``: explicit route names plus
        what upstreams behind catch-all routes can list themselves."""
        generation = self._current
        names = generation.routes.explicit_models(ctx.listener)
        with generation.use():
            for route in generation.routes.routes:
                m = route.config.match
                if m.listener not in (None, ctx.listener) or m.model.kind == "exact":
                    continue
                for upstream in route.upstreams:
                    try:
                        listed = await self._call(generation, route, ctx, lambda c: c.list_models(ctx), upstream)
                    except GatewayError:
                        continue
                    names += [n for n in listed if n not in names and route.matches(
                        n, "", ctx.listener, ctx.protocol, ctx.headers)]
        return names


async def _close_filters(generation: Generation, live: list[Generation]) -> None:
    """Close the filters of ``generation`` that no generation in ``live`` uses."""
    used = {id(f) for g in live for f in g.filters.values()}
    for step in generation.filters.values():
        if id(step) not in used:
            await _close_filter(step)


async def _close_filter(step: Filter) -> None:
    try:
        await step.close()
    except Exception:
        log.exception("closing the filter of policy %r failed", step.name)


def _sequence_endpoint(cluster: Cluster, sequence: SequenceStep) -> Endpoint | None:
    """Where this process's pin sends a sequence's request: None for a START
    or a sequence it holds no pin for (its id then decides:
    Cluster.sequence_endpoint); the pinned endpoint while that serves; an
    error once it does not (the state is lost with it, so the sequence ends
    here instead of moving)."""
    if sequence.start:
        return None
    address = cluster.pins.endpoint_of(sequence.key)
    if address is None:
        return None
    endpoint = cluster.pinned_endpoint(address)
    if endpoint is None:
        cluster.pins.unpin(sequence.key)
        raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE,
                           f"the endpoint of upstream '{cluster.name}' holding this sequence's state is unavailable "
                           "(ejected, unhealthy or removed); the sequence has ended: start it again")
    return endpoint


def _sequence_answered(cluster: Cluster, sequence: SequenceStep, endpoint: Endpoint) -> None:
    if sequence.end:
        cluster.pins.unpin(sequence.key)
    else:
        cluster.pins.pin(sequence.key, endpoint.address)


def _log_failure(ctx: RequestContext, attempt: int, upstream: str, endpoint: str, reason: str | None,
                 error: GatewayError, exc: BaseException) -> None:
    """A failed attempt, with what its client is not shown: the endpoint's
    address and the transport's own words. A warning when the endpoint
    failed (the reasons of retry and outlier detection); an answer such as
    "unknown model" is no trouble of the endpoint's."""
    level = logging.WARNING if reason else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    causes = [link for link in error_chain(exc) if link is not exc and link is not error
              and not isinstance(link, (GatewayError, asyncio.CancelledError, TimeoutError))]
    cause = f" [{type(causes[-1]).__name__}: {_words(causes[-1])}]" if causes else ""
    log.log(level, "request %s: attempt %d on upstream %s endpoint %s failed (%s): %s%s", ctx.request_id, attempt,
            upstream, endpoint, reason or error.kind.value, error.message, cause)


def _words(exc: BaseException) -> str:
    """An exception's text on one bounded line (grpc's: its details, not its
    many-line description)."""
    details = getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)
    return " ".join(str(text).split())[:400]


def _without_address(error: GatewayError, endpoint: str | None) -> GatewayError:
    """The error with the endpoint's address (or any address) cut from its
    message: an upstream's own words may name one. The same error object,
    so its class and fields (a failure reason, a protocol status) stay."""
    message = without_addresses(error.message, endpoint)
    if message != error.message:
        error.message = message
        error.args = (message,)
    return error


def _as_asked(response: InferResponse, request: InferRequest, route: Route) -> InferResponse:
    """An upstream's answer under the model name (and version) the client
    asked for, with its id and the outputs it asked for."""
    response.model_name = request.model_name
    if route.config.rewrite.version is not None:
        response.model_version = request.model_version
    if not response.id:
        response.id = request.id
    # An answer relayed undecoded (raw, no outputs) was selected by the
    # upstream itself; decoded ones (raw may be kept beside them) here.
    if request.outputs and (response.raw is None or response.outputs):
        response.outputs = select_outputs(response, request, request.model_name)
    return response


def select_outputs(response: InferResponse, request: InferRequest, model: str) -> list[Any]:
    """The requested outputs, in the order asked; unknown names are errors."""
    by_name = {t.name: t for t in response.outputs}
    selected = []
    for wanted in request.outputs:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            raise invalid(f"unexpected inference output '{wanted.name}' for model '{model}'")
        selected.append(tensor)
    return selected
