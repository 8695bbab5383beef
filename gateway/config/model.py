"""Gateway configuration: YAML -> validated, frozen dataclasses.

Validation lives here and in each protocol's ``parse_options``; every problem
is reported with its YAML path (``routes[2].match.model: ...``).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.config.auth import CredentialConfig, SecretRef, parse_credential_config, parse_secret_ref
from gateway.config.classification import ClassificationConfig, parse_classification
from gateway.config.extensions import DEFAULT_EXTENSIONS, GATEWAY_EXTENSIONS
from gateway.config.node import ConfigError, EnvText, Node, expand_env, is_single_env_ref, type_scalar
from gateway.config.policies import FilterCatalog, PolicyConfig, parse_policies, route_policies
from gateway.config.reader import load_yaml, read_config_text
from gateway.config.redis import RedisConfig, check_redis_users, parse_redis
from gateway.config.tls import CLIENT_AUTH_MODES, ListenerTls, UpstreamTls, parse_listener_tls, parse_upstream_tls
from gateway.core.modelnames import DOT_SEGMENTS

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
# Hardening limits (docs/security.md lists each with its reason).
DEFAULT_MAX_REQUEST_ELEMENTS = 1 << 26  # every wire form spends >= 1 byte per element
DEFAULT_MAX_REQUEST_TENSOR_BYTES = 256 << 20  # JSON numbers inflate up to 4x into FP64
DEFAULT_MAX_BYTES_ELEMENT = 16 << 20
DEFAULT_MAX_JSON_DEPTH = 64
# Arrays and objects in one JSON body: each costs ~0.1 µs of held interpreter
# to build and free, so this bounds one body's parse to ~25 ms of it.
DEFAULT_MAX_JSON_CONTAINERS = 1 << 18
MAX_JSON_DEPTH = 254  # deeper documents cannot be written back by orjson
DEFAULT_MAX_HEADER_LINE_BYTES = 8190  # aiohttp's own default
DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_GRPC_METADATA_BYTES = 16 << 10
DEFAULT_IDLE_TIMEOUT = 75.0  # above common load balancers' 60 s idle, as nginx
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_MAX_OPEN_STREAMS = 128
DEFAULT_MAX_STREAM_REQUESTS = 16
DEFAULT_STREAM_BUFFER_RESPONSES = 16
DEFAULT_MAX_SHARED_MEMORY_REGIONS = 256  # per listener and credential: one small file each
# Per worker: bodies and decoded tensors of every request in flight together
# (docs/security.md#memory-budget gives the worst case per worker).
DEFAULT_MAX_INFLIGHT_BYTES = 512 << 20
DEFAULT_CONFIG_RESOURCE = "default.yaml"  # beside this module, in gateway.config
DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    # Set on an address found by DNS discovery: the name it was resolved
    # from, which clients present (Host, :authority, TLS server name).
    name: str | None = None

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]/\s]+)):(?P<port>\d{1,5})$")


def parse_address(node: Node) -> Address | None:
    text = node.value
    if not isinstance(text, str):
        node.error("must be an address 'host:port'")
        return None
    match = _ADDRESS.match(text.strip())
    port = int(match.group("port")) if match else -1
    if not match or port > 65535:
        node.error(f"must be an address 'host:port' with a port 0-65535; got {text!r}")
        return None
    return Address(match.group("v6") or match.group("host"), port)


def _bind_host(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | str:
    """An IP literal as its address (so spellings compare equal), a name lower-cased."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host.lower()


def addresses_overlap(a: Address, b: Address) -> bool:
    """Whether two sockets bound to ``a`` and ``b`` would take the same
    connections. A wildcard (``0.0.0.0``, ``::``) overlaps every address of
    its own family on that port; names are not resolved (only the same name
    overlaps); port 0 never overlaps, as each bind picks its own port."""
    if a.port != b.port or a.port == 0:
        return False
    ha, hb = _bind_host(a.host), _bind_host(b.host)
    if ha == hb:
        return True
    if isinstance(ha, str) or isinstance(hb, str) or ha.version != hb.version:
        return False
    return ha.is_unspecified or hb.is_unspecified


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Upper bound on the elements of one tensor, checked before allocating.
    max_tensor_elements: int = 1 << 31
    # Hardening (docs/security.md#limits): per request, per listener, per connection.
    max_request_elements: int = DEFAULT_MAX_REQUEST_ELEMENTS  # all tensors of a request together
    max_request_tensor_bytes: int = DEFAULT_MAX_REQUEST_TENSOR_BYTES  # decoded size, all tensors
    max_bytes_element: int = DEFAULT_MAX_BYTES_ELEMENT  # one element of a BYTES tensor
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH  # nesting of arrays and objects in JSON bodies
    max_json_containers: int = DEFAULT_MAX_JSON_CONTAINERS  # arrays and objects in one JSON body
    max_header_line_bytes: int = DEFAULT_MAX_HEADER_LINE_BYTES  # HTTP request line and each header
    max_headers: int = DEFAULT_MAX_HEADERS  # HTTP header count
    max_grpc_metadata_bytes: int = DEFAULT_MAX_GRPC_METADATA_BYTES  # all metadata of a gRPC call
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # s: a new request's head must arrive within it
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # s: a request body must arrive within it
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # per listener
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS  # per listener; more: overloaded
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES  # per worker: the memory budget; more: refused
    # Streams (gRPC ModelStreamInfer, docs/grpc.md#modelstreaminfer): open streams per listener, requests
    # of one stream in flight (more wait unread), responses waiting for a slow reader per stream.
    max_open_streams: int = DEFAULT_MAX_OPEN_STREAMS
    max_stream_requests: int = DEFAULT_MAX_STREAM_REQUESTS
    stream_buffer_responses: int = DEFAULT_STREAM_BUFFER_RESPONSES


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    name: str = "inference-gateway"
    version: str = ""  # empty: the package version
    # Triton extensions the gateway serves itself (listed in server metadata).
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    # System shared-memory regions one listener and credential may register (all workers together).
    max_shared_memory_regions: int = DEFAULT_MAX_SHARED_MEMORY_REGIONS


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    protocol: str
    address: Address
    options: Any = None  # the frontend's own parsed options
    tls: ListenerTls | None = None  # HTTPS / gRPC TLS (docs/security.md)
    auth: CredentialConfig | None = None  # tokens clients must present
    # HTTP listeners: serve hot requests on the httptools fast path (gateway/transport/http_server/fast.py)
    fast_path: bool = True


