"""Route matching, splits, header forwarding and the route/upstream config:
pure functions, no sockets."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from gateway.config.routes import RouteConfig, RouteMatch, StringMatch
from gateway.dataplane.routing import (
    RouteTable,
    build_route,
    match_covers,
    route_match_covers,
    shadow_warnings,
    shadowed_routes,
)
from gateway.protocols import registry


@pytest.fixture(autouse=True)
def fake_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.PROTOCOLS, "fake", "peers.fake_upstream")


HEAD = """
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: internal, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - {name: a, protocol: fake, endpoints: ["127.0.0.1:1"]}
  - {name: b, protocol: fake, endpoints: ["127.0.0.1:2"]}
  - {name: c, protocol: fake, endpoints: ["127.0.0.1:3"]}
"""


def table(routes: str) -> RouteTable:
    return RouteTable(parse_config(yaml.safe_load(HEAD + "routes:\n" + routes)), registry.framing_headers())


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_load(text))
    return caught.value.problems


def resolve(t: RouteTable, model: str, version: str = "", listener: str = "rest", protocol: str = "v2-rest",
            headers: dict[str, str] | None = None) -> int | None:
    route = t.resolve(model, version, listener, protocol, headers or {})
    return None if route is None else route.index


def test_first_match_wins_over_every_match_kind() -> None:
    t = table("""
  - {match: {model: exact_one}, upstream: a}
  - {match: {model: "resnet-*"}, upstream: a}
  - {match: {model: {regex: "^bert-(base|large)$"}}, upstream: b}
  - {match: {model: versioned, version: "2"}, upstream: b}
  - {match: {model: "*", listener: internal}, upstream: c}
  - {match: {model: "*", protocol: v2-grpc}, upstream: c}
  - {match: {model: "*", headers: {x-tenant: blue}}, upstream: a}
  - {match: {model: "*", headers: {x-canary: {present: true}}}, upstream: b}
  - {match: {model: "*", headers: {x-user: {regex: "^u[0-9]+$"}}}, upstream: c}
  - {match: {model: "resnet-*"}, upstream: c}
""")
    assert resolve(t, "exact_one") == 0
    assert resolve(t, "exact_one_more") is None
    assert resolve(t, "resnet-50") == 1
    assert resolve(t, "bert-base") == 2
    assert resolve(t, "bert-huge") is None
    assert resolve(t, "versioned", "2") == 3
    assert resolve(t, "versioned", "1") is None
    assert resolve(t, "anything", listener="internal") == 4
    assert resolve(t, "anything", protocol="v2-grpc") == 5
    assert resolve(t, "anything", headers={"x-tenant": "blue"}) == 6
    assert resolve(t, "anything", headers={"x-tenant": "red"}) is None
    assert resolve(t, "anything", headers={"x-canary": ""}) == 7
    assert resolve(t, "anything", headers={"x-user": "u42"}) == 8
    assert resolve(t, "anything", headers={"x-user": "admin"}) is None


def test_split_weights_and_zero_weight() -> None:
    t = table("""
  - match: {model: "*"}
    split: [{upstream: a, weight: 70}, {upstream: b, weight: 30}, {upstream: c, weight: 0}]
""")
    route = t.routes[0]
    assert route.upstreams == ("a", "b")
    assert t.upstreams() == {"a", "b"}
    rng = random.Random(7)
    counts = Counter(route.pick_upstream({}, rng) for _ in range(20000))
    assert counts["c"] == 0
    assert abs(counts["a"] / 20000 - 0.7) < 0.02


def test_sticky_split_is_stable_per_header_value() -> None:
    t = table("""
  - match: {model: "*"}
    split: [{upstream: a, weight: 50}, {upstream: b, weight: 50}]
    sticky_header: X-User
""")
    route = t.routes[0]
    rng = random.Random(1)
    chosen = {f"user-{i}": route.pick_upstream({"x-user": f"user-{i}"}, rng) for i in range(200)}
    for _ in range(3):
        assert all(route.pick_upstream({"x-user": u}, rng) == target for u, target in chosen.items())
    assert 60 < Counter(chosen.values())["a"] < 140  # both sides get users


def test_a_split_sends_one_sequence_id_to_one_upstream_whatever_the_chance() -> None:
    route = table("""
  - match: {model: "*"}
    split: [{upstream: a, weight: 50}, {upstream: b, weight: 50}]
