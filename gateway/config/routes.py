"""The `routes:` section: what a request matches (model, version, listener,
protocol, headers) and what is done with it (upstream or split, rewrite,
retries, mirrors, forwarded headers, batching).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.catalog import ProtocolCatalog
from gateway.config.node import Node, percent, positive_duration, section
from gateway.config.policies import route_policies
from gateway.config.upstreams import UpstreamConfig
from gateway.core.modelnames import DOT_SEGMENTS


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
MAX_ATTEMPTS = 10  # of one request, the first try included


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


# Priority levels: 1 (highest) to MAX_PRIORITY; 0 means none given, ranked below them all.
MAX_PRIORITY = 32


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
    # Its requests' priority when they carry none: 1 is the highest; 0: the lowest.
    priority: int = 0


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
        if not section(item):
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
    if not section(node):
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
    per_try_timeout = positive_duration(node, "per_try_timeout", None)
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
        if not section(item):
            continue
        upstream = _upstream_name(item, "upstream", upstream_names)
        copied = percent(item, "percent", 100.0)
        item.check_no_unknown_keys()
        if upstream is not None:
            mirrors.append(Mirror(upstream, copied))
    return tuple(mirrors)


def _header_names(node: Node) -> tuple[str, ...]:
    if node.value is None:
        return ()
    if not isinstance(node.value, list) or not all(isinstance(x, str) and x for x in node.value):
        node.error("must be a list of header names (globs like 'x-tenant-*' allowed)")
        return ()
    return tuple(x.lower() for x in node.value)


def _batching(node: Node) -> BatchingConfig | None:
    if not section(node):
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
    timeout = positive_duration(item, "timeout", None)
    options = _route_options(item.child("options", {}), base_dir, registry)
    retry = _retry(item.child("retry", None))
    mirror = _mirrors(item.child("mirror", None), upstream_names)
    forward_headers = _header_names(item.child("forward_headers", None))
    forward_authorization = item.flag("forward_authorization", False)
    batching = _batching(item.child("batching", None))
    policies = route_policies(item.child("policies", None), policy_names)
    priority = item.integer("priority", 0, minimum=0)
    if isinstance(priority, int) and priority > MAX_PRIORITY:
        item.error(f"must be from 1 (highest) to {MAX_PRIORITY}, or 0 (the lowest); got {priority}", "priority")
    item.check_no_unknown_keys()
    if upstream is None or not (upstream or split):
        return None
    return RouteConfig(match, upstream, rewrite, timeout, options, split,
                       sticky_header.lower() if sticky_header else None, retry, mirror, forward_headers, name,
                       forward_authorization, batching, policies, priority)


def parse_routes(node: Node, listener_names: set[str], upstreams: list[UpstreamConfig], base_dir: Path,
                 protocols: ProtocolCatalog, policy_names: set[str]) -> list[RouteConfig]:
    """The `routes:` list, first match wins; ``upstreams`` the parsed ones
    (routes name them), ``policy_names`` the policies defined."""
    upstream_names = {x.name for x in upstreams}
    routes: list[RouteConfig] = []
    for item in node.items():
        route = _route(item, listener_names, upstream_names, base_dir, protocols, policy_names)
        if route is not None:
            if route.batching is not None:
                _check_batching(item, route, {x.name: x for x in upstreams})
            routes.append(route)
    return routes
