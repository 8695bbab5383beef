"""Prometheus metrics on an injected registry (never the global one).

One :class:`GatewayMetrics` per gateway process, held by ``GatewayServices``.
The hot path touches it twice per request: :meth:`GatewayMetrics.upstream_call`
around each upstream attempt and :meth:`GatewayMetrics.observe_request` once
when the answer has left. Label children are cached per label tuple, so a
request costs dictionary look-ups, not ``labels()`` validation.

Recording methods other modules call (names are the contract):

- ``upstream_call(record, upstream, endpoint)``: context manager around one
  upstream attempt (latency, outcome, in-flight; timeouts counted when a
  ``TimeoutError`` leaves it).
- ``record_retry(upstream)``, ``record_timeout(upstream)``,
  ``record_circuit_breaker_rejection(upstream)``,
  ``record_ejection(upstream, endpoint)``,
  ``set_endpoint_health(upstream, endpoint, healthy)``,
  ``record_reload(success)``, ``observe_translation(side, protocol, stage, seconds)``,
  ``record_access_log_dropped(lines)``, ``record_log_records_dropped(records)``,
  ``observe_loop_lag(seconds)``.

Several worker processes (``gateway serve --workers N``) share one directory
of memory-mapped files (prometheus-client's multiprocess mode); ``render``
then reports the sum over all workers, including workers that have died.
"""

from __future__ import annotations

import asyncio
import platform
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    values,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import OUTCOME_CANCELLED, OUTCOME_OK, RequestRecord, overhead_seconds
from gateway.observability.folded import FoldedCounter, FoldedGauge, FoldedHistogram

# Buckets per metric, fitted to its range (each bucket is one series per
# label set: docs/observability.md, "Cardinality").
# End-to-end and upstream latency, 100 µs .. 60 s in 1-2-5 steps: fine enough
# to see sub-millisecond proxy overhead, wide enough for slow models.
LATENCY_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                   1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
# Translating a small tensor takes tens of microseconds, a large one (offloaded)
# up to seconds: 10 µs .. 3 s in 1-3 steps.
TRANSLATION_BUCKETS = (0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
# The gateway's own time per request (end to end minus the upstream's): tens
# of microseconds for a pass-through, milliseconds when queued or translating
# big tensors; 10 µs .. 1 s in 1-2-5 steps.
OVERHEAD_BUCKETS = (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                    0.1, 0.2, 0.5, 1.0)
# Bodies, 64 B .. 1 GiB in powers of eight (sizes are for orientation, not SLOs).
SIZE_BUCKETS = tuple(float(64 * 8**i) for i in range(9))
# 1 ms .. 10 s: a healthy loop wakes within a millisecond or two; beyond tens
# of milliseconds something held it.
# Responses to one request of a stream: 1 for a unary model, many for a decoupled one.
STREAM_RESPONSE_BUCKETS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0)
LOOP_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# Dynamic batching: rows per upstream call, and a request's wait for its batch (max_delay_ms is a few ms).
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
BATCH_QUEUE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)

NO_MODEL = ""  # requests that name no model (health, server metadata)
OTHER_MODEL = "__other__"  # a new name after the cardinality cap was hit
UNKNOWN_MODEL = "__unknown__"  # a name that was not found, never admitted
MAX_MODEL_LABEL_CHARS = 128

REQUEST_LABELS = ("listener", "protocol", "operation", "model", "route", "upstream")
# The counter has every label; each histogram only those its queries group by,
# since a histogram label set costs one series per bucket. Route and upstream
# are on the counter (and upstream on the upstream histogram); sizes are
# per operation, not per model.
DURATION_LABELS = ("listener", "protocol", "operation", "model")
SIZE_LABELS = ("listener", "protocol", "operation")
OVERHEAD_LABELS = ("listener", "operation")
# The client's status, in one of two labels by its kind: an HTTP status (HTTP
# frontends; GraphStorm's envelope status_code) or a gRPC code name.
CODE_LABELS = ("http_code", "grpc_code")