""").routes[0]
    chosen = {f"i:{n}": {route.pick_upstream({}, random.Random(seed), f"i:{n}") for seed in range(8)}
              for n in range(200)}
    assert all(len(upstreams) == 1 for upstreams in chosen.values())
    assert 60 < sum(1 for upstreams in chosen.values() if upstreams == {"a"}) < 140  # both sides get sequences


def test_forward_headers_allowlist_and_always_forwarded() -> None:
    t = table("""
  - match: {model: "*"}
    upstream: a
    forward_headers: [X-Tenant, "x-feature-*", content-length, grpc-timeout]
""")
    headers = {"x-tenant": "t", "x-feature-a": "1", "x-secret": "s", "traceparent": "00-1-2-01",
               "tracestate": "k=v", "content-length": "12", "grpc-timeout": "1S", "x-request-id": "from-client"}
    forwarded = t.routes[0].forward_headers(headers, "rid-1")
    assert forwarded == {"x-tenant": "t", "x-feature-a": "1", "traceparent": "00-1-2-01", "tracestate": "k=v",
                         "x-request-id": "rid-1"}
    # No allowlist: only the request id and the trace context travel.
    plain = table("  - {match: {model: '*'}, upstream: a}").routes[0]
    assert plain.forward_headers(headers, "rid-2") == {"traceparent": "00-1-2-01", "tracestate": "k=v",
                                                       "x-request-id": "rid-2"}


def test_describe_shows_actions() -> None:
    t = table("""
  - name: canary
    match: {model: "m*"}
    split: [{upstream: a, weight: 90}, {upstream: b, weight: 10}]
    sticky_header: x-user
    timeout: 2s
    retry: {attempts: 3, retry_on: [connect-failure, unavailable]}
    mirror: {upstream: c, percent: 5}
""")
    assert t.describe() == [
        "#0 canary model=m* -> a 90%, b 10% (sticky on x-user) timeout=2s "
        "retry=3x[connect-failure,unavailable] mirror=c@5%"]
    assert t.routes[0].name == "canary"


def test_defaults_of_a_plain_upstream_and_route() -> None:
    config = parse_config(yaml.safe_load(HEAD + "routes: [{match: {model: '*'}, upstream: a}]"))
    upstream, route = config.upstreams[0], config.routes[0]
    assert upstream.load_balancing.policy == "round_robin"
    assert upstream.health_check is None
    assert upstream.outlier_detection.consecutive_failures == 5
    assert (upstream.circuit_breaker.max_requests, upstream.circuit_breaker.max_pending) == (96, 32)
    assert route.retry.attempts == 2 and route.retry.retry_on == ("connect-failure",)
    assert config.drain.delay == 0 and config.readiness.upstreams == "any"


def test_full_upstream_sections_parse() -> None:
    config = parse_config(yaml.safe_load("""
listeners: []
upstreams:
  - name: u
    protocol: fake
    endpoints: ["127.0.0.1:1", "127.0.0.1:2"]
    load_balancing: {policy: consistent_hash, header: X-Session}
    health_check: {interval: 2s, timeout: 300ms, unhealthy_threshold: 2, healthy_threshold: 1}
    outlier_detection: {consecutive_failures: 3, base_ejection_time: 10s, max_ejection_time: 1m,
                        max_ejection_percent: 100}
    circuit_breaker: {max_requests: 10, max_pending: 0}
    connection_pool: {max_connections: 4}
    retry_budget: {percent: 50, min_concurrency: 1}