LOAD_BALANCING_POLICIES = ("round_robin", "least_request", "consistent_hash")


@dataclass(frozen=True, slots=True)
class LoadBalancing:
    policy: str = "round_robin"  # one of LOAD_BALANCING_POLICIES
    header: str | None = None  # consistent_hash: whose value picks the endpoint


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

    @property
    def holds(self) -> int:
        """The most requests the upstream can hold: in flight and waiting."""
        return self.max_requests + self.max_pending


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


@dataclass(frozen=True, slots=True)
class StringMatch:
    """How a name is matched: exact, glob (``*``, ``?``, ``[..]``) or regex."""

    kind: str  # "exact" | "glob" | "regex" | "present"
    pattern: str = ""

    def describe(self) -> str:
        if self.kind == "present":
            return "present"
        return self.pattern if self.kind in ("exact", "glob") else f"{self.kind}:{self.pattern}"


@dataclass(frozen=True, slots=True)
class RouteMatch:
    model: StringMatch = StringMatch("glob", "*")
    version: StringMatch | None = None
    listener: str | None = None
    protocol: str | None = None
    headers: tuple[tuple[str, StringMatch], ...] = ()


@dataclass(frozen=True, slots=True)
class Rewrite:
    model: str | None = None
    version: str | None = None


# Why a failed upstream attempt may be retried (see gateway/dataplane/retry.py).
RETRY_ON = ("connect-failure", "reset", "unavailable", "per-try-timeout")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 2  # in all, the first try included; 1 disables retries
    retry_on: tuple[str, ...] = ("connect-failure",)  # a subset of RETRY_ON
    per_try_timeout: float | None = None
    backoff: float = 0.025  # base of the jittered exponential backoff
    max_backoff: float = 0.25


@dataclass(frozen=True, slots=True)
class WeightedUpstream:
    upstream: str
    weight: int  # the weights of one split add up to 100


@dataclass(frozen=True, slots=True)
class Mirror:
    upstream: str
    percent: float = 100.0  # of requests copied to the shadow upstream


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """Dynamic batching: the route's inference requests that can share an
    upstream call are concatenated along dim 0 into one (gateway/dataplane/batching.py).
    The operator's promise that the model treats rows independently."""

    max_batch_size: int  # rows per upstream call at most
    max_delay_ms: float  # how long a batch may wait for more requests after its first
    # Sizes at which a batch is sent at once, without waiting out the delay.
    preferred_batch_sizes: tuple[int, ...] = ()
    # Requests waiting in the route's batches at most; past it: an overload error at once.
    max_queue: int | None = None


# Upstream protocols a batch can go to (their requests are tensors with a batch dimension).
BATCHING_PROTOCOLS = ("v2-rest", "v2-grpc", "builtin")
# Longest max_delay_ms: a batching delay is milliseconds, not a request deadline.
MAX_BATCH_DELAY_MS = 10_000.0


@dataclass(frozen=True, slots=True)
class RouteConfig:
    match: RouteMatch
    upstream: str  # "" when the route splits
    rewrite: Rewrite = Rewrite()
    timeout: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    split: tuple[WeightedUpstream, ...] = ()
    sticky_header: str | None = None  # split: hash this header's value, not chance
    retry: RetryPolicy = RetryPolicy()
    mirror: tuple[Mirror, ...] = ()
    forward_headers: tuple[str, ...] = ()  # names or globs, lower case
    name: str = ""  # for logs and metrics; empty: "route-<index>"
    # Pass the client's own Authorization header upstream (off: never sent).
    forward_authorization: bool = False
    batching: BatchingConfig | None = None  # dynamic batching; absent or null: none
    policies: tuple[str, ...] = ()  # names of policies (filters) its requests pass, in order


@dataclass(frozen=True, slots=True)
class AdminConfig:
    address: Address | None = Address("127.0.0.1", 8002)
    allow_remote_reload: bool = False  # POST /reload from non-loopback clients
    # Bearer token for every non-GET admin endpoint; without one such
    # endpoints answer only on a loopback address (docs/security.md).
    token: SecretRef | None = None


@dataclass(frozen=True, slots=True)
class DrainConfig:
    """SIGTERM: readiness false at once, keep serving ``delay`` seconds (load
    balancers lag), then close listeners and give in-flight work ``timeout``."""

    delay: float = 0.0
    timeout: float = 20.0


