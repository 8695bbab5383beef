"""The `upstreams:` section (clusters): endpoints, load balancing, health
checks, outlier detection, circuit breaker, pool, retry budget, sequence
affinity, DNS discovery.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.address import Address, parse_address
from gateway.config.auth import CredentialConfig, parse_credential_config
from gateway.config.catalog import ProtocolCatalog, protocol_options
from gateway.config.node import Node, percent, positive_duration, section
from gateway.config.tls import UpstreamTls, parse_upstream_tls
from gateway.core.promtext import Labels, parse_selector

LOAD_BALANCING_POLICIES = ("round_robin", "least_request", "consistent_hash", "load_aware")
# The gauge each kind of server reports its load in (summed over its label sets).
LOAD_METRICS_PRESETS = {"triton": "nv_inference_pending_request_count", "mlserver": "rest_server_requests_in_progress"}


@dataclass(frozen=True, slots=True)
class LoadBalancing:
    policy: str = "round_robin"  # one of LOAD_BALANCING_POLICIES
    header: str | None = None  # consistent_hash: whose value picks the endpoint


@dataclass(frozen=True, slots=True)
class LoadMetrics:
    """Where load_aware reads each endpoint's load: one gauge of the
    endpoint's Prometheus text endpoint (docs/routing-and-resilience.md)."""

    preset: str | None = None  # triton or mlserver: the gauge that server reports its load in
    gauge: str | None = None  # any other server: 'metric_name{label="value",...}' (labels optional)
    port: int | None = None  # the metrics port on each endpoint's host; null: the endpoint's own port
    path: str = "/metrics"
    interval: float = 0.2  # between scrapes of each endpoint
    timeout: float = 1.0  # bound on one scrape; a slow one counts as failed
    stale_after: float = 2.0  # a load older than this is unknown: the pick falls back to least_request

    @property
    def selector(self) -> tuple[str, Labels]:
        """(metric name, labels a series must carry) of the gauge."""
        if self.preset is not None:
            return LOAD_METRICS_PRESETS[self.preset], ()
        return parse_selector(self.gauge or "") or ("", ())


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """Active health checks: each endpoint's protocol health call, periodically."""

    interval: float = 10.0
    timeout: float = 2.0
    unhealthy_threshold: int = 3  # consecutive failed checks to mark unhealthy
    healthy_threshold: int = 2  # consecutive passed checks to mark healthy again


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """Passive ejection of endpoints that fail requests in a row."""

    consecutive_failures: int = 5  # 0 disables ejection
    base_ejection_time: float = 30.0  # times the number of ejections so far
    max_ejection_time: float = 300.0
    max_ejection_percent: int = 50  # one endpoint may always be ejected


@dataclass(frozen=True, slots=True)
class CircuitBreaker:
    """Together the defaults are half of a listener's request slots
    (limits.max_concurrent_requests): one hung upstream is refused
    (UPSTREAM_OVERLOADED) before it can starve the other models."""

    max_requests: int = 96  # in flight to the whole upstream
    max_pending: int = 32  # waiting for a free slot; more are rejected at once


@dataclass(frozen=True, slots=True)
class ConnectionPool:
    max_connections: int = 128  # per endpoint: at most this many requests in flight on it


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Retries in flight may be at most ``percent`` of active requests
    (but always ``min_concurrency``), so retries cannot amplify an outage."""

    percent: float = 20.0
    min_concurrency: int = 3


DNS_FAMILIES = ("v4_preferred", "v4_only", "v6_only", "all")


@dataclass(frozen=True, slots=True)
class DnsDiscovery:
    """How endpoints given as DNS names become one endpoint per address
    (docs/routing-and-resilience.md, DNS discovery)."""

    # false: a name stays one endpoint and its client resolves it when connecting
    discovery: bool = True
    refresh: float = 5.0  # seconds between resolutions of each name
    timeout: float = 2.0  # bound on one resolution
    # a name resolving to one address (a ClusterIP Service): open new
    # connections this often so they spread over the pods; null: never
    reconnect: float | None = 60.0
    family: str = "v4_preferred"  # v4_preferred: IPv6 only when there is no IPv4 address
    # "host:port" of DNS servers asked over UDP; empty: the system resolver
    nameservers: tuple[Address, ...] = ()


@dataclass(frozen=True, slots=True)
class SequenceAffinity:
    """Requests carrying a sequence_id stick to the endpoint that answered
    the sequence's first request (gateway/dataplane/affinity.py)."""

    idle_timeout: float = 300.0  # seconds a pin outlives the sequence's last request
    max_sequences: int = 100_000  # pins kept; past it the least recently used is dropped


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    name: str
    protocol: str
    endpoints: tuple[Address, ...] = ()
    timeout: float | None = None  # seconds, per call, when a route sets none
    options: Any = None  # the backend's own parsed options
    load_balancing: LoadBalancing = LoadBalancing()
    health_check: HealthCheck | None = None  # None: no active checks
    outlier_detection: OutlierDetection = OutlierDetection()
    circuit_breaker: CircuitBreaker = CircuitBreaker()
    connection_pool: ConnectionPool = ConnectionPool()
    retry_budget: RetryBudget = RetryBudget()
    sequence_affinity: SequenceAffinity = SequenceAffinity()
    tls: UpstreamTls | None = None  # TLS / mTLS toward the endpoints
    auth: CredentialConfig | None = None  # a credential header sent on every call
    dns: DnsDiscovery = DnsDiscovery()  # endpoints given as names
    # Forward the client's bytes unchanged when client and upstream speak the
    # same protocol and nothing needs translation (docs/performance.md).
    passthrough: bool = True
    load_metrics: LoadMetrics | None = None  # load_aware: where each endpoint's load is read
    # Requests in flight on one endpoint from this gateway (with
    # connection_pool.max_connections, the lower one holds); null: no other limit.
    max_concurrent: int | None = None
    # Requests waiting for a slot, by priority; past it the lowest priority is
    # shed (OVERLOADED). null: circuit_breaker.max_pending bounds the line.
    max_queue: int | None = None

    @property
    def holds(self) -> int:
        """The most requests the upstream can hold: in flight and waiting."""
        waiting = self.circuit_breaker.max_pending if self.max_queue is None else self.max_queue
        return self.circuit_breaker.max_requests + waiting

    @property
    def endpoint_limit(self) -> int:
        """Requests in flight on one endpoint at most."""
        limit = self.connection_pool.max_connections
        return limit if self.max_concurrent is None else min(limit, self.max_concurrent)


