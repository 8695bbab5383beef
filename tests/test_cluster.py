"""Cluster and data-plane decisions over in-process fake endpoints: load
balancing, ejection timing, circuit breaking, retry and budget arithmetic,
timeouts, mirrors and generation swaps. Real sockets: test_resilience.py."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
import yaml

from gateway.app.configure import parse_config
from gateway.config.address import Address
from gateway.config.routes import RetryPolicy
from gateway.config.upstreams import (
    CircuitBreaker,
    ConnectionPool,
    HealthCheck,
    LoadBalancing,
    OutlierDetection,
    UpstreamConfig,
)
from gateway.core.errors import ErrorKind, GatewayError, connect_failure, connection_reset, invalid
from gateway.core.types import InferRequest, RequestContext, Tensor
from gateway.dataplane.cluster.cluster import Cluster
from gateway.dataplane.cluster.outlier import decayed_ejections, ejection_time
from gateway.dataplane.plane import DataPlane
from gateway.dataplane.retry import backoff_delay, budget_allows, failure_reason
from gateway.observability.counters import Counters, Event
from gateway.protocols import registry
from peers.fake_upstream import FakeClient, FakeFleet
from support import Clock


def upstream(n: int = 2, **changes: Any) -> UpstreamConfig:
    endpoints = tuple(Address("127.0.0.1", 9000 + i) for i in range(n))
    return dataclasses.replace(UpstreamConfig("u", "fake", endpoints), **changes)


def cluster(n: int = 2, clock: Clock | None = None, seed: int = 0, **changes: Any) -> Cluster:
    return Cluster(upstream(n, **changes), None, Counters(), client_factory=FakeFleet(),
                   clock=clock or Clock(1000.0), rng=random.Random(seed))


def ports(c: Cluster, picks: int, key: str | None = None) -> list[int]:
    out = []
    for _ in range(picks):
        lease = c.try_acquire(key)
        assert lease is not None
        out.append(lease.endpoint.client.endpoint.port)  # type: ignore[union-attr]
        lease.release(None)
    return out


# --- load balancing ----------------------------------------------------------------


def test_round_robin_cycles_and_skips_ejected_endpoints() -> None:
    clock = Clock(1000.0)
    c = cluster(3, clock, outlier_detection=OutlierDetection(consecutive_failures=1, max_ejection_percent=100))
    assert ports(c, 6) == [9000, 9001, 9002, 9000, 9001, 9002]
    lease = c.try_acquire()
    assert lease is not None and lease.endpoint.address == "127.0.0.1:9000"
    lease.release("connect-failure")  # one failure ejects (threshold 1)
    assert sorted(set(ports(c, 6))) == [9001, 9002]
    clock.now += 31  # base ejection time 30s
    assert sorted(set(ports(c, 6))) == [9000, 9001, 9002]


def test_least_request_prefers_the_less_busy_endpoint() -> None:
    c = cluster(2, load_balancing=LoadBalancing("least_request"))
    busy = [c.try_acquire() for _ in range(2)]  # one on each endpoint (P2C with a tie picks either)
    held = [lease for lease in busy if lease is not None]
    for _ in range(8):  # load endpoint 9000 heavily
        lease = c.try_acquire()
        assert lease is not None
        if lease.endpoint.address.endswith("9000"):
            held.append(lease)
        else:
            lease.release(None)
    picks = Counter(ports(c, 100))
    assert picks[9001] == 100  # with two endpoints both are compared; the idle one always wins
    for lease in held:
        lease.release(None)


def test_consistent_hash_is_stable_and_moves_only_the_lost_keys() -> None:
    clock = Clock(1000.0)
    c = cluster(4, clock, load_balancing=LoadBalancing("consistent_hash", "x-session"),
                outlier_detection=OutlierDetection(consecutive_failures=1, max_ejection_percent=100))
    keys = [f"session-{i}" for i in range(2000)]
    before = {k: ports(c, 1, k)[0] for k in keys}
    assert before == {k: ports(c, 1, k)[0] for k in keys}
    spread = Counter(before.values())
    assert min(spread.values()) > 300, spread  # ~500 each: an even spread
    victim = next(e for e in c.endpoints if e.address.endswith("9001"))
    victim.in_flight += 1
    c.in_flight += 1
    from gateway.dataplane.cluster.cluster import Lease
    Lease(c, victim).release("connect-failure")  # eject it
    after = {k: ports(c, 1, k)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == 9001 for k in moved) and 9001 not in after.values()


def test_no_available_endpoint_means_trying_them_all() -> None:
    c = cluster(2)
    for e in c.endpoints:
        e.healthy = False
    assert not c.has_available_endpoint()
    assert sorted(set(ports(c, 4))) == [9000, 9001]  # panic: better to try than to refuse


# --- outlier ejection --------------------------------------------------------------


def test_ejection_time_grows_is_capped_and_decays() -> None:
    assert [ejection_time(30, 300, n) for n in (1, 2, 3, 20)] == [30, 60, 90, 300]
    assert decayed_ejections(3, 65, 30) == 1
    assert decayed_ejections(1, 10, 30) == 1
    assert decayed_ejections(2, 1000, 30) == 0


def test_consecutive_failures_eject_for_growing_times_then_readmit() -> None:
    clock = Clock(1000.0)
    events: list[Event] = []
    c = cluster(2, clock, outlier_detection=OutlierDetection(3, base_ejection_time=10, max_ejection_time=25))
    c.counters.subscribe(events.append)
    endpoint = c.endpoints[0]

    def fail(times: int, reason: str = "connect-failure") -> None:
        for _ in range(times):
            endpoint.in_flight += 1
            c.in_flight += 1
            c._release(endpoint, reason)

    fail(2)
    fail(1, None)  # type: ignore[arg-type]  # an answer resets the count
    fail(2)
    assert not endpoint.ejected(clock.now)
    fail(1)
    assert endpoint.ejected(clock.now) and endpoint.ejected_until == clock.now + 10
    clock.now += 10
    assert c.has_available_endpoint() and endpoint.available(clock.now)
    assert [e.name for e in events] == ["ejection", "readmission"]
    fail(3)
    assert endpoint.ejected_until == clock.now + 20  # second ejection: twice as long
    clock.now += 20
    c.has_available_endpoint()
    fail(3)
    assert endpoint.ejected_until == clock.now + 25  # third would be 30: capped at 25
    clock.now += 25
    c.has_available_endpoint()
    clock.now += 45  # healthy for 4.5 base times: the multiplier forgets ejections
    fail(3)
    assert endpoint.ejected_until == clock.now + 10
    assert endpoint.counters.ejections_total == 4 and c.stats.ejections_total == 4


def test_max_ejection_percent_keeps_part_of_the_cluster() -> None:
    clock = Clock(1000.0)
    c = cluster(2, clock, outlier_detection=OutlierDetection(1, max_ejection_percent=50))
    for endpoint in c.endpoints:
        endpoint.in_flight += 1
        c.in_flight += 1
        c._release(endpoint, "reset")
    assert [e.ejected(clock.now) for e in c.endpoints] == [True, False]


def test_failures_that_are_not_the_endpoints_do_not_count() -> None:
    c = cluster(1, outlier_detection=OutlierDetection(1))
    lease = c.try_acquire()
    assert lease is not None
    lease.release("timeout", blame_endpoint=False)  # the client's own deadline
    lease = c.try_acquire()
    assert lease is not None
    lease.release(None)
    assert c.endpoints[0].consecutive_failures == 0 and c.stats.ejections_total == 0


# --- active health checks -------------------------------------------------------------


async def test_health_checks_follow_thresholds() -> None:
    c = cluster(2, health_check=HealthCheck(interval=60, timeout=0.2, unhealthy_threshold=2, healthy_threshold=2))
    first, second = (e.client for e in c.endpoints)
    assert isinstance(first, FakeClient) and isinstance(second, FakeClient)
    second.ready = False
    await c.start()  # the first round decides at once
    assert [e.healthy for e in c.endpoints] == [True, False]
    first.always_fail = ConnectionRefusedError()
    await c.check_health()
    assert c.endpoints[0].healthy  # one failure is under the threshold
    await c.check_health()
    assert not c.endpoints[0].healthy and not c.has_available_endpoint()
    first.always_fail = None
    second.ready = True
    await c.check_health()
    assert not c.endpoints[0].healthy
    await c.check_health()
    assert c.endpoints[0].healthy and c.endpoints[1].healthy
    assert c.endpoints[0].counters.health_check_failures_total == 2
    await c.close()
    assert first.closed and c._health is not None and c._health.task is None


async def test_a_hanging_health_check_is_a_failure() -> None:
    c = cluster(1, health_check=HealthCheck(interval=60, timeout=0.05, unhealthy_threshold=1))
    client = c.endpoints[0].client
    assert isinstance(client, FakeClient)

    async def hang(ctx: RequestContext) -> bool:
        await asyncio.Event().wait()
        return True

    client.server_ready = hang  # type: ignore[method-assign]
    await asyncio.wait_for(c.check_health(), 5)  # the check's own timeout ends it, not the hang
    assert not c.endpoints[0].healthy


# --- circuit breaking -----------------------------------------------------------------


async def test_circuit_breaker_queues_up_to_max_pending_then_rejects_at_once() -> None:
    c = cluster(2, circuit_breaker=CircuitBreaker(max_requests=2, max_pending=1))
    held = [await c.acquire() for _ in range(2)]
    waiter = asyncio.ensure_future(c.acquire())
    await asyncio.sleep(0)
    assert c.pending == 1 and not waiter.done()
    with pytest.raises(GatewayError) as caught:
        await c.acquire()
    assert caught.value.kind is ErrorKind.UPSTREAM_OVERLOADED and c.stats.overflows_total == 1
    held[0].release(None)
    lease = await asyncio.wait_for(waiter, 1)
    assert c.pending == 0 and c.in_flight == 2
    lease.release(None)
    held[1].release(None)
    assert c.in_flight == 0


async def test_connection_pool_limits_each_endpoint() -> None:
    c = cluster(2, connection_pool=ConnectionPool(max_connections=1), circuit_breaker=CircuitBreaker(10, 0))
    a, b = await c.acquire(), await c.acquire()
    assert {a.endpoint.address, b.endpoint.address} == {"127.0.0.1:9000", "127.0.0.1:9001"}
    with pytest.raises(GatewayError):
        await c.acquire()
    a.release(None)
    b.release(None)


async def test_a_waiter_that_times_out_leaves_the_line() -> None:
    c = cluster(1, circuit_breaker=CircuitBreaker(max_requests=1, max_pending=5))
    held = await c.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await c.acquire()
    assert c.pending == 0 and not c._waiters
    held.release(None)
    (await c.acquire()).release(None)


# --- retry arithmetic -------------------------------------------------------------------


def test_backoff_is_jittered_exponential_and_capped() -> None:
    policy = RetryPolicy(backoff=0.025, max_backoff=0.25)
    rng = random.Random(3)
    for retry, ceiling in ((1, 0.025), (2, 0.05), (3, 0.1), (5, 0.25), (9, 0.25)):
        delays = [backoff_delay(policy, retry, rng) for _ in range(500)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > ceiling * 0.9  # spread over the whole range


def test_retry_budget_arithmetic() -> None:
    assert budget_allows(2, 0, 20, 3)  # the minimum always holds
    assert not budget_allows(3, 10, 20, 3)
    assert budget_allows(19, 100, 20, 3)
    assert not budget_allows(20, 100, 20, 3)
    assert not budget_allows(0, 100, 0, 0)


def test_failure_reasons() -> None:
    assert failure_reason(connect_failure("u", "refused")) == "connect-failure"
    assert failure_reason(connection_reset("u", "eof")) == "reset"
    assert failure_reason(GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "503")) == "unavailable"
    assert failure_reason(GatewayError(ErrorKind.UPSTREAM_TIMEOUT, "504")) == "timeout"
    assert failure_reason(GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, "junk")) == "bad-response"
    assert failure_reason(invalid("bad shape")) is None
    assert failure_reason(ConnectionRefusedError()) == "connect-failure"
    assert failure_reason(ConnectionResetError()) == "reset"
    # A backend that wraps a transport error without tagging it still counts.
    try:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError as exc:
            raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "lost") from exc
    except GatewayError as wrapped:
        assert failure_reason(wrapped) == "reset"
    assert failure_reason(ValueError("bug")) is None


# --- the data plane over fakes ------------------------------------------------------------

CONFIG = """
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams:
  - {name: two, protocol: fake, endpoints: ["127.0.0.1:1", "127.0.0.1:2"],
     outlier_detection: {consecutive_failures: 100}}
  - {name: shadow, protocol: fake, endpoints: ["127.0.0.1:3"]}
  - {name: other, protocol: fake, endpoints: ["127.0.0.1:4"]}