routes: []
drain: {delay: 5s, timeout: 25s}
readiness: {upstreams: all}
reload: {watch_interval: 2s}
admin: {allow_remote_reload: true}
"""))
    u = config.upstreams[0]
    assert (u.load_balancing.policy, u.load_balancing.header) == ("consistent_hash", "x-session")
    assert u.health_check is not None and u.health_check.timeout == pytest.approx(0.3)
    assert u.outlier_detection.max_ejection_time == 60
    assert (u.circuit_breaker.max_requests, u.circuit_breaker.max_pending) == (10, 0)
    assert u.connection_pool.max_connections == 4 and u.retry_budget.percent == 50
    assert (config.drain.delay, config.drain.timeout) == (5, 25)
    assert config.readiness.upstreams == "all" and config.reload.watch_interval == 2
    assert config.admin.allow_remote_reload


@pytest.mark.parametrize(("routes", "expected"), [
    ("[{match: {model: '*'}, split: [{upstream: a, weight: 60}, {upstream: b, weight: 30}]}]",
     "routes[0].split: weights must add up to 100, got 90"),
    ("[{match: {model: '*'}, split: [{upstream: a, weight: 110}, {upstream: b, weight: -10}]}]",
     "routes[0].split[1].weight: must be at least 0, got -10"),
    ("[{match: {model: '*'}, split: [{upstream: a, weight: 50}, {upstream: nope, weight: 50}]}]",
     "routes[0].split[1].upstream: names no upstream; known: a, b, c"),
    ("[{match: {model: '*'}, split: [{upstream: a, weight: 50}, {upstream: a, weight: 50}]}]",
     "routes[0].split[1].upstream: upstream 'a' appears twice in this split"),
    ("[{match: {model: '*'}, upstream: a, split: [{upstream: a, weight: 100}]}]",
     "routes[0]: needs exactly one of 'upstream' (one target) or 'split' (weighted targets)"),
    ("[{match: {model: '*'}}]",
     "routes[0]: needs exactly one of 'upstream' (one target) or 'split' (weighted targets)"),
    ("[{match: {model: '*'}, upstream: a, sticky_header: x-user}]",
     "routes[0].sticky_header: only applies to routes with a split"),
    ("[{match: {model: '*'}, upstream: a, retry: {retry_on: [connect-failure, 5xx]}}]",
     "routes[0].retry.retry_on[1]: unknown retry condition '5xx'; known: connect-failure, reset, unavailable, "
     "per-try-timeout"),
    ("[{match: {model: '*'}, upstream: a, retry: {retry_on: [per-try-timeout]}}]",
     "routes[0].retry.per_try_timeout: retry_on names per-try-timeout, so per_try_timeout is required"),
    ("[{match: {model: '*'}, upstream: a, retry: {attempts: 50}}]", "routes[0].retry.attempts: must be at most 10"),
    ("[{match: {model: '*'}, upstream: a, retry: {backoff: 1s, max_backoff: 100ms}}]",
     "routes[0].retry.max_backoff: must not be less than backoff"),
    ("[{match: {model: '*'}, upstream: a, mirror: {upstream: zzz, percent: 150}}]",
     "routes[0].mirror.upstream: names no upstream; known: a, b, c"),
    ("[{match: {model: '*'}, upstream: a, mirror: [{upstream: b, percent: 150}]}]",
     "routes[0].mirror[0].percent: must be a percentage from 0 to 100, got 150"),
    ("[{match: {model: '*'}, upstream: a, timeout: 0s}]", "routes[0].timeout: must be more than 0"),
    ("[{match: {model: '*'}, upstream: a, forward_headers: x-tenant}]",
     "routes[0].forward_headers: must be a list of header names (globs like 'x-tenant-*' allowed)"),
    ("[{name: r, match: {model: '*'}, upstream: a}, {name: r, match: {model: '*'}, upstream: b}]",
     "routes[1]: duplicate route name 'r'"),
])
def test_route_problems_name_their_yaml_path(routes: str, expected: str) -> None:
    assert expected in problems(HEAD + "routes: " + routes)


@pytest.mark.parametrize(("upstream", "expected"), [
    ("{name: u, protocol: fake}", "upstreams[0].endpoints: protocol 'fake' needs at least one endpoint 'host:port'"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1', '127.0.0.1:1']}",
     "upstreams[0].endpoints[1]: duplicate endpoint 127.0.0.1:1"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], load_balancing: consistent_hash}",
     "upstreams[0].load_balancing: consistent_hash needs a header: {policy: consistent_hash, header: x-session-id}"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], load_balancing: fastest}",
     "upstreams[0].load_balancing: must be one of round_robin, least_request, consistent_hash, load_aware; "
     "got 'fastest'"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], load_balancing: {policy: round_robin, header: x}}",
     "upstreams[0].load_balancing.header: only applies to consistent_hash"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], health_check: {interval: 0s}}",
     "upstreams[0].health_check.interval: must be more than 0"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], health_check: {healthy_threshold: 0}}",
     "upstreams[0].health_check.healthy_threshold: must be at least 1, got 0"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], health_check: {intervall: 1s}}",
     "upstreams[0].health_check.intervall: unknown key"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], outlier_detection: {base_ejection_time: 1m, "
     "max_ejection_time: 10s}}",
     "upstreams[0].outlier_detection.max_ejection_time: must not be less than base_ejection_time"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], circuit_breaker: {max_requests: 0}}",
     "upstreams[0].circuit_breaker.max_requests: must be at least 1, got 0"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], retry_budget: {percent: 101}}",
     "upstreams[0].retry_budget.percent: must be a percentage from 0 to 100, got 101"),
    ("{name: u, protocol: fake, endpoints: ['127.0.0.1:1'], connection_pool: 5}",
     "upstreams[0].connection_pool: must be a mapping"),
])
def test_upstream_problems_name_their_yaml_path(upstream: str, expected: str) -> None:
    assert expected in problems(f"listeners: []\nupstreams: [{upstream}]\nroutes: []\n")


@pytest.mark.parametrize(("section", "expected"), [
    ("drain: {delay: -1}", "drain.delay: must not be negative"),
    ("readiness: {upstreams: most}", "readiness.upstreams: must be one of any, all, ignore; got 'most'"),
    ("reload: {watch_interval: 0s}", "reload.watch_interval: must be more than 0"),
    ("admin: {allow_remote_reload: yes please}", "admin.allow_remote_reload: must be a bool, got str"),
])
def test_gateway_section_problems(section: str, expected: str) -> None:
    assert expected in problems(f"listeners: []\nupstreams: []\nroutes: []\n{section}\n")


# --- shadowed routes ---------------------------------------------------------


def shadowed(routes: str) -> list[tuple[int, int]]:
    return shadowed_routes(parse_config(yaml.safe_load(HEAD + "routes:\n" + routes)).routes)


@pytest.mark.parametrize("routes, expected", [
    # A catch-all shadows everything after it, whatever its conditions.
    ("""
  - {match: {model: "*"}, upstream: a}
  - {match: {model: resnet}, upstream: b}
  - {match: {model: {regex: "^bert-.*$"}, version: "2", listener: internal, headers: {x-a: b}}, upstream: b}