def _load_balancing(node: Node) -> LoadBalancing:
    if isinstance(node.value, str):
        if node.value not in LOAD_BALANCING_POLICIES:
            node.error(f"must be one of {', '.join(LOAD_BALANCING_POLICIES)}; got {node.value!r}")
        elif node.value == "consistent_hash":
            node.error("consistent_hash needs a header: {policy: consistent_hash, header: x-session-id}")
        return LoadBalancing(node.value if node.value in LOAD_BALANCING_POLICIES else "round_robin")
    if not section(node):
        return LoadBalancing()
    policy = node.choice("policy", LOAD_BALANCING_POLICIES, "round_robin")
    header = node.string("header", None)
    if policy == "consistent_hash" and not header:
        node.error("is required by consistent_hash", "header")
    if policy != "consistent_hash" and header is not None:
        node.error("only applies to consistent_hash", "header")
    node.check_no_unknown_keys()
    return LoadBalancing(policy, header.lower() if header else None)


def _load_metrics(node: Node) -> LoadMetrics | None:
    if not section(node):
        return None
    d = LoadMetrics()
    preset = node.choice("preset", tuple(LOAD_METRICS_PRESETS), None)
    gauge = node.string("gauge", None)
    if (preset is None) == (gauge is None):
        node.error("needs exactly one of 'preset' (triton, mlserver) or 'gauge' (a metric name with labels)")
    elif gauge is not None and parse_selector(gauge) is None:
        node.error(f'must be a metric name, optionally with labels: name{{label="value"}}; got {gauge!r}', "gauge")
    port = node.integer("port", None, minimum=1)
    if isinstance(port, int) and port > 65535:
        node.error(f"must be a port number (1-65535), got {port}", "port")
    path = node.string("path", d.path)
    if isinstance(path, str) and (not path.startswith("/") or any(c.isspace() or ord(c) < 32 for c in path)):
        node.error(f"must be a URL path starting with '/' without spaces; got {path!r}", "path")
    metrics = LoadMetrics(preset, gauge, port, path, positive_duration(node, "interval", d.interval),
                          positive_duration(node, "timeout", d.timeout),
                          positive_duration(node, "stale_after", d.stale_after))
    if metrics.stale_after < metrics.interval:
        node.error("must not be less than interval (every load would be stale)", "stale_after")
    node.check_no_unknown_keys()
    return metrics


def _health_check(node: Node) -> HealthCheck | None:
    if not section(node):
        return None
    d = HealthCheck()
    check = HealthCheck(
        interval=positive_duration(node, "interval", d.interval),
        timeout=positive_duration(node, "timeout", d.timeout),
        unhealthy_threshold=node.integer("unhealthy_threshold", d.unhealthy_threshold, minimum=1),
        healthy_threshold=node.integer("healthy_threshold", d.healthy_threshold, minimum=1),
    )
    node.check_no_unknown_keys()
    return check


def _outlier_detection(node: Node) -> OutlierDetection:
    d = OutlierDetection()
    if not section(node):
        return d
    detection = OutlierDetection(
        consecutive_failures=node.integer("consecutive_failures", d.consecutive_failures, minimum=0),
        base_ejection_time=positive_duration(node, "base_ejection_time", d.base_ejection_time),
        max_ejection_time=positive_duration(node, "max_ejection_time", d.max_ejection_time),
        max_ejection_percent=int(percent(node, "max_ejection_percent", d.max_ejection_percent)),
    )
    if detection.max_ejection_time < detection.base_ejection_time:
        node.error("must not be less than base_ejection_time", "max_ejection_time")
    node.check_no_unknown_keys()
    return detection


