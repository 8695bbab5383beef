"""Passive outlier detection: an endpoint failing ``consecutive_failures``
times in a row is ejected (takes no traffic) for a time that grows with its
ejections and decays while it stays healthy, unless ``max_ejection_percent``
of the cluster is out already; it is re-admitted when the time is up. The
cluster (gateway/dataplane/cluster/cluster.py) reports each attempt's
failures and asks for re-admissions before it picks.
"""

from __future__ import annotations

import logging

from gateway.config.upstreams import OutlierDetection
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.observability.counters import Counters, Event, UpstreamCounters

log = logging.getLogger(__name__)


def ejection_time(base: float, maximum: float, ejections: int) -> float:
    """How long the ``ejections``-th ejection (1, 2, ...) lasts: growing linearly."""
    return min(maximum, base * ejections)


def decayed_ejections(ejections: int, healthy_for: float, base: float) -> int:
    """The ejection multiplier forgets one ejection per ``base`` seconds healthy."""
    return max(0, ejections - int(healthy_for // base))


class OutlierDetector:
    """Ejections and re-admissions among one cluster's endpoints."""

    __slots__ = ("_counters", "_endpoints", "_stats", "detection", "upstream")

    def __init__(self, upstream: str, detection: OutlierDetection, endpoints: list[Endpoint], counters: Counters,
                 stats: UpstreamCounters) -> None:
        self.upstream = upstream
        self.detection = detection
        self._endpoints = endpoints  # the cluster's live list
        self._counters = counters
        self._stats = stats

    def record_failure(self, endpoint: Endpoint, now: float) -> None:
        """An attempt on ``endpoint`` failed by the endpoint's doing."""
        endpoint.counters.failures_total += 1
        endpoint.consecutive_failures += 1
        detection = self.detection
        if (not detection.consecutive_failures or endpoint.consecutive_failures < detection.consecutive_failures
                or endpoint.ejected(now)):
            return
        ejected = sum(1 for e in self._endpoints if e.ejected(now))
        if ejected and (ejected + 1) * 100 > len(self._endpoints) * detection.max_ejection_percent:
            return  # enough of the cluster is out already
        endpoint.ejections = decayed_ejections(endpoint.ejections, now - endpoint.readmitted_at,
                                               detection.base_ejection_time) + 1
        duration = ejection_time(detection.base_ejection_time, detection.max_ejection_time, endpoint.ejections)
        endpoint.ejected_until = now + duration
        endpoint.counters.ejections_total += 1
        self._stats.ejections_total += 1
        log.warning("upstream %s endpoint %s ejected for %gs after %d consecutive failures", self.upstream,
                    endpoint.address, duration, endpoint.consecutive_failures)
        self._counters.emit(Event("ejection", self.upstream, endpoint.address, f"{duration:g}s"))

    def readmit_expired(self, now: float) -> None:
        for endpoint in self._endpoints:
            if endpoint.ejected_until is not None and now >= endpoint.ejected_until:
                endpoint.ejected_until = None
                endpoint.consecutive_failures = 0
                endpoint.readmitted_at = now
                log.info("upstream %s endpoint %s re-admitted", self.upstream, endpoint.address)
                self._counters.emit(Event("readmission", self.upstream, endpoint.address))