""", [(1, 0), (2, 0)]),
    ("""
  - {upstream: a}
  - {match: {model: "*", protocol: v2-grpc}, upstream: b}
""", [(1, 0)]),
    # An exact name shadows the same name with the same or narrower conditions.
    ("""
  - {match: {model: m}, upstream: a}
  - {match: {model: m, listener: internal, protocol: v2-rest, version: "1", headers: {x-t: {present: true}}},
     upstream: b}
  - {match: {model: {exact: m}}, upstream: b}
  - {match: {model: {glob: m}}, upstream: b}
""", [(1, 0), (2, 0), (3, 0)]),
    # Prefix globs: a later glob or name under the earlier prefix.
    ("""
  - {match: {model: "llama*"}, upstream: a}
  - {match: {model: "llama-3-*"}, upstream: b}
  - {match: {model: "llama-?b"}, upstream: b}
  - {match: {model: llama}, upstream: b}
""", [(1, 0), (2, 0), (3, 0)]),
    # Any glob or regex shadows a later exact name it matches; the same pattern shadows itself.
    ("""
  - {match: {model: "res*-50"}, upstream: a}
  - {match: {model: resnet-50}, upstream: b}
  - {match: {model: {regex: "bert-(base|large)"}}, upstream: a}
  - {match: {model: bert-large}, upstream: b}
  - {match: {model: {regex: "bert-(base|large)"}}, upstream: b}
""", [(1, 0), (3, 2), (4, 2)]),
    # Headers: the earlier condition must be implied by the later one on the same header.
    ("""
  - {match: {headers: {x-canary: {present: true}}}, upstream: a}
  - {match: {model: m, headers: {x-canary: "1", x-other: "2"}}, upstream: b}
  - {match: {headers: {x-tenant: "*"}}, upstream: a}
  - {match: {headers: {x-tenant: {present: true}}}, upstream: b}
""", [(1, 0), (3, 2)]),
    # A version glob "*" takes every version, the missing one ("") too.
    ("""
  - {match: {model: m, version: "*"}, upstream: a}
  - {match: {model: m}, upstream: b}
""", [(1, 0)]),
])
def test_shadowed_routes_are_found(routes: str, expected: list[tuple[int, int]]) -> None:
    assert shadowed(routes) == expected


@pytest.mark.parametrize("routes", [
    # Narrower earlier routes leave requests to the later one.
    """
  - {match: {model: m, listener: internal}, upstream: a}
  - {match: {model: m, protocol: v2-grpc}, upstream: a}
  - {match: {model: m, version: "1"}, upstream: a}
  - {match: {model: m, headers: {x-t: {present: true}}}, upstream: a}
  - {match: {model: m}, upstream: b}