READINESS_MODES = ("any", "all", "ignore")


@dataclass(frozen=True, slots=True)
class ReadinessConfig:
    # any: some routed upstream has an available endpoint; all: every one has;
    # ignore: readiness does not depend on upstreams.
    upstreams: str = "any"


@dataclass(frozen=True, slots=True)
class ReloadConfig:
    watch_interval: float | None = None  # poll the config file for changes


@dataclass(frozen=True, slots=True)
class AccessLogConfig:
    enabled: bool = True
    format: str = "plain"  # "plain" (key=value) | "json"
    destination: str = "stdout"  # "stdout" | "stderr" | a file path (appended)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # Distinct model names used as label values; later names collapse to
    # gateway.observability.metrics.OTHER_MODEL so a client cannot explode cardinality.
    max_model_labels: int = 100


@dataclass(frozen=True, slots=True)
class TracingConfig:
    enabled: bool = False  # needs the `tracing` extra (OpenTelemetry SDK)
    endpoint: str = DEFAULT_OTLP_ENDPOINT  # OTLP/HTTP (protobuf)
    service_name: str = "inference-gateway"
    sample_ratio: float = 1.0  # of new traces; a client's sampled flag is honoured


TRACING_EXTRA_HINT = "install the tracing extra: pip install 'inference-gateway[tracing]'"


def tracing_sdk_available() -> bool:
    """Whether the tracing extra is installed (found, not imported: the
    config is checked before anything starts)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in (
            "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"))
    except ModuleNotFoundError:  # a parent package is missing
        return False


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    access_log: AccessLogConfig = AccessLogConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    listeners: tuple[ListenerConfig, ...]
    upstreams: tuple[UpstreamConfig, ...]
    routes: tuple[RouteConfig, ...]
    admin: AdminConfig = AdminConfig()
    limits: Limits = Limits()
    server: ServerIdentity = ServerIdentity()
    source: str = "<embedded>"
    drain: DrainConfig = DrainConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    reload: ReloadConfig = ReloadConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    classification: ClassificationConfig = field(default_factory=ClassificationConfig)
    policies: tuple[PolicyConfig, ...] = ()  # named filters routes list (gateway/config/policies.py)
    redis: RedisConfig | None = None  # the Redis server filters share (gateway/config/redis.py)

    def upstream(self, name: str) -> UpstreamConfig:
        return next(u for u in self.upstreams if u.name == name)


def starvation_warnings(config: GatewayConfig) -> list[str]:
    """Upstreams whose circuit breaker does not trip before a listener's
    limit: hung, they can take every request slot of a listener."""
    if len(config.upstreams) < 2:
        return []  # nothing else to starve
    slots = config.limits.max_concurrent_requests
    return [f"upstream '{u.name}': circuit_breaker max_requests + max_pending ({u.circuit_breaker.holds}) is not "
            f"below limits.max_concurrent_requests ({slots}); if it hangs, it can hold every request slot of a "
            "listener and other models there are refused"
            for u in config.upstreams if u.endpoints and u.circuit_breaker.holds >= slots]


# --- parsing ---------------------------------------------------------------


def _expand_tree(value: Any, path: str, problems: list[str], texts: dict[str, tuple[str, str]]) -> Any:
    """Substitute ``${VAR}`` in every string. A scalar that is exactly one
    reference becomes an EnvText (typed by the field that reads it), or None
    when it reads as YAML's null. ``texts`` collects path -> (result, written
    text) of substituted strings."""
    if isinstance(value, str):
        if "$" not in value:
            return value
        known = len(problems)
        expanded = str(expand_env(value, path, problems))
        if not is_single_env_ref(value):
            texts[path] = (expanded, value)
            return expanded
        if len(problems) > known or type_scalar(expanded) is None:
            return None  # as if absent; when unset, only "is not set" is reported, not also a type error
        texts[path] = (expanded, value)
        return EnvText(expanded)
    if isinstance(value, list):
        return [_expand_tree(v, f"{path}[{i}]", problems, texts) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand_tree(v, f"{path}.{k}" if path else str(k), problems, texts)
                for k, v in value.items()}
    return value


def _unexpanded(problems: list[str], texts: dict[str, tuple[str, str]]) -> list[str]:
    """Problems that quote a substituted string show it as written
    (``'${TOKEN}'``): the environment may hold secrets."""
    if not texts:
        return problems
    shown = []
    for problem in problems:
        where = problem.split(": ", 1)[0]
        for path, (expanded, written) in texts.items():  # the value's own problem, or its mapping's
            if path == where or path.startswith((where + ".", where + "[")):
                problem = problem.replace(repr(expanded), repr(written))
        shown.append(problem)
    return shown


def _string_match(node: Node, *, allow_present: bool = False) -> StringMatch | None:
    value = node.value
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        text = str(value)
        return StringMatch("glob" if any(c in text for c in "*?[") else "exact", text)
    if isinstance(value, dict) and len(value) == 1:
        (kind, pattern), = value.items()
        if kind == "regex" and isinstance(pattern, str):
            try:
                re.compile(pattern)
            except re.error as exc:
                node.error(f"invalid regex: {exc}")
                return None
            return StringMatch("regex", pattern)
        if kind in ("exact", "glob") and isinstance(pattern, str):
            return StringMatch(kind, pattern)
        if kind == "present" and allow_present and pattern is True:
            return StringMatch("present")
    forms = "a string (exact or glob), {exact: S}, {glob: S}, {regex: S}"
    node.error(f"must be {forms}" + (" or {present: true}" if allow_present else ""))
    return None


def _route_match(node: Node, listener_names: set[str]) -> RouteMatch:
    if not node.is_mapping:
        node.error("must be a mapping with model, version, listener, protocol or headers")
        return RouteMatch()
    model = _string_match(node.child("model")) if node.has("model") else StringMatch("glob", "*")
    version = _string_match(node.child("version")) if node.has("version") else None
    listener = node.string("listener", None)
    if listener is not None and listener not in listener_names:
        node.error(f"names no listener; known: {', '.join(sorted(listener_names))}", "listener")
    protocol = node.string("protocol", None)
    headers: list[tuple[str, StringMatch]] = []
    for name, header_node in node.child("headers", None).entries():
        matcher = _string_match(header_node, allow_present=True)
        if matcher:
            headers.append((name.lower(), matcher))
    node.check_no_unknown_keys()
    return RouteMatch(model or StringMatch("glob", "*"), version, listener, protocol, tuple(headers))


def _rewrite(node: Node) -> Rewrite:
    if node.value is None:
        return Rewrite()
    rewrite = Rewrite(node.string("model", None), node.string("version", None))
    for key, target in (("model", rewrite.model), ("version", rewrite.version)):
        if target in DOT_SEGMENTS:  # other targets are the operator's to choose (docs/security.md)
            node.error(f"{target!r} is a relative path segment: an upstream would read another path", key)
    node.check_no_unknown_keys()
    return rewrite


class ProtocolCatalog(Protocol):
    """What the config asks of the protocols: their names on a side
    ("frontend" or "backend") and each one's class there, for its option
    parsers (``parse_options``, ``parse_route_options``), its listener TLS
    modes (``TLS_CLIENT_AUTH_MODES``) and whether it needs endpoints
    (``needs_endpoints``). The app hands in gateway.protocols.registry, so
    the config imports no protocol."""

    def names(self, side: str) -> list[str]: ...

    def load(self, protocol: str, side: str) -> Any: ...


def _protocol_options(node: Node, protocol: str | None, side: str, registry: ProtocolCatalog) -> Any:
    if protocol is None:
        return None
    try:
        component = registry.load(protocol, side)
    except KeyError:
        known = ", ".join(registry.names(side))
        node.error(f"unknown {side} protocol {protocol!r}; known: {known}", "protocol")
        return None
    return component.parse_options(node)


def _client_auth_modes(protocol: str | None, registry: ProtocolCatalog) -> tuple[str, ...]:
    """The TLS client_auth modes a frontend's server library offers."""
    try:
        return registry.load(protocol or "", "frontend").TLS_CLIENT_AUTH_MODES  # type: ignore[no-any-return]
    except KeyError:
        return CLIENT_AUTH_MODES


