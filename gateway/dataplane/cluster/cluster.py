"""An upstream cluster: its endpoints, limits and retry budget, composed
with the endpoint picker (balancing.py), the active health checks
(health.py) and passive outlier detection (outlier.py).

One :class:`Cluster` per configured upstream. It hands each attempt a slot
on an endpoint (:meth:`Cluster.acquire` -> :meth:`Lease.release`) and
enforces the circuit-breaker limits: at most ``max_requests`` in flight, at
most ``max_connections`` on one endpoint, at most ``max_pending`` waiting for
a slot; beyond that it answers UPSTREAM_OVERLOADED at once (REST 503, gRPC
RESOURCE_EXHAUSTED) instead of queueing without bound.

Endpoints given as DNS names are discovered (gateway/dataplane/cluster/discovery.py): one
endpoint per address, added (health-checked first) and drained (no new
requests; the client closes once the last one in flight ends) as the
answers change.

All state is touched from the event loop only; no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from gateway.config.address import Address
from gateway.config.upstreams import UpstreamConfig
from gateway.core.contracts import Backend
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.hashing import highest_random_weight
from gateway.dataplane.affinity import SequencePins
from gateway.dataplane.cluster.balancing import picker
from gateway.dataplane.cluster.discovery import NameWatch, is_name
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.dataplane.cluster.health import HealthChecker
from gateway.dataplane.cluster.loadmetrics import LoadScraper
from gateway.dataplane.cluster.outlier import OutlierDetector
from gateway.dataplane.cluster.waiting import Waiter, WaitLine
from gateway.dataplane.retry import ENDPOINT_FAILURES, budget_allows
from gateway.observability.counters import Counters, Event
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)

ClientFactory = Callable[[UpstreamConfig, "Address | None", GatewayServices], Backend]


class BackendClass(Protocol):
    """A protocol's backend (its UpstreamClient class): built once per
    endpoint, or once when it needs none (in-process)."""

    def __call__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> Backend: ...

    def needs_endpoints(self) -> bool: ...


# A protocol's name -> its backend class; the app hands in the registry's.
Backends = Callable[[str], BackendClass]

IN_PROCESS = "in-process"
# load_aware picking without a load is logged at most this often (it is counted every time).
LOG_FALLBACK_EVERY = 30.0


class Lease:
    """One attempt's hold on a cluster slot and an endpoint; release it once."""

    __slots__ = ("_cluster", "endpoint", "released")

    def __init__(self, cluster: Cluster, endpoint: Endpoint) -> None:
        self._cluster = cluster
        self.endpoint = endpoint
        self.released = False

    @property
    def client(self) -> Backend:
        return self.endpoint.client

    def release(self, failure: str | None, *, blame_endpoint: bool = True) -> None:
        """``failure``: None for an answer (errors like "unknown model"
        included), else the failure reason; ``blame_endpoint`` False when the
        failure was not the endpoint's doing (the client's deadline)."""
        if not self.released:
            self.released = True
            self._cluster._release(self.endpoint, failure if blame_endpoint else None)


class Shed(GatewayError):
    """Refused by an upstream's full wait line (``max_queue``): the
    protocol's overload form with Retry-After (HTTP 429, gRPC
    RESOURCE_EXHAUSTED), as the client should come back later."""

    retry_after = 1  # seconds: a slot is usually free well within it

    def __init__(self, message: str, priority: int) -> None:
        super().__init__(ErrorKind.OVERLOADED, message)
        self.priority = priority