""",
    # A header condition versus none (the header may be absent) or another header.
    """
  - {match: {headers: {x-a: "*"}}, upstream: a}
  - {match: {headers: {x-b: "*"}}, upstream: b}
  - {upstream: c}
""",
    # Different names, prefixes that are not prefixes, and globs that only overlap.
    """
  - {match: {model: m}, upstream: a}
  - {match: {model: n}, upstream: b}
  - {match: {model: "m*"}, upstream: b}
  - {match: {model: "llama-3*"}, upstream: a}
  - {match: {model: "llama*"}, upstream: b}
  - {match: {model: "*-50"}, upstream: a}
  - {match: {model: "resnet*"}, upstream: b}
""",
    # Regexes it cannot reason about: no warning, even where one would be right.
    """
  - {match: {model: {regex: ".*"}}, upstream: a}
  - {match: {model: "resnet*"}, upstream: b}
  - {match: {model: "bert*"}, upstream: a}
  - {match: {model: {regex: "bert-.*"}}, upstream: b}
""",
    # A version condition does not cover requests of any version, and "1" is no "1*".
    """
  - {match: {model: m, version: "1"}, upstream: a}
  - {match: {model: m, version: "1*"}, upstream: b}
  - {match: {model: m}, upstream: b}
""",
])
def test_routes_that_are_reachable_are_not_reported(routes: str) -> None:
    assert shadowed(routes) == []


def test_shadow_warnings_name_both_routes() -> None:
    config = parse_config(yaml.safe_load(HEAD + """routes:
  - {name: everything, upstream: a}
  - {match: {model: m}, upstream: b}
"""))
    assert shadow_warnings(config) == [
        "routes[1]: route 'route-1' never serves a request: the earlier route 'everything' (routes[0]) matches "
        "every request it matches (first match wins)"]


def test_match_covers_forms() -> None:
    exact, glob, regex = (StringMatch("exact", "m-1"), StringMatch("glob", "m-*"), StringMatch("regex", "m-[0-9]"))
    assert match_covers(None, exact) and not match_covers(exact, None)
    assert match_covers(glob, exact) and match_covers(regex, exact) and match_covers(glob, StringMatch("glob", "m-1?"))
    assert not match_covers(exact, glob) and not match_covers(regex, glob) and not match_covers(glob, regex)
    assert match_covers(StringMatch("present"), StringMatch("glob", "*"))
    assert match_covers(StringMatch("glob", "**"), regex) and not match_covers(StringMatch("regex", ".*"), glob)


# Soundness: whenever a cover is claimed, every request the later route takes,
# the earlier one takes too (checked on values built to hit the patterns).
_CHARS = "ab-*?"
# Mostly a literal start and a wildcard tail, as names are globbed.
_TAILS = st.sampled_from(["", "*", "?", "*b", "?*", "-*"])
_PATTERN = st.one_of(st.builds(str.__add__, st.text("ab-", max_size=2), _TAILS), st.text(_CHARS, max_size=4))
_MATCH = st.one_of(
    st.builds(StringMatch, st.just("exact"), st.text("ab-", max_size=3)),
    st.builds(StringMatch, st.just("glob"), _PATTERN),
    st.builds(StringMatch, st.just("regex"), st.sampled_from(["a.*", "(a|b)+", "a-?b", ".*", "b"])),
)
_VALUES = ["", "a", "b", "ab", "a-b", "aa", "ba", "a*", "-", "abab", "b-a", "a?"]


@settings(max_examples=1000, deadline=None)
@given(earlier=_MATCH, later=_MATCH, present=st.booleans())
def test_match_covers_is_never_wrong(earlier: StringMatch, later: StringMatch, present: bool) -> None:
    first = RouteMatch(earlier, headers=(("x-h", StringMatch("present") if present else earlier),))
    second = RouteMatch(later, headers=(("x-h", later),))
    if not route_match_covers(first, second):
        return
    a, b = build_route(0, RouteConfig(first, "a")), build_route(1, RouteConfig(second, "a"))
    for value in [*_VALUES, later.pattern]:
        headers = {"x-h": value}
        if b.matches(value, "", "rest", "v2-rest", headers):
            assert a.matches(value, "", "rest", "v2-rest", headers), (earlier, later, value)
