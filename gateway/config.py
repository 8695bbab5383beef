"""Gateway configuration: YAML -> validated, frozen dataclasses.

Validation lives here and in each protocol's ``parse_options``; every problem
is reported with its YAML path (``routes[2].match.model: ...``).
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.confignode import ConfigError, Node, expand_env

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
# Hardening limits (docs/security.md lists each with its reason).
DEFAULT_MAX_REQUEST_ELEMENTS = 1 << 26  # every wire form spends >= 1 byte per element
DEFAULT_MAX_REQUEST_TENSOR_BYTES = 256 << 20  # JSON numbers inflate up to 4x into FP64
DEFAULT_MAX_BYTES_ELEMENT = 16 << 20
DEFAULT_MAX_JSON_DEPTH = 64
MAX_JSON_DEPTH = 254  # deeper documents cannot be written back by orjson
DEFAULT_MAX_HEADER_LINE_BYTES = 8190  # aiohttp's own default
DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_GRPC_METADATA_BYTES = 16 << 10
DEFAULT_IDLE_TIMEOUT = 75.0  # above common load balancers' 60 s idle, as nginx
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_CONFIG_RESOURCE = "default_config.yaml"
DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

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
    max_header_line_bytes: int = DEFAULT_MAX_HEADER_LINE_BYTES  # HTTP request line and each header
    max_headers: int = DEFAULT_MAX_HEADERS  # HTTP header count
    max_grpc_metadata_bytes: int = DEFAULT_MAX_GRPC_METADATA_BYTES  # all metadata of a gRPC call
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # s: a new request's head must arrive within it
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # s: a request body must arrive within it
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # per listener
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS  # per listener; more: overloaded


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    name: str = "inference-gateway"
    version: str = ""  # empty: the package version


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    protocol: str
    address: Address
    options: Any = None  # the frontend's own parsed options


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    name: str
    protocol: str
    endpoints: tuple[Address, ...] = ()
    timeout: float | None = None  # seconds, per call, when a route sets none
    options: Any = None  # the backend's own parsed options


@dataclass(frozen=True, slots=True)
class StringMatch:
    """How a name is matched: exact, glob (``*``, ``?``, ``[..]``) or regex."""

    kind: str  # "exact" | "glob" | "regex" | "present"
    pattern: str = ""

    def describe(self) -> str:
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


@dataclass(frozen=True, slots=True)
class RouteConfig:
    match: RouteMatch
    upstream: str
    rewrite: Rewrite = Rewrite()
    timeout: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdminConfig:
    address: Address | None = Address("127.0.0.1", 8002)


@dataclass(frozen=True, slots=True)
class AccessLogConfig:
    enabled: bool = True
    format: str = "plain"  # "plain" (key=value) | "json"
    destination: str = "stdout"  # "stdout" | "stderr" | a file path (appended)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # Distinct model names used as label values; later names collapse to
    # gateway.metrics.OTHER_MODEL so a client cannot explode cardinality.
    max_model_labels: int = 100


@dataclass(frozen=True, slots=True)
class TracingConfig:
    enabled: bool = False  # needs the `tracing` extra (OpenTelemetry SDK)
    endpoint: str = DEFAULT_OTLP_ENDPOINT  # OTLP/HTTP (protobuf)
    service_name: str = "inference-gateway"
    sample_ratio: float = 1.0  # of new traces; a client's sampled flag is honoured


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
    observability: ObservabilityConfig = ObservabilityConfig()

    def upstream(self, name: str) -> UpstreamConfig:
        return next(u for u in self.upstreams if u.name == name)


# --- parsing ---------------------------------------------------------------


def _expand_tree(value: Any, path: str, problems: list[str]) -> Any:
    if isinstance(value, str):
        return expand_env(value, path, problems) if "$" in value else value
    if isinstance(value, list):
        return [_expand_tree(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand_tree(v, f"{path}.{k}" if path else str(k), problems) for k, v in value.items()}
    return value


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
    node.check_no_unknown_keys()
    return rewrite


def _protocol_options(node: Node, protocol: str | None, side: str) -> Any:
    from gateway.protocols import registry

    if protocol is None:
        return None
    try:
        component = registry.load(protocol, side)
    except KeyError:
        known = ", ".join(registry.names(side))
        node.error(f"unknown {side} protocol {protocol!r}; known: {known}", "protocol")
        return None
    return component.parse_options(node)


def _route_options(node: Node, base_dir: Path) -> dict[str, Any]:
    """A route's ``options``: keys naming a frontend protocol are parsed by
    that frontend (``parse_route_options``), other keys are kept as given."""
    from gateway.protocols import registry

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
    if tracing.enabled:
        from gateway.tracing import EXTRA_HINT, sdk_available

        if not sdk_available():
            tracing_node.error(f"needs the OpenTelemetry SDK; {EXTRA_HINT}", "enabled")
    tracing_node.check_no_unknown_keys()
    node.check_no_unknown_keys()
    return ObservabilityConfig(access_log, metrics, tracing)


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
        max_header_line_bytes=node.size("max_header_line_bytes", DEFAULT_MAX_HEADER_LINE_BYTES),
        max_headers=node.integer("max_headers", DEFAULT_MAX_HEADERS, minimum=1),
        max_grpc_metadata_bytes=node.size("max_grpc_metadata_bytes", DEFAULT_MAX_GRPC_METADATA_BYTES),
        idle_timeout=positive_duration("idle_timeout", DEFAULT_IDLE_TIMEOUT),
        body_timeout=positive_duration("body_timeout", DEFAULT_BODY_TIMEOUT),
        max_connections=node.integer("max_connections", DEFAULT_MAX_CONNECTIONS, minimum=1),
        max_concurrent_requests=node.integer("max_concurrent_requests", DEFAULT_MAX_CONCURRENT_REQUESTS, minimum=1),
    )
    if isinstance(limits.max_json_depth, int) and limits.max_json_depth > MAX_JSON_DEPTH:
        node.error(f"must be at most {MAX_JSON_DEPTH} (deeper JSON cannot be written back)", "max_json_depth")
    if isinstance(limits.max_header_line_bytes, int) and limits.max_header_line_bytes < 256:
        node.error("must be at least 256", "max_header_line_bytes")
    node.check_no_unknown_keys()
    return limits


def parse_config(data: Any, source: str = "<string>", base_dir: Path | None = None) -> GatewayConfig:
    """``base_dir``: where relative file paths in the config are resolved
    (the config file's folder; the current directory when None)."""
    base_dir = base_dir if base_dir is not None else Path.cwd()
    problems: list[str] = []
    root = Node(_expand_tree(data, "", problems), "", problems)
    if not root.is_mapping:
        raise ConfigError(["<root>: the configuration must be a mapping"])

    limits = _limits(root.child("limits", {}))

    server_node = root.child("server", {})
    server = ServerIdentity(server_node.string("name", "inference-gateway"), server_node.string("version", ""))
    server_node.check_no_unknown_keys()

    admin_node = root.child("admin", {})
    admin_address = admin_node.child("address", "127.0.0.1:8002")
    admin = AdminConfig(parse_address(admin_address) if admin_address.value is not None else None)
    admin_node.check_no_unknown_keys()

    listeners: list[ListenerConfig] = []
    listeners_node = root.child("listeners")
    for item in listeners_node.items():
        name, protocol = item.string("name"), item.string("protocol")
        address = parse_address(item.child("address"))
        options = _protocol_options(item, protocol, "frontend")
        item.check_no_unknown_keys()
        if name and protocol and address:
            listeners.append(ListenerConfig(name, protocol, address, options))
    _unique(listeners_node, _names_of(listeners_node), "listener")

    upstreams: list[UpstreamConfig] = []
    upstreams_node = root.child("upstreams")
    for item in upstreams_node.items():
        name, protocol = item.string("name"), item.string("protocol")
        endpoints = tuple(a for a in map(parse_address, item.child("endpoints", []).items()) if a)
        timeout = item.duration("timeout", None)
        options = _protocol_options(item, protocol, "backend")
        item.check_no_unknown_keys()
        if name and protocol:
            upstreams.append(UpstreamConfig(name, protocol, endpoints, timeout, options))
    _unique(upstreams_node, _names_of(upstreams_node), "upstream")

    listener_names = {x.name for x in listeners}
    upstream_names = {x.name for x in upstreams}
    routes: list[RouteConfig] = []
    for item in root.child("routes").items():
        match = _route_match(item.child("match", {}), listener_names)
        upstream = item.string("upstream")
        if upstream is not None and upstream not in upstream_names:
            item.error(f"names no upstream; known: {', '.join(sorted(upstream_names))}", "upstream")
        rewrite = _rewrite(item.child("rewrite", None))
        timeout = item.duration("timeout", None)
        options = _route_options(item.child("options", {}), base_dir)
        item.check_no_unknown_keys()
        if upstream:
            routes.append(RouteConfig(match, upstream, rewrite, timeout, options))

    observability = _observability(root.child("observability", {}))

    root.check_no_unknown_keys()
    if problems:
        raise ConfigError(problems)
    return GatewayConfig(tuple(listeners), tuple(upstreams), tuple(routes), admin, limits, server, source,
                         observability=observability)


def load_config(path: str | Path | None = None) -> GatewayConfig:
    """Load a YAML file, or the embedded default when ``path`` is None."""
    if path is None:
        package = importlib.resources.files("gateway")
        text = package.joinpath(DEFAULT_CONFIG_RESOURCE).read_text()
        source = "<embedded default>"
        base_dir = Path(str(package))  # the embedded config names package files
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError([f"<file>: cannot read {path}: {exc.strerror}"]) from None
        source = str(path)
        base_dir = Path(path).resolve().parent
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise ConfigError([f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}"]) from None
    return parse_config(data, source, base_dir)
