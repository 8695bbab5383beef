"""Gateway configuration: YAML -> validated, frozen dataclasses.

The document (GatewayConfig) composed of its sections, each parsed in its
own module (listeners.py, upstreams.py, routes.py, limits.py, server.py,
observability.py, ...) and in each protocol's ``parse_options``; every
problem is reported with its YAML path (``routes[2].match.model: ...``).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.catalog import ProtocolCatalog
from gateway.config.classification import ClassificationConfig, parse_classification
from gateway.config.environment import expand_tree, shown_as_written
from gateway.config.limits import Limits, parse_limits
from gateway.config.listeners import ListenerConfig, parse_listeners
from gateway.config.node import ConfigError, Node
from gateway.config.observability import ObservabilityConfig, parse_observability
from gateway.config.policies import FilterCatalog, PolicyConfig, parse_policies
from gateway.config.reader import load_yaml, read_config_text
from gateway.config.redis import RedisConfig, check_redis_users, parse_redis
from gateway.config.routes import RouteConfig, parse_routes
from gateway.config.server import (
    AdminConfig,
    DrainConfig,
    ReadinessConfig,
    ReloadConfig,
    ServerIdentity,
    parse_admin,
    parse_drain,
    parse_readiness,
    parse_reload,
    parse_server,
)
from gateway.config.upstreams import UpstreamConfig, parse_upstreams

DEFAULT_CONFIG_RESOURCE = "default.yaml"  # beside this module, in gateway.config


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
    return [f"upstream '{u.name}': circuit_breaker max_requests + "
            f"{'max_pending' if u.max_queue is None else 'max_queue'} ({u.holds}) is not "
            f"below limits.max_concurrent_requests ({slots}); if it hangs, it can hold every request slot of a "
            "listener and other models there are refused"
            for u in config.upstreams if u.endpoints and u.holds >= slots]


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


def parse_config(data: Any, source: str = "<string>", base_dir: Path | None = None, *,
                 protocols: ProtocolCatalog, filters: FilterCatalog | None = None) -> GatewayConfig:
    """``base_dir``: where relative file paths in the config are resolved
    (the config file's folder; the current directory when None)."""
    base_dir = base_dir if base_dir is not None else Path.cwd()
    problems: list[str] = []
    texts: dict[str, tuple[str, str]] = {}
    root = Node(expand_tree(data, "", problems, texts), "", problems)
    if not root.is_mapping:
        raise ConfigError(["<root>: the configuration must be a mapping"])

    limits = parse_limits(root.child("limits", {}))
    server = parse_server(root.child("server", {}))
    admin = parse_admin(root.child("admin", {}), base_dir)

    listeners_node = root.child("listeners")
    listeners = parse_listeners(listeners_node, admin.address, base_dir, protocols)
    _unique(listeners_node, _names_of(listeners_node), "listener")

    upstreams_node = root.child("upstreams")
    upstreams = parse_upstreams(upstreams_node, base_dir, protocols)
    _unique(upstreams_node, _names_of(upstreams_node), "upstream")

    policies = parse_policies(root.child("policies", None), filters)
    redis = parse_redis(root.child("redis", None))
    check_redis_users(root.child("policies", None), redis, policies)
    routes_node = root.child("routes")
    routes = parse_routes(routes_node, {x.name for x in listeners}, upstreams, base_dir, protocols,
                          {p.name for p in policies})
    _unique(routes_node, [n or None for n in _names_of(routes_node)], "route")

    drain = parse_drain(root.child("drain", None))
    readiness = parse_readiness(root.child("readiness", None))
    reload = parse_reload(root.child("reload", None))

    observability = parse_observability(root.child("observability", {}))
    classification = parse_classification(root.child("classification", {}), base_dir)

    root.check_no_unknown_keys()
    if problems:
        raise ConfigError(shown_as_written(problems, texts))
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