def code_labels(status: str) -> tuple[str, str]:
    """``(http_code, grpc_code)`` of a record's status: numeric statuses are
    HTTP's, gRPC's are code names (``NOT_FOUND``); the other label is empty."""
    return (status, "") if status.isdigit() else ("", status)


_TIMED_OUT = ErrorKind.UPSTREAM_TIMEOUT.value  # an enum's value is a property: read once


def outcome_of(exc: BaseException | None) -> str:
    """The outcome label for an exception leaving an upstream attempt."""
    if exc is None:
        return OUTCOME_OK
    if isinstance(exc, GatewayError):
        return exc.kind.value
    if isinstance(exc, TimeoutError):
        return _TIMED_OUT
    if isinstance(exc, asyncio.CancelledError):
        return OUTCOME_CANCELLED
    return ErrorKind.INTERNAL.value


class UpstreamCall:
    """Measures one upstream attempt; see :meth:`GatewayMetrics.upstream_call`."""

    __slots__ = ("_children", "_deadline", "_metrics", "_record", "_started", "endpoint", "upstream")

    def __init__(self, metrics: GatewayMetrics, record: RequestRecord, upstream: str, endpoint: str,
                 deadline: asyncio.Timeout | None = None) -> None:
        self._metrics = metrics
        self._deadline = deadline
        self._record = record
        self.upstream = upstream
        self.endpoint = endpoint
        self._children = metrics._upstream_children(upstream, record.operation)
        self._started = 0.0

    def __enter__(self) -> UpstreamCall:
        self._children[0].inc()
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self._started
        in_flight, duration = self._children
        in_flight.dec()
        duration.observe(elapsed)
        outcome = outcome_of(exc)
        if outcome == OUTCOME_CANCELLED and self._deadline is not None and self._deadline.expired():
            outcome = _TIMED_OUT  # cut off by the request's deadline
        self._metrics._upstream_counter(self.upstream, self.endpoint, outcome).inc()
        if outcome == _TIMED_OUT:
            self._metrics.record_timeout(self.upstream)
        record = self._record
        record.upstream = self.upstream
        record.endpoint = self.endpoint
        record.upstream_seconds += elapsed
        record.upstream_attempts += 1