routes:
  - {match: {model: plain}, upstream: two}
  - match: {model: retry_all}
    upstream: two
    retry: {attempts: 3, retry_on: [connect-failure, reset, unavailable], backoff: 1ms}
  - match: {model: per_try}
    upstream: two
    timeout: 1s
    retry: {attempts: 2, retry_on: [per-try-timeout], per_try_timeout: 50ms, backoff: 1ms}
  - match: {model: bounded}
    upstream: two
    timeout: 150ms
    retry: {attempts: 10, retry_on: [per-try-timeout], per_try_timeout: 100ms, backoff: 1ms}
  - {match: {model: mirrored}, upstream: other, mirror: {upstream: shadow}}
  - {match: {model: "*"}, upstream: other}
"""


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
    monkeypatch.setitem(registry.PROTOCOLS, "fake", "peers.fake_upstream")
    return FakeFleet()


async def plane(fleet: FakeFleet, text: str = CONFIG) -> DataPlane:
    dp = DataPlane(parse_config(yaml.safe_load(text)), None, client_factory=fleet, rng=random.Random(5))
    await dp.start()
    return dp


def request(model: str) -> InferRequest:
    return InferRequest(model, inputs=[Tensor.from_numpy("x", np.arange(3, dtype=np.int32))])


def ctx(**changes: Any) -> RequestContext:
    return dataclasses.replace(RequestContext("rest", "v2-rest", request_id="r1"), **changes)


def server_of(response: Any) -> str:
    return next(t for t in response.outputs if t.name == "SERVER").data[0].decode()


async def eventually(predicate: Any, what: str, timeout: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds (bounded)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)
    assert predicate(), what


def hold(client: FakeClient) -> asyncio.Event:
    """Hold ``client``'s infer calls until the returned event is set."""
    gate = asyncio.Event()
    infer = client.infer

    async def held(request: InferRequest, c: RequestContext) -> Any:
        await gate.wait()
        return await infer(request, c)

    client.infer = held  # type: ignore[method-assign,assignment]
    return gate


