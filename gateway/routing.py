"""Route matching and route decisions: pure functions over the frozen config, no I/O."""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.config import GatewayConfig, RouteConfig, StringMatch
from gateway.hashing import stable_hash
from gateway.protocols import registry

REQUEST_ID_HEADER = "x-request-id"
# Always forwarded, whatever the allowlist says: request id and W3C trace context.
ALWAYS_FORWARDED = ("traceparent", "tracestate")
# Hop-by-hop and framing headers belong to one connection or one encoding;
# the upstream client sets its own. Never forwarded, even when allowlisted;
# nor are the protocols' own framing headers (registry.framing_headers).
NEVER_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "content-type", "content-encoding",
    "accept-encoding", "expect",
})
NEVER_FORWARDED_PREFIXES = (":",)  # HTTP/2 pseudo-headers


def compile_match(match: StringMatch) -> Callable[[str | None], bool]:
    if match.kind == "present":
        return lambda value: value is not None
    if match.kind == "exact":
        return lambda value: value == match.pattern
    if match.kind == "glob":
        regex = re.compile(fnmatch.translate(match.pattern))
    else:
        regex = re.compile(match.pattern)
    return lambda value: value is not None and regex.fullmatch(value) is not None


def compile_allowlist(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Header names (lower case) or globs -> a predicate on lower-case names."""
    exact = frozenset(p for p in patterns if not any(c in p for c in "*?["))
    globs = [re.compile(fnmatch.translate(p)) for p in patterns if p not in exact]
    return lambda name: name in exact or any(g.fullmatch(name) for g in globs)


@dataclass(frozen=True, slots=True)
class Route:
    index: int
    config: RouteConfig
    _model: Callable[[str | None], bool]
    _version: Callable[[str | None], bool] | None
    _headers: tuple[tuple[str, Callable[[str | None], bool]], ...]
    # Split: (cumulative weight bound, upstream) for weights > 0, in order.
    _split: tuple[tuple[int, str], ...] = ()
    _forward: Callable[[str], bool] = lambda name: False
    _never: frozenset[str] = NEVER_FORWARDED
    _never_prefixes: tuple[str, ...] = NEVER_FORWARDED_PREFIXES

    @property
    def name(self) -> str:
        return self.config.name or f"route-{self.index}"

    @property
    def upstream(self) -> str:
        """The single target; for a split, the first upstream with weight."""
        return self.config.upstream or (self._split[0][1] if self._split else "")

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every upstream this route can send a request to (mirrors excluded)."""
        return tuple(name for _, name in self._split) if self.config.split else (self.config.upstream,)

    def pick_upstream(self, headers: Mapping[str, str], rng: random.Random) -> str:
        """The target of one request: weighted by chance, or by the sticky
        header's hash so one value always lands on the same upstream."""
        if not self.config.split:
            return self.config.upstream
        sticky = self.config.sticky_header
        value = headers.get(sticky) if sticky else None
        point = stable_hash(value) % 100 if value is not None else rng.randrange(100)
        for bound, upstream in self._split:
            if point < bound:
                return upstream
        return self._split[-1][1]  # unreachable: weights add up to 100

    def forward_headers(self, headers: Mapping[str, str], request_id: str) -> dict[str, str]:
        """What the upstream gets: allowlisted headers, the trace context and
        the request id; never hop-by-hop or framing headers."""
        forwarded = {name: value for name, value in headers.items()
                     if self._forward(name) and name not in self._never
                     and not name.startswith(self._never_prefixes)}
        for name in ALWAYS_FORWARDED:
            if name in headers:
                forwarded[name] = headers[name]
        if request_id:
            forwarded[REQUEST_ID_HEADER] = request_id
        return forwarded

    def matches(self, model: str, version: str, listener: str, protocol: str,
                headers: Mapping[str, str]) -> bool:
        match = self.config.match
        if match.listener is not None and match.listener != listener:
            return False
        if match.protocol is not None and match.protocol != protocol:
            return False
        if not self._model(model):
            return False
        if self._version is not None and not self._version(version):
            return False
        return all(test(headers.get(name)) for name, test in self._headers)

    def describe(self) -> str:
        m = self.config.match
        parts = [f"model={m.model.describe()}"]
        if m.version:
            parts.append(f"version={m.version.describe()}")
        if m.listener:
            parts.append(f"listener={m.listener}")
        if m.protocol:
            parts.append(f"protocol={m.protocol}")
        parts += [f"header[{name}]={h.describe()}" for name, h in m.headers]
        c = self.config
        if c.split:
            action = "-> " + ", ".join(f"{w.upstream} {w.weight}%" for w in c.split)
            if c.sticky_header:
                action += f" (sticky on {c.sticky_header})"
        else:
            action = f"-> {c.upstream}"
        rw = c.rewrite
        if rw.model or rw.version:
            action += f" (rewrite model={rw.model or '='} version={rw.version or '='})"
        if c.timeout is not None:
            action += f" timeout={c.timeout:g}s"
        if c.retry.attempts > 1:
            action += f" retry={c.retry.attempts}x[{','.join(c.retry.retry_on)}]"
        action += "".join(f" mirror={m.upstream}@{m.percent:g}%" for m in c.mirror)
        label = f"#{self.index}" + (f" {c.name}" if c.name else "")
        return f"{label} " + " ".join(parts) + " " + action


def build_route(index: int, rc: RouteConfig,
                never: tuple[frozenset[str], tuple[str, ...]] = (NEVER_FORWARDED, NEVER_FORWARDED_PREFIXES)) -> Route:
    """``never``: the header names and prefixes no route forwards."""
    bounds: list[tuple[int, str]] = []
    total = 0
    for target in rc.split:
        if target.weight > 0:
            total += target.weight
            bounds.append((total, target.upstream))
    return Route(index, rc, compile_match(rc.match.model),
                 compile_match(rc.match.version) if rc.match.version else None,
                 tuple((name, compile_match(h)) for name, h in rc.match.headers),
                 tuple(bounds), compile_allowlist(rc.forward_headers), never[0], never[1])


class RouteTable:
    """Ordered routes; the first match wins. Frozen; replaced whole on reload."""

    def __init__(self, config: GatewayConfig) -> None:
        names, prefixes = registry.framing_headers()
        never = (NEVER_FORWARDED | names, NEVER_FORWARDED_PREFIXES + prefixes)
        self.routes = tuple(build_route(i, rc, never) for i, rc in enumerate(config.routes))

    def resolve(self, model: str, version: str, listener: str, protocol: str,
                headers: Mapping[str, str]) -> Route | None:
        for route in self.routes:
            if route.matches(model, version, listener, protocol, headers):
                return route
        return None

    def explicit_models(self, listener: str | None = None) -> list[str]:
        """Model names routes spell out exactly (used to list models)."""
        names: list[str] = []
        for route in self.routes:
            m = route.config.match
            if listener is not None and m.listener not in (None, listener):
                continue
            if m.model.kind == "exact" and m.model.pattern not in names:
                names.append(m.model.pattern)
        return names

    def upstreams(self) -> set[str]:
        """Upstreams that some route sends requests to (readiness looks at these)."""
        return {name for route in self.routes for name in route.upstreams}

    def describe(self) -> list[str]:
        return [route.describe() for route in self.routes]