class _RequestSeries:
    """The series of one (listener, protocol, operation, model): its children
    bound once, so a request costs a look-up or two, not a ``labels()`` each."""

    __slots__ = ("_counters", "_labels", "_metrics", "_passthrough", "decode", "duration", "encode", "overhead",
                 "request_size", "response_size")

    def __init__(self, metrics: GatewayMetrics, listener: str, protocol: str, operation: str, model: str) -> None:
        self._metrics = metrics
        self._labels = (listener, protocol, operation, model)
        self.duration = metrics.request_duration.labels(listener, protocol, operation, model)
        self.overhead = metrics.overhead.labels(listener, operation)
        self.request_size = metrics.request_size.labels(listener, protocol, operation)
        self.response_size = metrics.response_size.labels(listener, protocol, operation)
        self.decode: Any = None  # the frontend's translation series, made when first observed
        self.encode: Any = None
        self._counters: dict[tuple[str, str, str, str], Any] = {}  # by route, upstream, status, outcome
        self._passthrough: dict[tuple[str, str], Any] = {}  # by upstream, mode

    def observe(self, record: RequestRecord, duration: float) -> None:
        key = (record.route, record.upstream, record.status, record.outcome)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.requests.labels(
                *self._labels, record.route, record.upstream, *code_labels(record.status), record.outcome)
        counter.inc()
        self.duration.observe(duration)
        self.overhead.observe(overhead_seconds(record, duration))
        self.request_size.observe(record.request_bytes)
        self.response_size.observe(record.response_bytes)
        if record.passthrough:
            mode = (record.upstream, record.passthrough)
            child = self._passthrough.get(mode)
            if child is None:
                listener, protocol = self._labels[:2]
                child = self._passthrough[mode] = self._metrics.passthrough.labels(listener, protocol, *mode)
            child.inc()
        if record.decode_seconds:
            if self.decode is None:
                self.decode = self._metrics.translation.labels("frontend", self._labels[1], "decode")
            self.decode.observe(record.decode_seconds)
        if record.encode_seconds:
            if self.encode is None:
                self.encode = self._metrics.translation.labels("frontend", self._labels[1], "encode")
            self.encode.observe(record.encode_seconds)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, *, version: str = "", max_model_labels: int = 100,
                 known_models: Iterable[str] = (), multiprocess_dir: str | None = None) -> None:
        if multiprocess_dir and not getattr(values.ValueClass, "_multiprocess", False):
            # prometheus-client picks its value store when first imported.
            raise RuntimeError("multiprocess metrics need PROMETHEUS_MULTIPROC_DIR set before "
                               "prometheus_client is imported")
        self.registry = registry
        self.multiprocess_dir = multiprocess_dir
        self.max_model_labels = max_model_labels
        self._models: set[str] = {m for m in known_models if len(m) <= MAX_MODEL_LABEL_CHARS}
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._request_series: dict[tuple[str, str, str, str], _RequestSeries] = {}
        r = registry

        # The series every request records, only ever on the event loop's
        # thread: plain numbers in one process (folded.py), prometheus-client's
        # shared files when there are workers.
        counter = Counter if multiprocess_dir else FoldedCounter
        histogram = Histogram if multiprocess_dir else FoldedHistogram
        gauge = Gauge if multiprocess_dir else FoldedGauge
        self.requests = counter(
            "gateway_requests", "Downstream requests answered, by listener, frontend protocol, operation, "
            "model, route, upstream, status (http_code or grpc_code, the other empty) and outcome (ok or an "
            "error kind).", (*REQUEST_LABELS, *CODE_LABELS, "outcome"), registry=r)
        self.request_duration = histogram(
            "gateway_request_duration_seconds", "End-to-end time from request received to response sent.",
            DURATION_LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = histogram(
            "gateway_overhead_seconds", "The gateway's own time per request: end to end minus the time waiting "
            "on upstream attempts (decoding, translating, encoding, queueing for an upstream slot).",
            OVERHEAD_LABELS, buckets=OVERHEAD_BUCKETS, registry=r)
        self.request_size = histogram(
            "gateway_request_size_bytes", "Request body size as received (after transfer coding).",
            SIZE_LABELS, buckets=SIZE_BUCKETS, registry=r)
        self.response_size = histogram(
            "gateway_response_size_bytes", "Response body size as sent (after compression).",
            SIZE_LABELS, buckets=SIZE_BUCKETS, registry=r)
        self.in_flight = gauge(
            "gateway_requests_in_flight", "Downstream requests being handled.",
            ("listener", "protocol"), multiprocess_mode="livesum", registry=r)
        self.translation = histogram(
            "gateway_translation_duration_seconds", "Time translating between a wire format and the "
            "canonical types; side is frontend or backend, stage is decode or encode.",
            ("side", "protocol", "stage"), buckets=TRANSLATION_BUCKETS, registry=r)
        self.passthrough = counter(
            "gateway_passthrough_requests", "Inference requests to an upstream of the client's own protocol, "
            "by how they were forwarded: verbatim, renamed (verbatim but the answer's model name rewritten), "
            "request_only (the answer translated) or translated.",
            ("listener", "protocol", "upstream", "mode"), registry=r)
        self.upstream_requests = counter(
            "gateway_upstream_requests", "Upstream attempts by upstream, endpoint and outcome.",
            ("upstream", "endpoint", "outcome"), registry=r)
        self.upstream_duration = histogram(
            "gateway_upstream_request_duration_seconds", "Time of one upstream attempt, from sending the "
            "request to the decoded answer.", ("upstream", "operation"), buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_in_flight = gauge(
            "gateway_upstream_requests_in_flight", "Upstream attempts under way.",
            ("upstream",), multiprocess_mode="livesum", registry=r)
        self.retries = Counter(
            "gateway_upstream_retries", "Upstream attempts that were retries.", ("upstream",), registry=r)
        self.timeouts = counter(
            "gateway_upstream_timeouts", "Upstream attempts that ran out of time.", ("upstream",), registry=r)
        self.circuit_breaker_rejections = Counter(
            "gateway_circuit_breaker_rejections", "Requests refused because an upstream's circuit "
            "breaker was open or its limits were reached.", ("upstream",), registry=r)
        self.outlier_ejections = Counter(
            "gateway_outlier_ejections", "Endpoints ejected by outlier detection.",
            ("upstream", "endpoint"), registry=r)
        self.endpoint_healthy = Gauge(
            "gateway_endpoint_healthy", "1 when the endpoint takes traffic, 0 when unhealthy or ejected "
            "(with several workers: the minimum over live workers).",
            ("upstream", "endpoint"), multiprocess_mode="livemin", registry=r)
        self.reloads = Counter(
            "gateway_config_reloads", "Configuration reloads by result (success or failure).",
            ("result",), registry=r)
        self.last_reload_success = Gauge(
            "gateway_config_last_reload_success_timestamp_seconds", "Unix time of the last successful "
            "configuration load or reload.", multiprocess_mode="max", registry=r)
        self.last_reload_successful = Gauge(
            "gateway_config_last_reload_successful", "1 if the last reload succeeded (with several "
            "workers: the minimum over live workers).", multiprocess_mode="livemin", registry=r)
        self.build_info = Gauge(
            "gateway_build_info", "Always 1; the labels carry the gateway and Python versions.",
            ("version", "python_version"), multiprocess_mode="max", registry=r)
        self.worker_processes = Gauge(
            "gateway_worker_processes", "Live gateway worker processes.", multiprocess_mode="livesum",
            registry=r)
        self.inflight_bytes = Gauge(
            "gateway_inflight_bytes", "Bytes of request bodies and decoded tensors in flight: the part of "
            "the memory budget (limits.max_inflight_bytes, per worker) in use.", multiprocess_mode="livesum",
            registry=r)
        self.budget_refusals = Counter(
            "gateway_inflight_budget_refusals", "Requests refused at once because the memory budget "
            "(limits.max_inflight_bytes) was spent.", registry=r)
        self.worker_restarts = Counter(
            "gateway_worker_restarts", "Worker processes restarted by the supervisor after they exited "
            "unexpectedly (counted by each restarted worker).", registry=r)
        self.access_log_dropped = Counter(
            "gateway_access_log_dropped", "Access-log lines dropped because the destination did not take "
            "them (the writer's queue was full) or a write failed.", registry=r)
        self.log_records_dropped = Counter(
            "gateway_log_records_dropped", "Diagnostic log records (stderr) dropped because stderr did not "
            "take them.", registry=r)
        self.event_loop_lag = Histogram(
            "gateway_event_loop_lag_seconds", "How much later than due the event loop ran a timer "
            "(sampled every 50 ms): the time something held the loop.", buckets=LOOP_LAG_BUCKETS, registry=r)
        # DNS discovery (gateway/dataplane/cluster/discovery.py).
        self.dns_failures = Counter(
            "gateway_dns_resolution_failures", "Resolutions of an upstream endpoint name that failed (the "
            "last known addresses are kept).", ("upstream",), registry=r)

        # Streams (gRPC ModelStreamInfer): a block of its own, by listener and protocol.
        self.open_streams = Gauge(
            "gateway_open_streams", "Open streams (gRPC ModelStreamInfer calls).",
            ("listener", "protocol"), multiprocess_mode="livesum", registry=r)
        self.stream_responses = Histogram(
            "gateway_stream_responses_per_request", "Responses sent for one request of a stream (an error "
            "counts as one).", ("listener", "protocol"), buckets=STREAM_RESPONSE_BUCKETS, registry=r)
        self.stream_first_response = Histogram(
            "gateway_stream_first_response_seconds", "Time from reading a request of a stream to its first "
            "response being ready to send.", ("listener", "protocol"), buckets=LATENCY_BUCKETS, registry=r)

        # Dynamic batching (gateway/dataplane/batching.py), by route: few buckets, one series each.
        self.batch_size = Histogram(
            "gateway_batch_size", "Rows per upstream call of a batching route.", ("route",),
            buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_queue = Histogram(
            "gateway_batch_queue_seconds", "Time a request of a batching route waited for its batch to be "
            "sent.", ("route",), buckets=BATCH_QUEUE_BUCKETS, registry=r)

        self.build_info.labels(version, platform.python_version()).set(1)
        self.worker_processes.set(1)
        for result in ("success", "failure"):
            self.reloads.labels(result)
        if not multiprocess_dir:
            # Per-process facts; not aggregated in multiprocess mode.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        # Response caches (gateway/dataplane/filters/response_cache.py): what each looked-up request got.
        self.cache_requests = Counter(
            "gateway_cache_requests", "Inference requests on routes with a response cache, by result: hit "
            "(answered from the cache), miss (sent upstream; a successful answer is stored), skip (never "
            "cached: sequences, streams, mirrored routes, requests without tensors).", ("result",), registry=r)
        self.cache_redis_errors = Counter(
            "gateway_cache_redis_errors", "Look-ups and stores of a response cache with backend: redis that "
            "went without Redis, by policy and error: unavailable (Redis did not answer within redis.timeout "
            "or refused: a miss, or the answer not stored), invalid (the value read was no entry for its key: "
            "a miss).", ("policy", "error"), registry=r)
        # Payload logging (gateway/dataplane/filters/payload_log.py): events by what became of them.
        self.payload_log = Counter(
            "gateway_payload_log", "Payload-log events (CloudEvents to a sink) by result: sent (the sink "
            "answered 2xx), failed (refused, an error answer or no answer within the timeout), dropped (the "
            "queue or the memory budget was full).", ("result",), registry=r)
        self._payload_log = {result: self.payload_log.labels(result) for result in ("sent", "dropped", "failed")}

        # Rate limits (gateway/dataplane/filters/rate_limit.py), by policy name.
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests a rate_limit policy refused (past its bucket).", ("policy",),
            registry=r)
        self.rate_limit_redis_errors = Counter(
            "gateway_rate_limit_redis_errors", "Requests a global rate_limit policy could not check because "
            "Redis did not answer in time, by what redis.on_error made of them.", ("policy", "decision"),
            registry=r)

        # Load-aware picking and priorities (gateway/dataplane/cluster/): by upstream.
        self.endpoint_load = Gauge(
            "gateway_endpoint_load", "The load an endpoint last reported in its own metrics (load_aware; "
            "NaN while unknown or stale).", ("upstream", "endpoint"), multiprocess_mode="livemostrecent", registry=r)
        self.shed = Counter(
            "gateway_shed", "Requests an upstream's full wait line (max_queue) refused, by the request's "
            "priority (1 highest; 0 none given).", ("upstream", "priority"), registry=r)

    # --- setup -------------------------------------------------------------

    def declare_upstream(self, upstream: str, endpoints: Iterable[str]) -> None:
        """Create an upstream's series at zero so rates exist from the start."""
        for counter in (self.retries, self.timeouts, self.circuit_breaker_rejections):
            counter.labels(upstream)
        self.upstream_in_flight.labels(upstream)
        for endpoint in endpoints:
            self.outlier_ejections.labels(upstream, endpoint)
            self.set_endpoint_health(upstream, endpoint, True)

    def record_config_loaded(self, now: float | None = None) -> None:
        self.last_reload_success.set(time.time() if now is None else now)
        self.last_reload_successful.set(1)

    # --- per request --------------------------------------------------------

    def requests_in_flight(self, listener: str, protocol: str) -> Any:
        """The pre-bound in-flight gauge of one listener (``inc``/``dec``)."""
        return self.in_flight.labels(listener, protocol)

    def streams_open(self, listener: str, protocol: str) -> Any:
        """The pre-bound open-streams gauge of one listener (``inc``/``dec``)."""
        return self.open_streams.labels(listener, protocol)

    def observe_stream_request(self, listener: str, protocol: str, responses: int,
                               first_response_seconds: float | None) -> None:
        """One finished request of a stream: its responses, and how soon the first came."""
        self.stream_responses.labels(listener, protocol).observe(responses)
        if first_response_seconds is not None:
            self.stream_first_response.labels(listener, protocol).observe(first_response_seconds)

    def upstream_call(self, record: RequestRecord, upstream: str, endpoint: str,
                      deadline: asyncio.Timeout | None = None) -> UpstreamCall:
        """``with metrics.upstream_call(ctx.record, name, endpoint): await ...``
        around each upstream attempt (retries included, one each). With the
        request's ``deadline``, an attempt it cancels counts as a timeout."""
        return UpstreamCall(self, record, upstream, endpoint, deadline)

    def model_label(self, model: str, outcome: str) -> str:
        """``model`` while the label set is under its cap; a fixed value after."""
        if not model or model in self._models:
            return model
        if outcome == ErrorKind.MODEL_NOT_FOUND.value:
            return UNKNOWN_MODEL  # a typo or a probe must not use up the cap
        if len(self._models) >= self.max_model_labels or len(model) > MAX_MODEL_LABEL_CHARS:
            return OTHER_MODEL
        self._models.add(model)
        return model

    def observe_request(self, listener: str, protocol: str, record: RequestRecord, duration: float) -> None:
        """Record one finished downstream request (called once per request)."""
        key = (listener, protocol, record.operation, self.model_label(record.model, record.outcome))
        series = self._request_series.get(key)
        if series is None:
            series = self._request_series[key] = _RequestSeries(self, *key)
        series.observe(record, duration)

    def observe_translation(self, side: str, protocol: str, stage: str, seconds: float) -> None:
        key = ("translation", side, protocol, stage)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = self.translation.labels(side, protocol, stage)
        child.observe(seconds)

    def _upstream_children(self, upstream: str, operation: str) -> tuple[Any, Any]:
        key = ("upstream", upstream, operation)
        children = self._cache.get(key)
        if children is None:
            children = self._cache[key] = (self.upstream_in_flight.labels(upstream),
                                           self.upstream_duration.labels(upstream, operation))
        return children  # type: ignore[no-any-return]

    def _upstream_counter(self, upstream: str, endpoint: str, outcome: str) -> Any:
        key = ("upstream_requests", upstream, endpoint, outcome)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = self.upstream_requests.labels(upstream, endpoint, outcome)
        return child

    # --- resilience events (wired by the proxy and server) ------------------

    def record_retry(self, upstream: str) -> None:
        self.retries.labels(upstream).inc()

    def record_timeout(self, upstream: str) -> None:
        self.timeouts.labels(upstream).inc()

    def record_circuit_breaker_rejection(self, upstream: str) -> None:
        self.circuit_breaker_rejections.labels(upstream).inc()

    def record_ejection(self, upstream: str, endpoint: str) -> None:
        self.outlier_ejections.labels(upstream, endpoint).inc()

    def set_endpoint_health(self, upstream: str, endpoint: str, healthy: bool) -> None:
        self.endpoint_healthy.labels(upstream, endpoint).set(1 if healthy else 0)

    def record_worker_restart(self) -> None:
        self.worker_restarts.inc()

    # --- the process itself (any thread) -------------------------------------------

    def record_access_log_dropped(self, lines: int) -> None:
        self.access_log_dropped.inc(lines)

    def record_log_records_dropped(self, records: int) -> None:
        self.log_records_dropped.inc(records)

    def observe_batch(self, route: str, rows: int, waits: list[float]) -> None:
        """One upstream call of a batching route: its rows, each member's wait."""
        self.batch_size.labels(route).observe(rows)
        queue = self.batch_queue.labels(route)
        for wait in waits:
            queue.observe(wait)

    def observe_loop_lag(self, seconds: float) -> None:
        self.event_loop_lag.observe(seconds)

    def record_reload(self, success: bool, now: float | None = None) -> None:
        self.reloads.labels("success" if success else "failure").inc()
        if success:
            self.record_config_loaded(now)
        else:
            self.last_reload_successful.set(0)

    # --- exposition -----------------------------------------------------------

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for a scrape: body and content type (Prometheus
        text, or OpenMetrics when the scraper asks for it). With workers it
        may raise one of TORN_READ_ERRORS: try again a moment later."""
        registry = self.registry
        if self.multiprocess_dir:
            registry = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(registry, path=self.multiprocess_dir)
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    def cache_result(self, result: str) -> Any:
        """The counter child of one response-cache result (created at zero);
        a cache keeps its children and counts with ``.inc()``."""
        return self.cache_requests.labels(result)
    def cache_redis_counters(self, policy: str) -> tuple[Any, Any]:
        """A redis-backed response cache's error series, made once (at zero)
        by its filter: unavailable, invalid."""
        return self.cache_redis_errors.labels(policy, "unavailable"), self.cache_redis_errors.labels(policy, "invalid")
    def record_payload_log(self, result: str, events: int) -> None:
        self._payload_log[result].inc(events)
    def rate_limit_counters(self, policy: str) -> tuple[Any, Any, Any]:
        """A rate_limit policy's series, made once (at zero) by its filter:
        refused, and Redis errors allowed and denied."""
        return (self.rate_limited.labels(policy), self.rate_limit_redis_errors.labels(policy, "allowed"),
                self.rate_limit_redis_errors.labels(policy, "denied"))

    def record_load_event(self, name: str, upstream: str, endpoint: str, detail: str) -> None:
        """A cluster's ``endpoint_load`` (detail: the load) or ``shed``
        (detail: the priority) event."""
        if name == "shed":
            self.shed.labels(upstream, detail).inc()
        else:
            self.endpoint_load.labels(upstream, endpoint).set(float(detail))


# What reading the workers' metric files can raise while a worker is
# creating its file (empty, not yet sized: struct.error) or one is being
# removed (FileNotFoundError): prometheus-client reads them without locks.
TORN_READ_ERRORS = (struct.error, RuntimeError, FileNotFoundError)


async def render_settled(metrics: GatewayMetrics, accept: str = "", attempts: int = 5) -> tuple[bytes, str]:
    """``metrics.render``, retried briefly past a torn read of a worker's
    metric file (a restarted worker creates its files as it starts)."""
    for _ in range(attempts - 1):
        try:
            return metrics.render(accept)
        except TORN_READ_ERRORS:
            await asyncio.sleep(0.02)
    return metrics.render(accept)


def metrics_hook(metrics: GatewayMetrics) -> Callable[[Any], None]:
    """Resilience events (gateway.observability.counters) as Prometheus metrics. Timeouts
    are counted per attempt by UpstreamCall, not from events."""

    def on_event(event: Any) -> None:
        name = event.name
        if name == "retry":
            metrics.record_retry(event.upstream)
        elif name == "overflow":
            metrics.record_circuit_breaker_rejection(event.upstream)
        elif name in ("shed", "endpoint_load"):
            metrics.record_load_event(name, event.upstream, event.endpoint, event.detail)
        elif name == "ejection":
            metrics.record_ejection(event.upstream, event.endpoint)
        elif name == "health_changed":
            metrics.set_endpoint_health(event.upstream, event.endpoint, event.detail == "healthy")
        elif name in ("reload_success", "reload_failure"):
            metrics.record_reload(name == "reload_success")
        # DNS discovery: endpoints come and go; a gone one's series go with it.
        elif name == "dns_failure":
            metrics.dns_failures.labels(event.upstream).inc()
        elif name == "endpoint_added":
            metrics.declare_upstream(event.upstream, [event.endpoint])
        elif name == "endpoint_removed":
            for gauge in (metrics.endpoint_healthy, metrics.outlier_ejections, metrics.endpoint_load):
                try:
                    gauge.remove(event.upstream, event.endpoint)
                except KeyError:
                    pass

    return on_event


def metrics_of(services: Any) -> GatewayMetrics:
    """``services.metrics``, or a private unexported set for callers (tests)
    that build a data plane without the full services."""
    metrics = getattr(services, "metrics", None)
    if isinstance(metrics, GatewayMetrics):
        return metrics
    return GatewayMetrics(CollectorRegistry(auto_describe=False))