async def test_connect_failure_is_retried_on_another_endpoint(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    first, second = fleet["two/127.0.0.1:1"], fleet["two/127.0.0.1:2"]
    first.failures = [connect_failure("two", "refused")]
    c = ctx()
    response = await dp.infer(request("plain"), c)
    assert server_of(response) == "127.0.0.1:2" and first.calls == 1 and second.calls == 1
    assert [(a.endpoint, a.outcome) for a in c.attempts] == [("127.0.0.1:1", "connect-failure"),
                                                             ("127.0.0.1:2", "ok")]
    assert dp.clusters["two"].stats.retries_total == 1
    # An answered 503 is not retried by the default policy...
    first.failures = [GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "upstream answered 503")]
    second.failures = [GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "upstream answered 503")]
    with pytest.raises(GatewayError) as caught:
        await dp.infer(request("plain"), ctx())
    assert caught.value.kind is ErrorKind.UPSTREAM_UNAVAILABLE
    # ...but is where the route says so.
    response = await dp.infer(request("retry_all"), ctx())
    assert server_of(response) in ("127.0.0.1:1", "127.0.0.1:2")
    await dp.close()


async def test_retries_stop_after_attempts_and_say_so(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    for client in (fleet["two/127.0.0.1:1"], fleet["two/127.0.0.1:2"]):
        client.always_fail = connection_reset("two", "eof")
    with pytest.raises(GatewayError) as caught:
        await dp.infer(request("retry_all"), ctx())
    assert caught.value.kind is ErrorKind.UPSTREAM_UNAVAILABLE
    assert caught.value.message.endswith("(after 3 attempts)")
    assert fleet["two/127.0.0.1:1"].calls + fleet["two/127.0.0.1:2"].calls == 3
    # Errors that are the request's fault are never retried.
    fleet["two/127.0.0.1:1"].always_fail = fleet["two/127.0.0.1:2"].always_fail = invalid("bad input")
    with pytest.raises(GatewayError) as caught:
        await dp.infer(request("retry_all"), ctx())
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert fleet["two/127.0.0.1:1"].calls + fleet["two/127.0.0.1:2"].calls == 4
    await dp.close()


async def test_retry_budget_limits_retries_under_an_outage(fleet: FakeFleet) -> None:
    text = CONFIG.replace("outlier_detection: {consecutive_failures: 100}}",
                          "outlier_detection: {consecutive_failures: 0}, "
                          "retry_budget: {percent: 0, min_concurrency: 2}}")
    dp = await plane(fleet, text)
    for client in (fleet["two/127.0.0.1:1"], fleet["two/127.0.0.1:2"]):
        client.always_fail = connection_reset("two", "reset by peer")
        client.delay = 0.02
    results = await asyncio.gather(*(dp.infer(request("retry_all"), ctx()) for _ in range(20)),
                                   return_exceptions=True)
    assert all(isinstance(r, GatewayError) for r in results)
    stats = dp.clusters["two"].stats
    calls = fleet["two/127.0.0.1:1"].calls + fleet["two/127.0.0.1:2"].calls
    assert stats.retry_budget_exhausted_total > 0
    assert calls == 20 + stats.retries_total < 20 * 3  # far fewer than every request retrying twice
    await dp.close()


async def test_connect_failures_are_retried_outside_the_budget(fleet: FakeFleet) -> None:
    # Tries that never reached an endpoint added no load: even a budget of
    # zero lets them move on, so one dead endpoint costs no client errors.
    text = CONFIG.replace("outlier_detection: {consecutive_failures: 100}}",
                          "outlier_detection: {consecutive_failures: 0}, "
                          "retry_budget: {percent: 0, min_concurrency: 0}}")
    dp = await plane(fleet, text)
    dead, alive = fleet["two/127.0.0.1:1"], fleet["two/127.0.0.1:2"]
    dead.always_fail = connect_failure("two", "refused")
    dead.delay = alive.delay = 0.02
    results = await asyncio.gather(*(dp.infer(request("plain"), ctx()) for _ in range(20)))
    assert all(server_of(r) == "127.0.0.1:2" for r in results)
    stats = dp.clusters["two"].stats
    assert stats.retries_total == dead.calls > 0 and stats.retry_budget_exhausted_total == 0
    assert dp.clusters["two"].retries_in_flight == 0
    # A reset may have reached the endpoint: that retry needs the budget.
    dead.always_fail = connection_reset("two", "reset by peer")
    outcomes = await asyncio.gather(*(dp.infer(request("retry_all"), ctx()) for _ in range(10)),
                                    return_exceptions=True)
    assert any(isinstance(o, GatewayError) for o in outcomes) and stats.retry_budget_exhausted_total > 0
    await dp.close()


async def test_per_try_timeout_moves_on_and_the_route_timeout_bounds_everything(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    slow, fast = fleet["two/127.0.0.1:1"], fleet["two/127.0.0.1:2"]
    slow.delay = 5
    for _ in range(4):
        response = await dp.infer(request("per_try"), ctx())
        assert server_of(response) == "127.0.0.1:2"
    assert dp.clusters["two"].stats.per_try_timeouts_total >= 1
    fast.delay = 5
    calls = slow.calls + fast.calls
    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await dp.infer(request("bounded"), ctx())
    elapsed = time.monotonic() - started
    assert caught.value.kind is ErrorKind.UPSTREAM_TIMEOUT and elapsed >= 0.14
    # Tries of 100ms: the 150ms route timeout ends the second of the ten allowed.
    assert 1 <= slow.calls + fast.calls - calls <= 2
    assert "route's timeout" in caught.value.message and dp.clusters["two"].stats.timeouts_total == 1
    await dp.close()


async def test_client_deadline_bounds_the_call_and_is_not_blamed_on_the_endpoint(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    fleet["other/127.0.0.1:4"].delay = 3600
    with pytest.raises(GatewayError) as caught:
        async with asyncio.timeout(10):  # only the client's deadline can end it in time
            await dp.infer(request("anything"), ctx(deadline=time.monotonic() + 0.1))
    assert caught.value.kind is ErrorKind.UPSTREAM_TIMEOUT and "client's deadline" in caught.value.message
    assert dp.clusters["other"].endpoints[0].consecutive_failures == 0
    with pytest.raises(GatewayError) as caught:  # already past: not even sent
        await dp.infer(request("anything"), ctx(deadline=time.monotonic() - 1))
    assert fleet["other/127.0.0.1:4"].calls == 1
    await dp.close()


async def test_mirror_is_fire_and_forget(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    shadow = fleet["shadow/127.0.0.1:3"]
    gate = hold(shadow)
    response = await dp.infer(request("mirrored"), ctx())
    # Answered while the shadow still holds its copy.
    assert server_of(response) == "127.0.0.1:4" and dp.clusters["shadow"].in_flight == 1
    gate.set()
    await eventually(lambda: dp.clusters["shadow"].in_flight == 0, "the held mirror to finish")
    shadow.always_fail = connect_failure("shadow", "refused")
    response = await dp.infer(request("mirrored"), ctx())
    assert server_of(response) == "127.0.0.1:4"
    stats = dp.clusters["shadow"].stats
    await eventually(lambda: stats.mirror_failures_total == 1, "the failed mirror to be counted")
    assert shadow.calls == 2 and stats.mirrored_total == 2
    await dp.close()


async def test_forward_headers_reach_the_client_and_route_is_named(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    c = ctx(headers={"traceparent": "00-a-b-01", "x-private": "no"})
    await dp.infer(request("anything"), c)
    seen = fleet["other/127.0.0.1:4"].seen[0]
    assert dict(seen.forward_headers) == {"traceparent": "00-a-b-01", "x-request-id": "r1"}
    assert c.route == "route-5"
    await dp.close()


async def test_swap_finishes_in_flight_on_the_old_generation(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    old_other = fleet["other/127.0.0.1:4"]
    old_two = dp.clusters["two"]
    gate = hold(old_other)
    in_flight = asyncio.ensure_future(dp.infer(request("anything"), ctx()))
    await eventually(lambda: dp.clusters["other"].in_flight == 1, "the request to reach the old endpoint")
    text = CONFIG.replace('endpoints: ["127.0.0.1:4"]', 'endpoints: ["127.0.0.1:5"]')
    await dp.swap(parse_config(yaml.safe_load(text)), None)
    response = await dp.infer(request("anything"), ctx())
    assert server_of(response) == "127.0.0.1:5"  # new requests: new cluster
    assert dp.clusters["two"] is old_two  # unchanged upstream: same cluster, same health
    assert not old_other.closed  # still serving its in-flight request
    gate.set()
    assert server_of(await in_flight) == "127.0.0.1:4"
    await eventually(lambda: old_other.closed, "the old generation to close")
    assert not fleet["two/127.0.0.1:1"].closed
    await dp.close()
    assert fleet["two/127.0.0.1:1"].closed


async def test_readiness_modes(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    assert await dp.server_ready(ctx())
    for endpoint in dp.clusters["other"].endpoints:
        endpoint.healthy = False
    assert await dp.server_ready(ctx())  # "any": "two" still has endpoints
    for mode, expected in (("all", False), ("ignore", True)):
        await dp.swap(parse_config(yaml.safe_load(CONFIG + f"readiness: {{upstreams: {mode}}}\n")), None)
        assert await dp.server_ready(ctx()) is expected
    dp.draining = True
    assert not await dp.server_ready(ctx())
    await dp.close()


async def test_backends_see_the_effective_deadline(fleet: FakeFleet) -> None:
    dp = await plane(fleet)
    before = time.monotonic()
    await dp.infer(request("bounded"), ctx())  # route timeout 150ms
    seen = fleet["two/127.0.0.1:1"].seen[-1]
    assert seen.deadline is not None and before + 0.1 < seen.deadline < time.monotonic() + 0.15
    client_deadline = time.monotonic() + 0.05
    await dp.infer(request("bounded"), ctx(deadline=client_deadline))  # the client's is sooner
    assert fleet["two/127.0.0.1:2"].seen[-1].deadline == client_deadline
    await dp.close()


async def test_time_in_the_breakers_line_is_recorded_as_queue_time(fleet: FakeFleet) -> None:
    text = CONFIG.replace('{name: other, protocol: fake, endpoints: ["127.0.0.1:4"]}',
                          '{name: other, protocol: fake, endpoints: ["127.0.0.1:4"], '
                          'circuit_breaker: {max_requests: 1, max_pending: 5}}')
    dp = await plane(fleet, text)
    fleet["other/127.0.0.1:4"].delay = 0.2
    first, second = ctx(), ctx()
    await asyncio.gather(dp.infer(request("anything"), first), dp.infer(request("anything"), second))
    waits = sorted((first.record.queue_seconds, second.record.queue_seconds))
    assert waits[0] < 0.05 and waits[1] >= 0.15  # the second waited for the first's slot
    await dp.close()


async def test_an_error_after_a_streamed_response_names_no_address(fleet: FakeFleet,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a stream delivered a response the request is not retried, and
    its error still goes to the client without the upstream's addresses."""
    from gateway.core.contracts import StreamedResponse

    dp = await plane(fleet)

    async def streamed(self: Any, req: InferRequest, c: RequestContext) -> Any:
        yield StreamedResponse(await self.infer(req, c))
        raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"lost {self.endpoint} and 10.1.2.3:8000 mid-stream")

    monkeypatch.setattr(type(fleet["two/127.0.0.1:1"]), "infer_stream", streamed)
    delivered: list[Any] = []

    async def deliver(part: Any) -> None:
        delivered.append(part)

    with pytest.raises(GatewayError) as caught:
        await dp.infer_stream(request("plain"), ctx(), deliver)
    assert len(delivered) == 1
    assert "127.0.0.1" not in caught.value.message and "10.1.2.3" not in caught.value.message, caught.value.message
    await dp.close()