def _circuit_breaker(node: Node) -> CircuitBreaker:
    d = CircuitBreaker()
    if not section(node):
        return d
    breaker = CircuitBreaker(node.integer("max_requests", d.max_requests, minimum=1),
                             node.integer("max_pending", d.max_pending, minimum=0))
    node.check_no_unknown_keys()
    return breaker


def _connection_pool(node: Node) -> ConnectionPool:
    d = ConnectionPool()
    if not section(node):
        return d
    pool = ConnectionPool(node.integer("max_connections", d.max_connections, minimum=1))
    node.check_no_unknown_keys()
    return pool


def _retry_budget(node: Node) -> RetryBudget:
    d = RetryBudget()
    if not section(node):
        return d
    budget = RetryBudget(percent(node, "percent", d.percent),
                         node.integer("min_concurrency", d.min_concurrency, minimum=0))
    node.check_no_unknown_keys()
    return budget


def _sequence_affinity(node: Node) -> SequenceAffinity:
    d = SequenceAffinity()
    if not section(node):
        return d
    affinity = SequenceAffinity(positive_duration(node, "idle_timeout", d.idle_timeout),
                                node.integer("max_sequences", d.max_sequences, minimum=1))
    node.check_no_unknown_keys()
    return affinity


def _dns(node: Node) -> DnsDiscovery:
    d = DnsDiscovery()
    if not section(node):
        return d
    nameservers = node.child("nameservers", [])
    dns = DnsDiscovery(
        discovery=node.flag("discovery", d.discovery),
        refresh=positive_duration(node, "refresh", d.refresh),
        timeout=positive_duration(node, "timeout", d.timeout),
        reconnect=None if node.has("reconnect") and node.child("reconnect").value is None
        else positive_duration(node, "reconnect", d.reconnect),
        family=node.choice("family", DNS_FAMILIES, d.family),
        nameservers=tuple(a for a in map(parse_address, nameservers.items()) if a),
    )
    for index, server in enumerate(dns.nameservers):
        try:
            ipaddress.ip_address(server.host)
        except ValueError:
            nameservers.error(f"must be an IP address and port; got {server}", index)
    node.check_no_unknown_keys()
    return dns


def _endpoints(item: Node, protocol: str | None, registry: ProtocolCatalog) -> tuple[Address, ...]:
    node = item.child("endpoints", [])
    endpoints = tuple(a for a in map(parse_address, node.items()) if a)
    for i, address in enumerate(endpoints):
        if address in endpoints[:i]:
            node.error(f"duplicate endpoint {address}", i)
    try:
        needs = protocol is not None and registry.load(protocol, "backend").needs_endpoints()
    except KeyError:
        needs = False  # reported as an unknown protocol
    if needs and not endpoints:
        item.error(f"protocol {protocol!r} needs at least one endpoint 'host:port'", "endpoints")
    return endpoints


def _upstream(item: Node, base_dir: Path, registry: ProtocolCatalog) -> UpstreamConfig | None:
    name, protocol = item.string("name"), item.string("protocol")
    endpoints = _endpoints(item, protocol, registry)
    timeout = positive_duration(item, "timeout", None)
    options = protocol_options(item, protocol, "backend", registry)
    upstream = UpstreamConfig(
        name, protocol, endpoints, timeout, options,
        load_balancing=_load_balancing(item.child("load_balancing", None)),
        health_check=_health_check(item.child("health_check", None)),
        outlier_detection=_outlier_detection(item.child("outlier_detection", None)),
        circuit_breaker=_circuit_breaker(item.child("circuit_breaker", None)),
        connection_pool=_connection_pool(item.child("connection_pool", None)),
        retry_budget=_retry_budget(item.child("retry_budget", None)),
        sequence_affinity=_sequence_affinity(item.child("sequence_affinity", None)),
        tls=parse_upstream_tls(item.child("tls", None), base_dir),
        auth=parse_credential_config(item.child("auth", None), base_dir),
        dns=_dns(item.child("dns", None)),
        passthrough=item.flag("passthrough", True),
        load_metrics=_load_metrics(item.child("load_metrics", None)),
        max_concurrent=item.integer("max_concurrent", None, minimum=1),
        max_queue=item.integer("max_queue", None, minimum=0),
    )
    load_aware = upstream.load_balancing.policy == "load_aware"
    if load_aware and upstream.load_metrics is None:
        item.error("load_balancing load_aware needs load_metrics: {preset: triton} (or mlserver, or a gauge)")
    if not load_aware and upstream.load_metrics is not None:
        item.error("only applies to load_balancing: load_aware", "load_metrics")
    item.check_no_unknown_keys()
    return upstream if name and protocol else None


def parse_upstreams(node: Node, base_dir: Path, protocols: ProtocolCatalog) -> list[UpstreamConfig]:
    """The `upstreams:` list (the clusters)."""
    upstreams: list[UpstreamConfig] = []
    for item in node.items():
        upstream = _upstream(item, base_dir, protocols)
        if upstream is not None:
            upstreams.append(upstream)
    return upstreams