class Cluster:
    """An upstream's endpoints, each with its own protocol client."""

    def __init__(self, config: UpstreamConfig, services: GatewayServices, counters: Counters | None = None, *,
                 backends: Backends | None = None, client_factory: ClientFactory | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.config = config
        self.counters = counters or Counters()
        self.stats = self.counters.upstream(config.name)
        self._clock = clock
        self._rng = rng or random.Random()
        if client_factory is None:
            if backends is None:
                raise TypeError("a Cluster needs its backends (the protocol registry's) or a client_factory")
            client_class = backends(config.protocol)
            addresses: tuple[Address | None, ...] = config.endpoints if client_class.needs_endpoints() else (None,)
            client_factory = client_class
        else:
            addresses = config.endpoints or (None,)
        if not addresses:
            raise GatewayError(ErrorKind.INTERNAL, f"upstream '{config.name}' has no endpoints")
        self._client_factory = client_factory
        self._services = services
        self.endpoints: list[Endpoint] = []
        self._watches: list[NameWatch] = []
        for address in addresses:
            label = str(address) if address is not None else IN_PROCESS
            client = client_factory(config, address, services)
            watch = None
            if address is not None and config.dns.discovery and is_name(address.host):
                # Until its first answer the name is one endpoint, as without discovery.
                watch = NameWatch(config.name, address, config.dns)
                self._watches.append(watch)
            self.endpoints.append(Endpoint(client, label, self.counters.endpoint(config.name, label), watch))
        self._draining: set[Endpoint] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._discovery_task: asyncio.Task[None] | None = None
        self.in_flight = 0
        self.retries_in_flight = 0
        self._waiters = WaitLine()
        self._endpoint_limit = config.endpoint_limit
        self._fallback_logged = -LOG_FALLBACK_EVERY
        self._picker = picker(config.load_balancing.policy, self._rng, self.endpoints, self._picked_without_load)
        self._load = None if config.load_metrics is None else LoadScraper(
            config.name, config.load_metrics, lambda: self.endpoints, self.counters, clock)
        self._health = None if config.health_check is None else HealthChecker(
            config.name, config.health_check, self.endpoints, self.counters, self._rng, self._wake_all)
        self._outliers = OutlierDetector(config.name, config.outlier_detection, self.endpoints, self.counters,
                                         self.stats)
        self.pins = SequencePins(config.sequence_affinity, clock)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def pending(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiters)

    @property
    def clients(self) -> list[Backend]:
        return [e.client for e in self.endpoints]

    # --- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        """Resolve the names, start the clients; with health checks, run one
        round first so the cluster serves with known health (a reload swaps in
        warm clusters)."""
        resolved = await asyncio.gather(*(watch.refresh() for watch in self._watches))
        for watch, ok in zip(self._watches, resolved, strict=True):
            if ok:
                self._replace([e for e in self.endpoints if e.origin is watch],
                              [self._endpoint(watch, ip) for ip in watch.addresses], started=False)
            else:
                self._dns_failed(watch)
        for endpoint in self.endpoints:
            await endpoint.client.start()
        if self._health is not None:
            await self._health.start()
        if self._watches:
            self._discovery_task = asyncio.create_task(self._discovery_loop(), name=f"dns {self.name}")
        if self._load is not None:
            self._load.start()

    async def close(self) -> None:
        if self._health is not None:
            await self._health.stop()
        if self._load is not None:
            await self._load.stop()
        if self._discovery_task is not None:
            self._discovery_task.cancel()
            await asyncio.gather(self._discovery_task, return_exceptions=True)
            self._discovery_task = None
        await asyncio.gather(*self._background, return_exceptions=True)  # drained clients closing
        closing = [*self.endpoints, *self._draining]
        self._draining.clear()
        await asyncio.gather(*(e.client.close() for e in closing), return_exceptions=True)

    # --- DNS discovery ----------------------------------------------------------

    def _endpoint(self, watch: NameWatch, ip: str, announce: bool = True) -> Endpoint:
        """A new, not yet started endpoint for one address of ``watch``'s name."""
        address = Address(ip, watch.address.port, watch.address.host)
        label = str(address)
        client = self._client_factory(self.config, address, self._services)
        endpoint = Endpoint(client, label, self.counters.endpoint(self.name, label), watch, ip, self._clock())
        if announce:
            self.counters.emit(Event("endpoint_added", self.name, label))
        return endpoint

    def _dns_failed(self, watch: NameWatch) -> None:
        self.counters.emit(Event("dns_failure", self.name, watch.address.host))

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.dns.refresh * self._rng.uniform(0.9, 1.1))
            await self.rediscover()

    async def rediscover(self) -> None:
        """Resolve every name once and bring the endpoints in line."""
        results = await asyncio.gather(*(self._rediscover(watch) for watch in self._watches), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):  # a client that would not start: tried again next time
                log.warning("upstream %s: DNS discovery step failed: %r", self.name, result)

    async def _rediscover(self, watch: NameWatch) -> None:
        """Resolve ``watch``'s name once and bring its endpoints in line."""
        if not await watch.refresh():
            self._dns_failed(watch)
            return
        current = [e for e in self.endpoints if e.origin is watch]
        have = {e.resolved for e in current}
        gone = [e for e in current if e.resolved not in watch.addresses]
        fresh = [self._endpoint(watch, ip) for ip in watch.addresses if ip not in have]
        reconnect = self.config.dns.reconnect
        if len(watch.addresses) == 1 and not fresh and reconnect and current:
            old = current[0]
            if self._clock() - old.created >= reconnect:  # new connections to the same (virtual) address
                renewed = self._endpoint(watch, watch.addresses[0], announce=False)
                renewed.take_health_of(old)
                fresh.append(renewed)
                gone.append(old)
        if not fresh and not gone:
            return
        try:
            for endpoint in fresh:
                await endpoint.client.start()
                if self._health is not None and endpoint.resolved not in have:
                    await self._health.check_one(endpoint, first=True)  # checked before it takes traffic
        except BaseException:  # closed meanwhile, or a client that would not start: none left open
            await asyncio.gather(*(e.client.close() for e in fresh), return_exceptions=True)
            raise
        self._replace(gone, fresh)

    def _replace(self, gone: list[Endpoint], fresh: list[Endpoint], started: bool = True) -> None:
        """Swap endpoints: ``gone`` ones take no new request and close once
        idle (at once when never started)."""
        for endpoint in gone:
            self.endpoints.remove(endpoint)
            endpoint.draining = True
            if endpoint.resolved is not None or started:
                log.info("upstream %s endpoint %s drained (%s)", self.name, endpoint.address,
                         "reconnect" if any(e.address == endpoint.address for e in fresh) else "left DNS")
            if started:
                self._draining.add(endpoint)
                self._close_if_idle(endpoint)
        self.endpoints.extend(fresh)
        labels = {e.address for e in self.endpoints}
        for endpoint in gone:
            if endpoint.address not in labels:
                self.stats.endpoints.pop(endpoint.address, None)
                self.counters.emit(Event("endpoint_removed", self.name, endpoint.address))
        for endpoint in fresh:
            if endpoint.address not in {e.address for e in gone}:
                log.info("upstream %s endpoint %s added", self.name, endpoint.address)
        self._picker.rebuild(self.endpoints)
        self._wake_all()

    def _close_if_idle(self, endpoint: Endpoint) -> None:
        if endpoint.in_flight > 0 or endpoint not in self._draining:
            return
        self._draining.discard(endpoint)
        task = asyncio.get_running_loop().create_task(endpoint.client.close(), name=f"close {endpoint.address}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- health and outliers -------------------------------------------------

    async def check_health(self) -> None:
        """One round of active health checks now."""
        if self._health is not None:
            await self._health.check_all()

    def _release(self, endpoint: Endpoint, failure: str | None) -> None:
        endpoint.in_flight -= 1
        self.in_flight -= 1
        if endpoint.draining:
            self._close_if_idle(endpoint)
        if failure in ENDPOINT_FAILURES:
            self._outliers.record_failure(endpoint, self._clock())
        else:
            endpoint.consecutive_failures = 0
        self._wake_one()

    def has_available_endpoint(self) -> bool:
        now = self._clock()
        self._outliers.readmit_expired(now)
        return any(e.available(now) for e in self.endpoints)

    # --- load balancing and limits ---------------------------------------------

    def _candidates(self, exclude: set[Endpoint], pinned: Endpoint | None = None) -> list[Endpoint]:
        """Endpoints that may take the next attempt: available ones (all of
        them when none is: better to try than to refuse), with a free slot,
        preferring those this request has not tried yet. A request pinned to
        an endpoint (a sequence's) has that one or none."""
        if self.in_flight >= self.config.circuit_breaker.max_requests:
            return []
        limit = self._endpoint_limit
        if pinned is not None:
            return [pinned] if pinned.in_flight < limit else []
        now = self._clock()
        self._outliers.readmit_expired(now)
        pool = [e for e in self.endpoints if e.available(now)] or self.endpoints
        free = [e for e in pool if e.in_flight < limit]
        fresh = [e for e in free if e not in exclude]
        return fresh or free

    def _take(self, key: str | None, exclude: set[Endpoint], pinned: Endpoint | None = None) -> Lease | None:
        candidates = self._candidates(exclude, pinned)
        if not candidates:
            return None
        endpoint = candidates[0] if len(candidates) == 1 else self._picker.choose(self.endpoints, candidates, key)
        endpoint.in_flight += 1
        endpoint.counters.requests_total += 1
        self.in_flight += 1
        self.stats.requests_total += 1
        return Lease(self, endpoint)

    def try_acquire(self, key: str | None = None, exclude: set[Endpoint] | None = None) -> Lease | None:
        """A slot now, or None; never waits (mirrors use it)."""
        return None if self._waiters.size else self._take(key, exclude or set())

    async def acquire(self, key: str | None = None, exclude: set[Endpoint] | None = None,
                      pinned: Endpoint | None = None, priority: int = 0) -> Lease:
        """A slot on an endpoint (on ``pinned`` if given): at once if free,
        else wait in line, by ``priority`` (1 highest, 0 none: lowest;
        waiting.py). A full line (``max_queue``, else ``max_pending``) sheds
        the newest waiter of a lower priority than the newcomer's, or else
        refuses the newcomer, at once. The caller bounds the wait with its
        deadline."""
        exclude = exclude or set()
        lease = None if self._waiters.size else self._take(key, exclude, pinned)
        if lease is not None:
            return lease
        waiter = Waiter(priority)
        bound = self.config.max_queue if self.config.max_queue is not None else self.config.circuit_breaker.max_pending
        if len(self._waiters) >= bound:
            victim = self._waiters.victim_for(waiter.rank)
            if victim is None:
                raise self._refusal(waiter.priority)
            self._waiters.remove(victim)
            victim.refused = self._refusal(victim.priority)
            victim.future.set_result(None)
        self._waiters.add(waiter)
        try:
            while True:
                await waiter.future
                if waiter.refused is not None:
                    raise waiter.refused
                lease = self._take(key, exclude, pinned)
                if lease is not None:
                    return lease
                waiter.future = asyncio.get_running_loop().create_future()
        finally:
            self._waiters.remove(waiter)
            self._wake_one()  # pass on a wake-up this waiter may have used or lost

    def _refusal(self, priority: int) -> GatewayError:
        """The error of a request the full line refuses, counted: shed
        (OVERLOADED) with ``max_queue``, else the circuit breaker's."""
        if self.config.max_queue is not None:
            self.stats.shed_total += 1
            self.counters.emit(Event("shed", self.name, detail=str(priority)))
            return Shed(f"upstream '{self.name}' is saturated ({self.in_flight} requests in flight, "
                        f"{len(self._waiters)} waiting); priority {priority or 'none'} shed, try again later", priority)
        self.stats.overflows_total += 1
        self.counters.emit(Event("overflow", self.name))
        return GatewayError(ErrorKind.UPSTREAM_OVERLOADED,
                            f"upstream '{self.name}' is at its limits ({self.in_flight} requests in flight, "
                            f"{len(self._waiters)} waiting); try again later")

    def _picked_without_load(self) -> None:
        """load_aware picked by least_request: an endpoint's load is unknown."""
        self.stats.load_fallbacks_total += 1
        now = self._clock()
        if now - self._fallback_logged >= LOG_FALLBACK_EVERY:
            self._fallback_logged = now
            log.warning("upstream %s: an endpoint's load is unknown (load metrics missing or stale); picking "
                        "by least_request (counted in load_fallbacks_total)", self.name)

    def _wake_one(self) -> None:
        if not self._waiters.size or not self._candidates(set()):
            return
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)
                return

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)

    def pinned_endpoint(self, address: str) -> Endpoint | None:
        """The endpoint at ``address`` if it may serve (a sequence pinned to
        it goes on), else None: ejected, unhealthy or gone, the sequence's
        state is lost with it."""
        now = self._clock()
        self._outliers.readmit_expired(now)
        for endpoint in self.endpoints:
            if endpoint.address == address:
                return endpoint if endpoint.available(now) else None
        return None

    def sequence_endpoint(self, key: str, exclude: set[Endpoint]) -> Endpoint:
        """The endpoint of the sequence ``key`` where no pin decides: a
        function of the key and the available endpoints (rendezvous hashing),
        so every replica and worker with the same view picks the same one
        without sharing state. Endpoints this request tried are left out
        while others remain (the one other replicas pick once it is gone)."""
        endpoints = self.endpoints
        if len(endpoints) == 1:
            return endpoints[0]
        now = self._clock()
        self._outliers.readmit_expired(now)
        pool = [e for e in endpoints if e.available(now)] or endpoints
        fresh = [e for e in pool if e not in exclude] or pool
        return fresh[highest_random_weight(key, [e.address for e in fresh])]

    # --- retry budget -----------------------------------------------------------

    def begin_retry(self, budgeted: bool = True) -> bool:
        """Whether a retry may start. Unbudgeted retries (of tries that never
        reached an endpoint) are counted but always allowed."""
        if not budgeted:
            self.stats.retries_total += 1
            return True
        budget = self.config.retry_budget
        if not budget_allows(self.retries_in_flight, self.in_flight + self.pending, budget.percent,
                             budget.min_concurrency):
            self.stats.retry_budget_exhausted_total += 1
            self.counters.emit(Event("retry_budget_exhausted", self.name))
            return False
        self.retries_in_flight += 1
        self.stats.retries_total += 1
        return True

    def end_retry(self) -> None:
        self.retries_in_flight -= 1

    # --- views ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Live state for the admin /upstreams endpoint and metrics gauges."""
        now = self._clock()
        self._outliers.readmit_expired(now)
        counters = asdict(self.stats)
        counters.pop("endpoints")
        return {
            "name": self.name,
            "protocol": self.config.protocol,
            "load_balancing": self.config.load_balancing.policy,
            "available": any(e.available(now) for e in self.endpoints),
            "in_flight": self.in_flight,
            "pending": self.pending,
            "retries_in_flight": self.retries_in_flight,
            "max_requests": self.config.circuit_breaker.max_requests,
            "max_pending": self.config.circuit_breaker.max_pending,
            "max_queue": self.config.max_queue,
            "health_checked": self.config.health_check is not None,
            "counters": counters,
            "endpoints": [{
                "address": e.address,
                "healthy": e.healthy,
                "ejected": e.ejected(now),
                "ejected_for_seconds": round(max(0.0, (e.ejected_until or now) - now), 3),
                "in_flight": e.in_flight,
                "load": e.load,
                "consecutive_failures": e.consecutive_failures,
                "counters": asdict(e.counters),
            } for e in self.endpoints],
            "dns": [{"name": w.address.host, "addresses": list(w.addresses), "failures_total": w.failures_total}
                    for w in self._watches],
        }
