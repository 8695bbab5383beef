"""One address of a cluster: its client, its requests in flight, and its
health: the active checks' verdict and the outlier-ejection state."""

from __future__ import annotations

from gateway.core.contracts import Backend
from gateway.dataplane.cluster.discovery import NameWatch
from gateway.observability.counters import EndpointCounters


class Endpoint:
    """One address of a cluster, with its client and its health."""

    def __init__(self, client: Backend, address: str, counters: EndpointCounters,
                 origin: NameWatch | None = None, resolved: str | None = None, created: float = 0.0) -> None:
        self.client = client
        self.address = address
        self.counters = counters
        self.origin = origin  # the name this endpoint was discovered from
        self.resolved = resolved  # its IP address; None for the name itself (not resolved yet)
        self.created = created
        self.draining = False  # out of the cluster, closing once in_flight is 0
        self.in_flight = 0
        self.healthy = True  # the active health checks' verdict
        self.consecutive_failures = 0
        self.ejected_until: float | None = None
        self.ejections = 0  # multiplier of the next ejection time
        self.readmitted_at = 0.0
        self.checks_passed = 0  # active health checks in a row
        self.checks_failed = 0
        # load_aware (loadmetrics.py): the load the endpoint last reported, None
        # while unknown or stale; when it was read, and this gateway's calls then.
        self.load: float | None = None
        self.loaded_at = 0.0
        self.in_flight_at_load = 0

    def estimated_load(self, reported: float) -> float:
        """``reported`` (its ``load``) plus this gateway's calls started since
        it was read, less those ended since."""
        return reported + self.in_flight - self.in_flight_at_load

    def take_health_of(self, old: Endpoint) -> None:
        """Carry the verdicts over to a new client of the same address."""
        self.healthy, self.consecutive_failures = old.healthy, old.consecutive_failures
        self.ejected_until, self.ejections, self.readmitted_at = old.ejected_until, old.ejections, old.readmitted_at

    def ejected(self, now: float) -> bool:
        return self.ejected_until is not None and now < self.ejected_until

    def available(self, now: float) -> bool:
        return self.healthy and not self.ejected(now)
