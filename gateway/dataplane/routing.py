"""Route matching and route decisions: pure functions over the frozen config, no I/O."""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.config.model import GatewayConfig
from gateway.config.routes import RouteConfig, RouteMatch, StringMatch
from gateway.config.view import redacted
from gateway.core.hashing import stable_hash

REQUEST_ID_HEADER = "x-request-id"
# Always forwarded, whatever the allowlist says: request id and W3C trace context.
ALWAYS_FORWARDED = ("traceparent", "tracestate")
# Hop-by-hop and framing headers belong to one connection or one encoding;
# the upstream client sets its own. Never forwarded, even when allowlisted;
# nor are the protocols' own framing headers (FramingHeaders: the app hands in the registry's).
NEVER_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "content-type", "content-encoding",
    "accept-encoding", "expect",
})
NEVER_FORWARDED_PREFIXES = (":",)  # HTTP/2 pseudo-headers
CONNECTION_HEADER = "connection"
AUTHORIZATION_HEADER = "authorization"


def connection_options(headers: Mapping[str, str]) -> frozenset[str]:
    """Header names a request's ``Connection`` header lists: they belong to
    the client's hop alone and are never forwarded (RFC 9110 §7.6.1)."""
    value = headers.get(CONNECTION_HEADER)
    if not value:
        return frozenset()
    return frozenset(name.strip().lower() for name in value.split(","))


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

    def pick_upstream(self, headers: Mapping[str, str], rng: random.Random, key: str | None = None) -> str:
        """The target of one request: weighted by chance, or by the hash of
        ``key`` (a sequence's id) or else of the sticky header's value, so
        one value always lands on the same upstream."""
        if not self.config.split:
            return self.config.upstream
        sticky = self.config.sticky_header
        value = key if key is not None else headers.get(sticky) if sticky else None
        point = stable_hash(value) % 100 if value is not None else rng.randrange(100)
        for bound, upstream in self._split:
            if point < bound:
                return upstream
        return self._split[-1][1]  # unreachable: weights add up to 100

    def forward_headers(self, headers: Mapping[str, str], request_id: str) -> dict[str, str]:
        """What the upstream gets: allowlisted headers, the trace context and
        the request id (the gateway's own, validated or made here); never
        hop-by-hop or framing headers, nor those the request's ``Connection``
        header names."""
        hop = connection_options(headers)
        forwarded = {name: value for name, value in headers.items()
                     if self._forward(name) and name not in self._never
                     and not name.startswith(self._never_prefixes) and name not in hop}
        for name in ALWAYS_FORWARDED:
            if name in headers:
                forwarded[name] = headers[name]
        if request_id:
            forwarded[REQUEST_ID_HEADER] = request_id
        return forwarded

    def forwards_authorization(self, headers: Mapping[str, str]) -> bool:
        """Whether the client's Authorization header goes upstream: when the
        route says so and the request did not name it in ``Connection``."""
        return self.config.forward_authorization and AUTHORIZATION_HEADER not in connection_options(headers)

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
        parts += [f"header[{name}]={redacted(name, h.describe())}" for name, h in m.headers]
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


# Every protocol's framing headers, exact names and prefixes
# (gateway.protocols.registry.framing_headers()): never forwarded.
FramingHeaders = tuple[frozenset[str], tuple[str, ...]]
NO_FRAMING_HEADERS: FramingHeaders = (frozenset(), ())


class RouteTable:
    """Ordered routes; the first match wins. Frozen; replaced whole on reload."""

    def __init__(self, config: GatewayConfig, framing_headers: FramingHeaders = NO_FRAMING_HEADERS) -> None:
        names, prefixes = framing_headers
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


# --- shadowed routes (gateway check) ----------------------------------------
# Conservative: "covers" is claimed only when it is provable from the
# patterns; a pair it cannot reason about (most regexes) is never reported.

_GLOB_SPECIAL = "*?["


def _literal(match: StringMatch) -> str | None:
    """The one value ``match`` accepts, when it accepts exactly one."""
    if match.kind == "exact" or (match.kind == "glob" and not any(c in match.pattern for c in _GLOB_SPECIAL)):
        return match.pattern
    return None


def _accepts_any_string(match: StringMatch) -> bool:
    return match.kind == "present" or (match.kind == "glob" and match.pattern != "" and set(match.pattern) == {"*"})


def match_covers(earlier: StringMatch | None, later: StringMatch | None) -> bool:
    """Provably, every value ``later`` accepts, ``earlier`` accepts too.
    ``None`` is no condition (any value, absent included). No StringMatch
    accepts an absent value, so one that takes every string covers all."""
    if earlier is None:
        return True
    if later is None:
        return False  # an absent header, or any version: no StringMatch takes all of those
    if _accepts_any_string(earlier):
        return True
    value = _literal(later)
    if value is not None:
        return compile_match(earlier)(value)
    if earlier.kind == "glob" and later.kind == "glob":
        # A prefix glob "p*" (no other wildcard) takes every name a glob
        # whose literal start begins with p does.
        prefix = earlier.pattern[:-1]
        if earlier.pattern.endswith("*") and not any(c in prefix for c in _GLOB_SPECIAL):
            start = re.split(r"[*?[]", later.pattern, maxsplit=1)[0]
            return start.startswith(prefix)
    return earlier == later


def route_match_covers(earlier: RouteMatch, later: RouteMatch) -> bool:
    """Provably, every request ``later`` matches, ``earlier`` matches too."""
    if earlier.listener is not None and earlier.listener != later.listener:
        return False
    if earlier.protocol is not None and earlier.protocol != later.protocol:
        return False
    if not match_covers(earlier.model, later.model):
        return False
    if later.version is None:  # any version: a string, "" when none was asked for
        if earlier.version is not None and not _accepts_any_string(earlier.version):
            return False
    elif not match_covers(earlier.version, later.version):
        return False
    later_headers = dict(later.headers)
    return all(name in later_headers and match_covers(test, later_headers[name]) for name, test in earlier.headers)


def shadowed_routes(routes: Sequence[RouteConfig]) -> list[tuple[int, int]]:
    """(shadowed, shadowing) route indexes: the first earlier route that
    matches every request a later one matches, so the later one never serves
    (first match wins)."""
    found: list[tuple[int, int]] = []
    for later in range(len(routes)):
        for earlier in range(later):
            if route_match_covers(routes[earlier].match, routes[later].match):
                found.append((later, earlier))
                break
    return found


def shadow_warnings(config: GatewayConfig) -> list[str]:
    """``routes[i]: ...`` for every route an earlier route shadows."""
    def name(index: int) -> str:
        return config.routes[index].name or f"route-{index}"

    return [f"routes[{later}]: route {name(later)!r} never serves a request: the earlier route {name(earlier)!r} "
            f"(routes[{earlier}]) matches every request it matches (first match wins)"
            for later, earlier in shadowed_routes(config.routes)]
