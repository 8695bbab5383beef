"""Active health checks: each endpoint asked on an interval (with jitter) by
its own protocol client; its verdict flips after ``healthy_threshold``
passes or ``unhealthy_threshold`` failures in a row (the first round decides
at once). The cluster (gateway/dataplane/cluster/cluster.py) serves only
healthy endpoints while any is left.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from gateway.config.upstreams import HealthCheck
from gateway.core.types import RequestContext
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.observability.counters import Counters, Event

log = logging.getLogger(__name__)


class HealthChecker:
    """The checks of one cluster's endpoints, and the task repeating them."""

    def __init__(self, upstream: str, check: HealthCheck, endpoints: list[Endpoint], counters: Counters,
                 rng: random.Random, on_change: Callable[[], None]) -> None:
        self.upstream = upstream
        self.check = check
        self._endpoints = endpoints  # the cluster's live list
        self._counters = counters
        self._rng = rng
        self._on_change = on_change
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """One round first, so the cluster serves with known health (a
        reload swaps in warm clusters); then one round per interval."""
        await self.check_all(first=True)
        self.task = asyncio.create_task(self._loop(), name=f"health-check {self.upstream}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    async def _loop(self) -> None:
        while True:
            # A little jitter keeps many gateways from checking in lockstep.
            await asyncio.sleep(self.check.interval * self._rng.uniform(0.9, 1.1))
            await self.check_all()

    async def check_all(self, first: bool = False) -> None:
        await asyncio.gather(*(self.check_one(e, first) for e in self._endpoints))

    async def check_one(self, endpoint: Endpoint, first: bool) -> None:
        timeout = self.check.timeout
        ctx = RequestContext("", "health-check", request_id="health-check", deadline=time.monotonic() + timeout)
        try:
            async with asyncio.timeout(timeout):
                ok = bool(await endpoint.client.health_check(ctx))
        except Exception as exc:  # any failure of the check is a failed check
            log.debug("health check of %s %s failed: %r", self.upstream, endpoint.address, exc)
            ok = False
        self.record(endpoint, ok, first)

    def record(self, endpoint: Endpoint, ok: bool, first: bool = False) -> None:
        if ok:
            endpoint.checks_passed += 1
            endpoint.checks_failed = 0
            flip = not endpoint.healthy and (first or endpoint.checks_passed >= self.check.healthy_threshold)
        else:
            endpoint.checks_failed += 1
            endpoint.checks_passed = 0
            endpoint.counters.health_check_failures_total += 1
            flip = endpoint.healthy and (first or endpoint.checks_failed >= self.check.unhealthy_threshold)
        if flip:
            endpoint.healthy = ok
            verdict = "healthy" if ok else "unhealthy"
            log.warning("upstream %s endpoint %s is now %s", self.upstream, endpoint.address, verdict)
            self._counters.emit(Event("health_changed", self.upstream, endpoint.address, verdict))
            self._on_change()
