"""The per-request metrics of a single-process gateway are plain numbers
(gateway/observability/folded.py); a scrape must read exactly what
prometheus-client's own classes would show for the same observations."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gateway.observability.folded import FoldedCounter, FoldedGauge, FoldedHistogram
from gateway.observability.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, STREAM_RESPONSE_BUCKETS, GatewayMetrics

_CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def _record(counter: type[Counter], histogram: type[Histogram], gauge: type[Gauge],
            encode: Callable[[CollectorRegistry], bytes]) -> str:
    registry = CollectorRegistry()
    rng = random.Random(7)
    requests = counter("t_requests", "Requests.", ("listener", "outcome"), registry=registry)
    unlabelled = counter("t_refusals", "Refusals.", registry=registry)
    latency = histogram("t_seconds", "Latency.", ("listener",), buckets=LATENCY_BUCKETS, registry=registry)
    sizes = histogram("t_bytes", "Sizes.", buckets=SIZE_BUCKETS, registry=registry)
    responses = histogram("t_responses", "Responses.", ("listener",), buckets=STREAM_RESPONSE_BUCKETS,
                          registry=registry)
    in_flight = gauge("t_in_flight", "In flight.", ("listener",), multiprocess_mode="livesum", registry=registry)
    for i in range(2000):
        requests.labels(f"l{i % 3}", "ok" if i % 5 else "upstream_timeout").inc()
        unlabelled.inc(2)
        latency.labels(f"l{i % 2}").observe(rng.expovariate(2000))
        latency.labels("edges").observe(LATENCY_BUCKETS[i % len(LATENCY_BUCKETS)])  # exactly on a bound
        latency.labels("beyond").observe(100.0 + i)  # only in +Inf
        sizes.observe(rng.randrange(1 << 20))
        responses.labels("s").observe(i % 7)  # 0 is the first bound
        in_flight.labels("l").inc()
        in_flight.labels("l").dec()
        in_flight.labels("m").inc(0.5)
    in_flight.labels("set").set(3)
    # _created is the wall time a series was made: the one thing that differs.
    return _CREATED.sub(r"\1 T", encode(registry).decode())


@pytest.mark.parametrize("encode", [generate_latest, generate_openmetrics], ids=["prometheus", "openmetrics"])
def test_folded_metrics_render_as_prometheus_clients_own(encode: Callable[[CollectorRegistry], bytes]) -> None:
    own = _record(Counter, Histogram, Gauge, encode)
    folded = _record(FoldedCounter, FoldedHistogram, FoldedGauge, encode)
    assert "t_seconds_bucket" in own and "t_requests_created" in own
    assert folded == own


def test_single_process_gateway_metrics_record_per_request_series_without_locks() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    for metric in (metrics.requests, metrics.request_duration, metrics.request_size, metrics.response_size,
                   metrics.in_flight, metrics.translation, metrics.passthrough, metrics.upstream_requests,
                   metrics.upstream_duration, metrics.upstream_in_flight, metrics.timeouts):
        assert isinstance(metric, (FoldedCounter, FoldedHistogram, FoldedGauge)), metric
