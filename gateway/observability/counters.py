"""Counters kept by the data plane for metrics and the admin endpoints.

They are plain attributes, monotonic, and live as long as the gateway: a
reload replaces routes and clusters but keeps the counters of upstreams and
endpoints that carry the same names. A metrics exporter reads them at scrape
time (nothing on the hot path) or subscribes to events as they happen.
Live gauges (in flight, pending, health) are read from the clusters:
``DataPlane.clusters[name].snapshot()``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EndpointCounters:
    requests_total: int = 0  # attempts sent to this endpoint
    failures_total: int = 0  # attempts that failed for a reason of the endpoint's
    ejections_total: int = 0
    health_check_failures_total: int = 0


@dataclass(slots=True)
class UpstreamCounters:
    requests_total: int = 0  # attempts, retries included
    retries_total: int = 0
    retry_budget_exhausted_total: int = 0  # retries not made because of the budget
    timeouts_total: int = 0  # requests answered "timeout" (the route's or the client's deadline)
    per_try_timeouts_total: int = 0  # attempts cut off by the retry policy's per_try_timeout
    overflows_total: int = 0  # circuit-breaker rejections
    ejections_total: int = 0
    mirrored_total: int = 0  # copies sent to this upstream as a mirror
    mirror_failures_total: int = 0
    mirror_dropped_total: int = 0  # copies not sent: the upstream was at its limits
    shed_total: int = 0  # requests its full wait line refused (max_queue), all priorities
    load_fallbacks_total: int = 0  # load_aware picks made by least_request: a load unknown or stale
    endpoints: dict[str, EndpointCounters] = field(default_factory=dict)


@dataclass(slots=True)
class ReloadCounters:
    successes_total: int = 0
    failures_total: int = 0
    last_success_time: float | None = None  # Unix time
    last_failure_time: float | None = None
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class Event:
    """Something a metrics or logging hook may want the moment it happens.

    ``name`` is one of: retry, retry_budget_exhausted, timeout, overflow,
    shed (detail: the priority), endpoint_load (detail: the load read, "nan"
    when stale), ejection, readmission, health_changed, mirror_failure,
    mirror_dropped, reload_success, reload_failure.
    """

    name: str
    upstream: str = ""
    endpoint: str = ""
    detail: str = ""


class Counters:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.upstreams: dict[str, UpstreamCounters] = {}
        self.reload = ReloadCounters()
        self.hooks: list[Callable[[Event], None]] = []
        self._clock = clock

    def upstream(self, name: str) -> UpstreamCounters:
        counters = self.upstreams.get(name)
        if counters is None:
            counters = self.upstreams[name] = UpstreamCounters()
        return counters

    def endpoint(self, upstream: str, endpoint: str) -> EndpointCounters:
        endpoints = self.upstream(upstream).endpoints
        counters = endpoints.get(endpoint)
        if counters is None:
            counters = endpoints[endpoint] = EndpointCounters()
        return counters

    def subscribe(self, hook: Callable[[Event], None]) -> None:
        self.hooks.append(hook)

    def emit(self, event: Event) -> None:
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:  # a broken hook must never fail a request
                log.exception("counter hook failed on %s", event.name)

    def reload_succeeded(self) -> None:
        self.reload.successes_total += 1
        self.reload.last_success_time = self._clock()
        self.emit(Event("reload_success"))

    def reload_failed(self, error: str) -> None:
        self.reload.failures_total += 1
        self.reload.last_failure_time = self._clock()
        self.reload.last_error = error
        self.emit(Event("reload_failure", detail=error))