def _route_options(node: Node, base_dir: Path, registry: ProtocolCatalog) -> dict[str, Any]:
    """A route's ``options``: keys naming a frontend protocol are parsed by
    that frontend (``parse_route_options``), other keys are kept as given."""
    options: dict[str, Any] = {}
    frontends = set(registry.names("frontend"))
    for key, child in node.entries():
        if key in frontends:
            options[key] = registry.load(key, "frontend").parse_route_options(child, base_dir)
        else:
            options[key] = child.value
    return options


def _names_of(node: Node) -> list[str | None]:
    items = node.value if isinstance(node.value, list) else []
    return [x.get("name") if isinstance(x, dict) else None for x in items]


def _unique(node: Node, names: list[str | None], what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in seen:
            node.error(f"duplicate {what} name {name!r}", i)  # type: ignore[arg-type]
        seen.add(name)


def _check_overlap(item: Node, name: str | None, address: Address, bound: list[tuple[str, Address]]) -> None:
    """Two listeners on one address: without SO_REUSEPORT the second bind
    fails at start; with it (``--workers N``) both bind and the kernel splits
    connections between them, silently. Either way, a config error."""
    for owner, other in bound:
        if addresses_overlap(address, other):
            item.error(f"listener {name!r} at {address} overlaps {owner} at {other}; "
                       "two sockets cannot serve one address", "address")


def _observability(node: Node) -> ObservabilityConfig:
    log_node = node.child("access_log", {})
    access_log = AccessLogConfig(
        enabled=log_node.flag("enabled", True),
        format=log_node.choice("format", ("plain", "json"), "plain"),
        destination=log_node.string("destination", "stdout"),
    )
    log_node.check_no_unknown_keys()
    metrics_node = node.child("metrics", {})
    metrics = MetricsConfig(max_model_labels=metrics_node.integer("max_model_labels", 100, minimum=0))
    metrics_node.check_no_unknown_keys()
    tracing_node = node.child("tracing", {})
    tracing = TracingConfig(
        enabled=tracing_node.flag("enabled", False),
        endpoint=tracing_node.string("endpoint", DEFAULT_OTLP_ENDPOINT),
        service_name=tracing_node.string("service_name", "inference-gateway"),
        sample_ratio=tracing_node.get("sample_ratio", float, 1.0),
    )
    if not 0.0 <= tracing.sample_ratio <= 1.0:
        tracing_node.error("must be between 0 and 1", "sample_ratio")
    if tracing.enabled and not tracing_sdk_available():
        tracing_node.error(f"needs the OpenTelemetry SDK; {TRACING_EXTRA_HINT}", "enabled")
    tracing_node.check_no_unknown_keys()
    node.check_no_unknown_keys()
    return ObservabilityConfig(access_log, metrics, tracing)


# --- upstream sections (clusters) ------------------------------------------


def _positive_duration(node: Node, key: str, default: Any) -> Any:
    value = node.duration(key, default)
    if value is not None and value <= 0:
        node.error("must be more than 0", key)
    return value


def _percent(node: Node, key: str, default: float) -> float:
    value = node.get(key, float, default)
    if not 0 <= value <= 100:
        node.error(f"must be a percentage from 0 to 100, got {value:g}", key)
    return float(value)


def _section(node: Node) -> bool:
    """True when ``node`` holds a mapping to read; null means defaults."""
    if node.value is None:
        return False
    if not node.is_mapping:
        node.error("must be a mapping")
        return False
    return True


def _load_balancing(node: Node) -> LoadBalancing:
    if isinstance(node.value, str):
        if node.value not in LOAD_BALANCING_POLICIES:
            node.error(f"must be one of {', '.join(LOAD_BALANCING_POLICIES)}; got {node.value!r}")
        elif node.value == "consistent_hash":
            node.error("consistent_hash needs a header: {policy: consistent_hash, header: x-session-id}")
        return LoadBalancing(node.value if node.value in LOAD_BALANCING_POLICIES else "round_robin")
    if not _section(node):
        return LoadBalancing()
    policy = node.choice("policy", LOAD_BALANCING_POLICIES, "round_robin")
    header = node.string("header", None)
    if policy == "consistent_hash" and not header:
        node.error("is required by consistent_hash", "header")
    if policy != "consistent_hash" and header is not None:
        node.error("only applies to consistent_hash", "header")
    node.check_no_unknown_keys()
    return LoadBalancing(policy, header.lower() if header else None)


def _health_check(node: Node) -> HealthCheck | None:
    if not _section(node):
        return None
    d = HealthCheck()
    check = HealthCheck(
        interval=_positive_duration(node, "interval", d.interval),
        timeout=_positive_duration(node, "timeout", d.timeout),
        unhealthy_threshold=node.integer("unhealthy_threshold", d.unhealthy_threshold, minimum=1),
        healthy_threshold=node.integer("healthy_threshold", d.healthy_threshold, minimum=1),
    )
    node.check_no_unknown_keys()
    return check


def _outlier_detection(node: Node) -> OutlierDetection:
    d = OutlierDetection()
    if not _section(node):
        return d
    detection = OutlierDetection(
        consecutive_failures=node.integer("consecutive_failures", d.consecutive_failures, minimum=0),
        base_ejection_time=_positive_duration(node, "base_ejection_time", d.base_ejection_time),
        max_ejection_time=_positive_duration(node, "max_ejection_time", d.max_ejection_time),
        max_ejection_percent=int(_percent(node, "max_ejection_percent", d.max_ejection_percent)),
    )
    if detection.max_ejection_time < detection.base_ejection_time:
        node.error("must not be less than base_ejection_time", "max_ejection_time")
    node.check_no_unknown_keys()
    return detection


def _circuit_breaker(node: Node) -> CircuitBreaker:
    d = CircuitBreaker()
    if not _section(node):
        return d
    breaker = CircuitBreaker(node.integer("max_requests", d.max_requests, minimum=1),
                             node.integer("max_pending", d.max_pending, minimum=0))
    node.check_no_unknown_keys()
    return breaker


def _connection_pool(node: Node) -> ConnectionPool:
    d = ConnectionPool()
    if not _section(node):
        return d
    pool = ConnectionPool(node.integer("max_connections", d.max_connections, minimum=1))
    node.check_no_unknown_keys()
    return pool


def _retry_budget(node: Node) -> RetryBudget:
    d = RetryBudget()
    if not _section(node):
        return d
    budget = RetryBudget(_percent(node, "percent", d.percent),
                         node.integer("min_concurrency", d.min_concurrency, minimum=0))
    node.check_no_unknown_keys()
    return budget


def _sequence_affinity(node: Node) -> SequenceAffinity:
    d = SequenceAffinity()
    if not _section(node):
        return d
    affinity = SequenceAffinity(_positive_duration(node, "idle_timeout", d.idle_timeout),
                                node.integer("max_sequences", d.max_sequences, minimum=1))
    node.check_no_unknown_keys()
    return affinity


def _dns(node: Node) -> DnsDiscovery:
    d = DnsDiscovery()
    if not _section(node):
        return d
    nameservers = node.child("nameservers", [])
    dns = DnsDiscovery(
        discovery=node.flag("discovery", d.discovery),
        refresh=_positive_duration(node, "refresh", d.refresh),
        timeout=_positive_duration(node, "timeout", d.timeout),
        reconnect=None if node.has("reconnect") and node.child("reconnect").value is None
        else _positive_duration(node, "reconnect", d.reconnect),
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
    timeout = _positive_duration(item, "timeout", None)
    options = _protocol_options(item, protocol, "backend", registry)
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
    )
    item.check_no_unknown_keys()
    return upstream if name and protocol else None


# --- route actions ---------------------------------------------------------

MAX_ATTEMPTS = 10


def _upstream_name(node: Node, key: str, upstream_names: set[str]) -> str | None:
    name = node.string(key)
    if name is not None and name not in upstream_names:
        node.error(f"names no upstream; known: {', '.join(sorted(upstream_names))}", key)
    return name


def _split(node: Node, upstream_names: set[str]) -> tuple[WeightedUpstream, ...]:
    if node.value is None:
        return ()
    if not isinstance(node.value, list) or not node.value:
        node.error("must be a non-empty list of {upstream: NAME, weight: PERCENT}")
        return ()
    split: list[WeightedUpstream] = []
    for item in node.items():
        if not _section(item):
            continue
        upstream = _upstream_name(item, "upstream", upstream_names)
        weight = item.integer("weight", minimum=0)
        item.check_no_unknown_keys()
        if upstream is not None and isinstance(weight, int):
            if any(w.upstream == upstream for w in split):
                item.error(f"upstream {upstream!r} appears twice in this split", "upstream")
            split.append(WeightedUpstream(upstream, weight))
    total = sum(w.weight for w in split)
    if len(split) == len(node.value) and total != 100:
        node.error(f"weights must add up to 100, got {total}")
    return tuple(split)


def _retry(node: Node) -> RetryPolicy:
    d = RetryPolicy()
    if not _section(node):
        return d
    attempts = node.integer("attempts", d.attempts, minimum=1)
    if isinstance(attempts, int) and attempts > MAX_ATTEMPTS:
        node.error(f"must be at most {MAX_ATTEMPTS}", "attempts")
    retry_on = d.retry_on
    on_node = node.child("retry_on", None)
    if on_node.value is not None:
        if not isinstance(on_node.value, list) or not all(isinstance(x, str) for x in on_node.value):
            on_node.error(f"must be a list of: {', '.join(RETRY_ON)}")
        else:
            for i, reason in enumerate(on_node.value):
                if reason not in RETRY_ON:
                    on_node.error(f"unknown retry condition {reason!r}; known: {', '.join(RETRY_ON)}", i)
            retry_on = tuple(x for x in on_node.value if x in RETRY_ON)
    per_try_timeout = _positive_duration(node, "per_try_timeout", None)
    if "per-try-timeout" in retry_on and per_try_timeout is None:
        node.error("retry_on names per-try-timeout, so per_try_timeout is required", "per_try_timeout")
    backoff = node.duration("backoff", d.backoff)
    max_backoff = node.duration("max_backoff", max(d.max_backoff, backoff or 0.0))
    if backoff is not None and max_backoff is not None and max_backoff < backoff:
        node.error("must not be less than backoff", "max_backoff")
    node.check_no_unknown_keys()
    return RetryPolicy(attempts, retry_on, per_try_timeout, backoff, max_backoff)


def _mirrors(node: Node, upstream_names: set[str]) -> tuple[Mirror, ...]:
    if node.value is None:
        return ()
    items = list(node.items()) if isinstance(node.value, list) else [node]
    mirrors: list[Mirror] = []
    for item in items:
        if not _section(item):
            continue
        upstream = _upstream_name(item, "upstream", upstream_names)
        percent = _percent(item, "percent", 100.0)
        item.check_no_unknown_keys()
        if upstream is not None:
            mirrors.append(Mirror(upstream, percent))
    return tuple(mirrors)


def _header_names(node: Node) -> tuple[str, ...]:
    if node.value is None:
        return ()
    if not isinstance(node.value, list) or not all(isinstance(x, str) and x for x in node.value):
        node.error("must be a list of header names (globs like 'x-tenant-*' allowed)")
        return ()
    return tuple(x.lower() for x in node.value)


def _batching(node: Node) -> BatchingConfig | None:
    if not _section(node):
        return None
    max_batch_size = node.integer("max_batch_size", minimum=1)
    max_delay_ms = node.get("max_delay_ms", float)
    if isinstance(max_delay_ms, float) and not 0 <= max_delay_ms <= MAX_BATCH_DELAY_MS:
        node.error(f"must be a number of milliseconds from 0 to {MAX_BATCH_DELAY_MS:g}, got {max_delay_ms:g}",
                   "max_delay_ms")
    preferred: tuple[int, ...] = ()
    sizes = node.child("preferred_batch_sizes", None)
    if sizes.value is not None:
        if not isinstance(sizes.value, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in sizes.value):
            sizes.error("must be a list of row counts (integers >= 1)")
        else:
            preferred = tuple(sorted(set(sizes.value)))
            if isinstance(max_batch_size, int) and preferred and preferred[-1] > max_batch_size:
                sizes.error(f"{preferred[-1]} is more than max_batch_size ({max_batch_size})")
    max_queue = node.integer("max_queue", None, minimum=1)
    node.check_no_unknown_keys()
    if not isinstance(max_batch_size, int) or not isinstance(max_delay_ms, float):
        return None
    return BatchingConfig(max_batch_size, max_delay_ms, preferred, max_queue)


def _check_batching(item: Node, route: RouteConfig, upstreams: Mapping[str, UpstreamConfig]) -> None:
    """Batching needs upstreams whose requests are tensors with a batch dimension."""
    names = [route.upstream] if route.upstream else [w.upstream for w in route.split]
    for name in names:
        upstream = upstreams.get(name)
        if upstream is not None and upstream.protocol not in BATCHING_PROTOCOLS:
            item.error(f"upstream {name!r} speaks {upstream.protocol}; batching needs an upstream of "
                       f"protocol {', '.join(BATCHING_PROTOCOLS)}", "batching")


def _route(item: Node, listener_names: set[str], upstream_names: set[str], base_dir: Path,
           registry: ProtocolCatalog, policy_names: set[str]) -> RouteConfig | None:
    match = _route_match(item.child("match", {}), listener_names)
    name = item.string("name", "")
    if item.has("upstream") == item.has("split"):
        item.error("needs exactly one of 'upstream' (one target) or 'split' (weighted targets)")
    upstream = _upstream_name(item, "upstream", upstream_names) if item.has("upstream") else ""
    split = _split(item.child("split", None), upstream_names)
    sticky_header = item.string("sticky_header", None)
    if sticky_header is not None and not item.has("split"):
        item.error("only applies to routes with a split", "sticky_header")
    rewrite = _rewrite(item.child("rewrite", None))
    timeout = _positive_duration(item, "timeout", None)
    options = _route_options(item.child("options", {}), base_dir, registry)
    retry = _retry(item.child("retry", None))
    mirror = _mirrors(item.child("mirror", None), upstream_names)
    forward_headers = _header_names(item.child("forward_headers", None))
    forward_authorization = item.flag("forward_authorization", False)
    batching = _batching(item.child("batching", None))
    policies = route_policies(item.child("policies", None), policy_names)
    item.check_no_unknown_keys()
    if upstream is None or not (upstream or split):
        return None
    return RouteConfig(match, upstream, rewrite, timeout, options, split,
                       sticky_header.lower() if sticky_header else None, retry, mirror, forward_headers, name,
                       forward_authorization, batching, policies)


# --- gateway-wide sections ---------------------------------------------------


def _drain(node: Node) -> DrainConfig:
    d = DrainConfig()
    if not _section(node):
        return d
    drain = DrainConfig(node.duration("delay", d.delay), node.duration("timeout", d.timeout))
    node.check_no_unknown_keys()
    return drain


def _readiness(node: Node) -> ReadinessConfig:
    if not _section(node):
        return ReadinessConfig()
    readiness = ReadinessConfig(node.choice("upstreams", READINESS_MODES, "any"))
    node.check_no_unknown_keys()
    return readiness


def _reload(node: Node) -> ReloadConfig:
    if not _section(node):
        return ReloadConfig()
    reload = ReloadConfig(_positive_duration(node, "watch_interval", None))
    node.check_no_unknown_keys()
    return reload


def _extensions(node: Node) -> tuple[str, ...]:
    names: list[str] = []
    for item in node.items():
        if item.value not in GATEWAY_EXTENSIONS:
            item.error(f"unknown extension {item.value!r}; known: {', '.join(GATEWAY_EXTENSIONS)}")
        elif item.value not in names:
            names.append(item.value)
    return tuple(names)


def _limits(node: Node) -> Limits:
    def positive_duration(key: str, default: float) -> float:
        value = node.duration(key, default)
        if value == 0:
            node.error("must be more than 0", key)
        return float(value)

    limits = Limits(
        max_request_bytes=node.size("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES),
        max_tensor_elements=node.integer("max_tensor_elements", 1 << 31, minimum=1),
        max_request_elements=node.integer("max_request_elements", DEFAULT_MAX_REQUEST_ELEMENTS, minimum=1),
        max_request_tensor_bytes=node.size("max_request_tensor_bytes", DEFAULT_MAX_REQUEST_TENSOR_BYTES),
        max_bytes_element=node.size("max_bytes_element", DEFAULT_MAX_BYTES_ELEMENT),
        max_json_depth=node.integer("max_json_depth", DEFAULT_MAX_JSON_DEPTH, minimum=2),
        max_json_containers=node.integer("max_json_containers", DEFAULT_MAX_JSON_CONTAINERS, minimum=16),
        max_header_line_bytes=node.size("max_header_line_bytes", DEFAULT_MAX_HEADER_LINE_BYTES),
        max_headers=node.integer("max_headers", DEFAULT_MAX_HEADERS, minimum=1),
        max_grpc_metadata_bytes=node.size("max_grpc_metadata_bytes", DEFAULT_MAX_GRPC_METADATA_BYTES),
        idle_timeout=positive_duration("idle_timeout", DEFAULT_IDLE_TIMEOUT),
        body_timeout=positive_duration("body_timeout", DEFAULT_BODY_TIMEOUT),
        max_connections=node.integer("max_connections", DEFAULT_MAX_CONNECTIONS, minimum=1),
        max_concurrent_requests=node.integer("max_concurrent_requests", DEFAULT_MAX_CONCURRENT_REQUESTS, minimum=1),
        max_inflight_bytes=node.size("max_inflight_bytes", DEFAULT_MAX_INFLIGHT_BYTES),
        max_open_streams=node.integer("max_open_streams", DEFAULT_MAX_OPEN_STREAMS, minimum=1),
        max_stream_requests=node.integer("max_stream_requests", DEFAULT_MAX_STREAM_REQUESTS, minimum=1),
        stream_buffer_responses=node.integer("stream_buffer_responses", DEFAULT_STREAM_BUFFER_RESPONSES,
                                             minimum=1),
    )
    if (isinstance(limits.max_inflight_bytes, int) and isinstance(limits.max_request_bytes, int)
            and limits.max_inflight_bytes < limits.max_request_bytes):
        node.error("must be at least limits.max_request_bytes (else the largest request never fits)",
                   "max_inflight_bytes")
    if isinstance(limits.max_json_depth, int) and limits.max_json_depth > MAX_JSON_DEPTH:
        node.error(f"must be at most {MAX_JSON_DEPTH} (deeper JSON cannot be written back)", "max_json_depth")
    if isinstance(limits.max_header_line_bytes, int) and limits.max_header_line_bytes < 256:
        node.error("must be at least 256", "max_header_line_bytes")
    node.check_no_unknown_keys()
    return limits


def parse_config(data: Any, source: str = "<string>", base_dir: Path | None = None, *,
                 protocols: ProtocolCatalog, filters: FilterCatalog | None = None) -> GatewayConfig:
    """``base_dir``: where relative file paths in the config are resolved
    (the config file's folder; the current directory when None)."""
    base_dir = base_dir if base_dir is not None else Path.cwd()
    problems: list[str] = []
    texts: dict[str, tuple[str, str]] = {}
    root = Node(_expand_tree(data, "", problems, texts), "", problems)
    if not root.is_mapping:
        raise ConfigError(["<root>: the configuration must be a mapping"])

    limits = _limits(root.child("limits", {}))

    server_node = root.child("server", {})
    server = ServerIdentity(server_node.string("name", "inference-gateway"), server_node.string("version", ""),
                            _extensions(server_node.child("extensions", list(DEFAULT_EXTENSIONS))),
                            server_node.integer("max_shared_memory_regions", DEFAULT_MAX_SHARED_MEMORY_REGIONS,
                                                minimum=1))
    server_node.check_no_unknown_keys()

    admin_node = root.child("admin", {})
    admin_address = admin_node.child("address", "127.0.0.1:8002")
    admin_token = parse_secret_ref(admin_node.child("token"), base_dir) if admin_node.has("token") else None
    admin = AdminConfig(parse_address(admin_address) if admin_address.value is not None else None,
                        admin_node.flag("allow_remote_reload", False), admin_token)
    admin_node.check_no_unknown_keys()

    listeners: list[ListenerConfig] = []
    listeners_node = root.child("listeners")
    bound: list[tuple[str, Address]] = [("the admin server", admin.address)] if admin.address else []
    for index, item in enumerate(listeners_node.items()):
        name, protocol = item.string("name"), item.string("protocol")
        address = parse_address(item.child("address"))
        options = _protocol_options(item, protocol, "frontend", protocols)
        tls = parse_listener_tls(item.child("tls", None), base_dir, _client_auth_modes(protocol, protocols))
        auth = parse_credential_config(item.child("auth", None), base_dir)
        fast_path = item.flag("fast_path", True)
        item.check_no_unknown_keys()
        if name and protocol and address:
            listeners.append(ListenerConfig(name, protocol, address, options, tls, auth, fast_path))
        if address:
            _check_overlap(item, name, address, bound)
            bound.append((f"listener {name!r} (listeners[{index}])", address))
    _unique(listeners_node, _names_of(listeners_node), "listener")

    upstreams: list[UpstreamConfig] = []
    upstreams_node = root.child("upstreams")
    for item in upstreams_node.items():
        upstream = _upstream(item, base_dir, protocols)
        if upstream is not None:
            upstreams.append(upstream)
    _unique(upstreams_node, _names_of(upstreams_node), "upstream")

    policies = parse_policies(root.child("policies", None), filters)
    redis = parse_redis(root.child("redis", None), parse_address)
    check_redis_users(root.child("policies", None), redis, policies)
    listener_names = {x.name for x in listeners}
    upstream_names = {x.name for x in upstreams}
    routes: list[RouteConfig] = []
    routes_node = root.child("routes")
    for item in routes_node.items():
        route = _route(item, listener_names, upstream_names, base_dir, protocols, {p.name for p in policies})
        if route is not None:
            if route.batching is not None:
                _check_batching(item, route, {x.name: x for x in upstreams})
            routes.append(route)
    _unique(routes_node, [n or None for n in _names_of(routes_node)], "route")

    drain = _drain(root.child("drain", None))
    readiness = _readiness(root.child("readiness", None))
    reload = _reload(root.child("reload", None))

    observability = _observability(root.child("observability", {}))
    classification = parse_classification(root.child("classification", {}), base_dir)

    root.check_no_unknown_keys()
    if problems:
        raise ConfigError(_unexpanded(problems, texts))
    return GatewayConfig(tuple(listeners), tuple(upstreams), tuple(routes), admin, limits, server, source,
                         drain, readiness, reload, observability, classification, policies, redis)


def load_config(path: str | Path | None = None, *, protocols: ProtocolCatalog,
                filters: FilterCatalog | None = None) -> GatewayConfig:
    """Load a YAML file, or the embedded default when ``path`` is None."""
    if path is None:
        package = importlib.resources.files("gateway.config")
        text = package.joinpath(DEFAULT_CONFIG_RESOURCE).read_text()
        source = "<embedded default>"
        base_dir = Path(str(package))  # the embedded config names package files
    else:
        text = read_config_text(path)
        source = str(path)
        base_dir = Path(path).resolve().parent
    return parse_config(load_yaml(text), source, base_dir, protocols=protocols, filters=filters)
