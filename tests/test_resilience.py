"""Routing and resilience over real sockets and processes: the gateway in
its own process, in front of echo upstream processes (peers/echo_upstream.py)
that can be slowed down, failed or killed on cue."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from peers.echo_gateway import echo_gateway, rest_base, upstream_state
from peers.echo_upstream import EchoServer
from peers.load import PAYLOAD, Result, assert_all_answered, infer, output, run_load
from support import GatewayProcess, free_port, metric_value, scrape_metrics, wait_for


def binomial_ok(count: int, total: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(count - total * p) <= sigmas * math.sqrt(total * p * (1 - p))


@pytest.fixture(scope="module")
def echoes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EchoServer]]:
    directory = tmp_path_factory.mktemp("echo")
    servers = {name: EchoServer(name, directory, delay) for name, delay in
               (("A", 0), ("B", 0), ("C", 0), ("SLOW", 1.0), ("SHADOW", 2.0), ("SAMPLED", 0))}
    try:
        EchoServer.start_all(list(servers.values()))
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="module")
def gateway(echoes: dict[str, EchoServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    e = {name: server.address for name, server in echoes.items()}
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: a, protocol: echo, endpoints: ["{e['A']}"]}}
  - {{name: b, protocol: echo, endpoints: ["{e['B']}"]}}
  - {{name: c, protocol: echo, endpoints: ["{e['C']}"]}}
  - {{name: ab, protocol: echo, endpoints: ["{e['A']}", "{e['B']}"]}}
  - name: slow_and_fast
    protocol: echo
    endpoints: ["{e['SLOW']}", "{e['A']}"]
    outlier_detection: {{consecutive_failures: 0}}
  - name: limited
    protocol: echo
    endpoints: ["{e['C']}"]
    circuit_breaker: {{max_requests: 4, max_pending: 2}}
  - {{name: shadow, protocol: echo, endpoints: ["{e['SHADOW']}"]}}
  - {{name: sampled_shadow, protocol: echo, endpoints: ["{e['SAMPLED']}"]}}
  - {{name: dead_shadow, protocol: echo, endpoints: ["127.0.0.1:{free_port()}"]}}
routes:
  - match: {{model: split}}
    split: [{{upstream: a, weight: 80}}, {{upstream: b, weight: 20}}, {{upstream: c, weight: 0}}]
  - match: {{model: sticky}}
    split: [{{upstream: a, weight: 50}}, {{upstream: b, weight: 50}}]
    sticky_header: x-user
  - {{match: {{model: slow}}, upstream: a, timeout: 300ms}}
  - match: {{model: per_try}}
    upstream: slow_and_fast
    timeout: 3s
    retry: {{attempts: 2, retry_on: [per-try-timeout], per_try_timeout: 200ms, backoff: 1ms}}
  - match: {{model: bounded}}
    upstream: ab
    timeout: 700ms
    retry: {{attempts: 5, retry_on: [per-try-timeout], per_try_timeout: 300ms}}
  - {{match: {{model: limited}}, upstream: limited}}
  - {{match: {{model: mirrored}}, upstream: a, mirror: [{{upstream: shadow}}, {{upstream: dead_shadow}}]}}
  - {{match: {{model: sampled}}, upstream: b, mirror: {{upstream: sampled_shadow, percent: 50}}}}
  - {{match: {{model: headers}}, upstream: a, forward_headers: [x-tenant, "x-feature-*"]}}
  - {{match: {{model: "echo-*"}}, upstream: a, rewrite: {{model: renamed}}}}
"""
    directory = tmp_path_factory.mktemp("gw")
    with echo_gateway(directory, config) as gw:
        yield gw


async def test_split_ratios_over_2000_requests(gateway: GatewayProcess) -> None:
    results = await run_load(rest_base(gateway), "split", total=2000, concurrency=16)
    assert len(results) == 2000 and all(r.ok for r in results), Counter(r.status for r in results)
    servers = Counter(r.server for r in results)
    assert servers["C"] == 0  # weight 0: never
    assert binomial_ok(servers["B"], 2000, 0.2), servers
    assert servers["A"] + servers["B"] == 2000


async def test_sticky_split_keeps_each_user_on_one_upstream(gateway: GatewayProcess) -> None:
    seen: dict[str, set[str]] = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            results = await asyncio.gather(*(infer(session, rest_base(gateway), "sticky", {"x-user": f"user-{i}"})
                                             for i in range(60)))
            for i, result in enumerate(results):
                assert result.ok, result
                seen.setdefault(f"user-{i}", set()).add(result.server)
    assert all(len(servers) == 1 for servers in seen.values())
    assert {next(iter(s)) for s in seen.values()} == {"A", "B"}  # users land on both


async def test_route_timeout_answers_504_in_time(gateway: GatewayProcess) -> None:
    payload = {**PAYLOAD, "parameters": {"delay_ms": 3000}}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), "slow", payload=payload)
    assert result.status == 504 and "within 0.3s" in result.error
    assert 0.25 < result.elapsed < 1.0


async def test_per_try_timeout_retries_on_the_other_endpoint(gateway: GatewayProcess,
                                                              echoes: dict[str, EchoServer]) -> None:
    before = upstream_state(gateway, "slow_and_fast")["counters"]
    scraped_before = scrape_metrics(gateway)
    async with aiohttp.ClientSession() as session:
        results = [await infer(session, rest_base(gateway), "per_try") for _ in range(6)]
    after = upstream_state(gateway, "slow_and_fast")["counters"]
    scraped_after = scrape_metrics(gateway)
    # Every answer comes from the fast endpoint, none waited for the slow one's 1s.
    assert all(r.ok and r.server == "A" and r.elapsed < 0.9 for r in results), results
    timed_out = after["per_try_timeouts_total"] - before["per_try_timeouts_total"]
    assert 2 <= timed_out <= 4  # round robin sends every other request to the slow one first
    assert after["retries_total"] - before["retries_total"] == timed_out
    assert sum(1 for r in results if r.elapsed >= 0.2) >= timed_out  # a retried one waited its 200ms

    # The same events on /metrics (issue 7).
    def moved(name: str, **labels: str) -> float:
        return metric_value(scraped_after, name, **labels) - metric_value(scraped_before, name, **labels)

    assert moved("gateway_upstream_retries_total", upstream="slow_and_fast") == timed_out
    assert moved("gateway_upstream_timeouts_total", upstream="slow_and_fast") == timed_out
    slow = echoes["SLOW"].address
    assert moved("gateway_upstream_requests_total", upstream="slow_and_fast", endpoint=slow,
                 outcome="upstream_timeout") == timed_out


async def test_route_timeout_bounds_all_retries(gateway: GatewayProcess) -> None:
    payload = {**PAYLOAD, "parameters": {"delay_ms": 2000}}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), "bounded", payload=payload)
    assert result.status == 504
    assert 0.65 < result.elapsed < 1.2  # 5 tries of 300ms would be 1.5s and more


async def test_circuit_breaker_answers_fast_instead_of_queueing(gateway: GatewayProcess,
                                                                 echoes: dict[str, EchoServer]) -> None:
    before = upstream_state(gateway, "limited")["counters"]["overflows_total"]
    rejected_before = metric_value(scrape_metrics(gateway), "gateway_circuit_breaker_rejections_total",
                                   upstream="limited")
    payload = {**PAYLOAD, "parameters": {"delay_ms": 1000}}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        results = await asyncio.gather(*(infer(session, rest_base(gateway), "limited", payload=payload)
                                         for _ in range(24)))
    statuses = Counter(r.status for r in results)
    assert statuses == {200: 6, 503: 18}, statuses  # 4 in flight + 2 waiting; the rest refused
    refused = [r for r in results if r.status == 503]
    assert all("at its limits" in r.error for r in refused)
    assert max(r.elapsed for r in refused) < 0.5  # at once, not after a queue
    waited = sorted(r.elapsed for r in results if r.ok)
    assert waited[-1] > 1.9  # the two that waited got the next free slots
    assert upstream_state(gateway, "limited")["counters"]["overflows_total"] - before == 18
    rejected = metric_value(scrape_metrics(gateway), "gateway_circuit_breaker_rejections_total", upstream="limited")
    assert rejected - rejected_before == 18
    assert echoes["C"].stats()["max_in_flight"] <= 4


async def test_mirroring_changes_neither_answers_nor_latency(gateway: GatewayProcess,
                                                             echoes: dict[str, EchoServer]) -> None:
    before = echoes["SHADOW"].stats()["infer"]
    async with aiohttp.ClientSession() as session:
        mirrored = [await infer(session, rest_base(gateway), "mirrored") for _ in range(40)]
        plain = await infer(session, rest_base(gateway), "slow")  # the same upstream, no mirror
    assert all(r.ok and r.server == "A" for r in mirrored)
    assert all(output(r.body, "x") == output(plain.body, "x") == [1, 2, 3, 4] for r in mirrored)
    # The shadow takes 2s per request and one mirror target is down: neither shows.
    latencies = sorted(r.elapsed for r in mirrored)
    assert latencies[len(latencies) // 2] < 0.1 and latencies[-1] < 1.0, latencies
    wait_for(lambda: echoes["SHADOW"].stats()["infer"] - before == 40, 10, "the shadow to see every copy")
    state = upstream_state(gateway, "dead_shadow")["counters"]
    assert state["mirrored_total"] == 40 and state["mirror_failures_total"] == 40


async def test_mirror_sampling_follows_the_percentage(gateway: GatewayProcess, echoes: dict[str, EchoServer]) -> None:
    before = echoes["SAMPLED"].stats()["infer"]
    results = await run_load(rest_base(gateway), "sampled", total=600, concurrency=8)
    assert all(r.ok and r.server == "B" for r in results)
    wait_for(lambda: upstream_state(gateway, "sampled_shadow")["in_flight"] == 0, 10, "mirrors to finish")
    copies = echoes["SAMPLED"].stats()["infer"] - before
    assert binomial_ok(copies, 600, 0.5), copies


async def test_headers_forwarded_by_allowlist_with_request_id_and_trace(gateway: GatewayProcess) -> None:
    sent = {"x-tenant": "blue", "x-feature-beta": "on", "x-secret": "hunter2", "x-request-id": "req-7",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b"}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), "headers", sent)
        generated = await infer(session, rest_base(gateway), "mirrored")
    received = json.loads(output(result.body, "HEADERS")[0])
    for name in ("x-tenant", "x-feature-beta", "x-request-id", "traceparent", "tracestate"):
        assert received[name] == sent[name]
    assert "x-secret" not in received
    # Without an incoming id the gateway's own travels upstream (and back to the client).
    assert json.loads(output(generated.body, "HEADERS")[0])["x-request-id"]


async def test_no_route_and_rewrite(gateway: GatewayProcess) -> None:
    async with aiohttp.ClientSession() as session:
        missing = await infer(session, rest_base(gateway), "no-such-model")
        rewritten = await infer(session, rest_base(gateway), "echo-1")
    assert missing.status == 404 and "'no-such-model'" in missing.error
    assert rewritten.ok and rewritten.body["model_name"] == "echo-1"


# --- endpoints dying and coming back ------------------------------------------------------


async def test_killing_an_endpoint_under_load_is_invisible_to_clients(tmp_path: Path) -> None:
    a, b = EchoServer("A", tmp_path), EchoServer("B", tmp_path)
    EchoServer.start_all([a, b])
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - name: pair
    protocol: echo
    endpoints: ["{a.address}", "{b.address}"]
    health_check: {{interval: 300ms, timeout: 200ms, unhealthy_threshold: 2, healthy_threshold: 1}}
    outlier_detection: {{consecutive_failures: 2, base_ejection_time: 1s}}
routes:
  - match: {{model: "*"}}
    upstream: pair
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
"""
    try:
        with echo_gateway(tmp_path, config) as gw:
            stop = asyncio.Event()
            load = asyncio.ensure_future(run_load(rest_base(gw), "m", duration=60, concurrency=6, stop=stop))
            await asyncio.sleep(1.0)
            b.kill()
            killed_at = time.monotonic()
            await asyncio.sleep(1.5)
            state = upstream_state(gw, "pair")["endpoints"][1]
            assert state["ejected"] or not state["healthy"], state
            while_dead = scrape_metrics(gw)
            relaunched_at = time.monotonic()
            b.launch().wait_ready()  # back on the same port
            back_at = time.monotonic()
            await asyncio.to_thread(wait_for, lambda: upstream_state(gw, "pair")["available"]
                                    and all(not e["ejected"] and e["healthy"]
                                            for e in upstream_state(gw, "pair")["endpoints"]),
                                    5, "B to be re-admitted")
            await asyncio.sleep(0.5)
            stop.set()
            results: list[Result] = await load
            final = upstream_state(gw, "pair")
            at_end = scrape_metrics(gw)
    finally:
        a.stop()
        b.stop()
    assert_all_answered(results, at_least=300)
    # B out of rotation while dead: every request that started after it died
    # and was answered before it was started again went to A. (One that was
    # still on its way when B came back may rightly reach B.)
    during = [r for r in results if killed_at + 0.3 < r.started and r.started + r.elapsed < relaunched_at]
    odd = [(round(r.started - killed_at, 3), round(r.elapsed, 3), r.server, r.status) for r in during
           if r.server != "A"]
    assert during and not odd, odd
    assert any(r.server == "B" for r in results if r.started > back_at)  # and back afterwards
    assert final["endpoints"][1]["counters"]["ejections_total"] >= 1
    assert final["counters"]["retries_total"] >= 1
    # The same events on /metrics (issue 7).
    assert metric_value(at_end, "gateway_outlier_ejections_total", upstream="pair", endpoint=b.address) \
        == final["endpoints"][1]["counters"]["ejections_total"]
    assert metric_value(at_end, "gateway_outlier_ejections_total", upstream="pair", endpoint=a.address) == 0
    assert metric_value(at_end, "gateway_upstream_retries_total", upstream="pair") == final["counters"]["retries_total"]
    assert metric_value(while_dead, "gateway_endpoint_healthy", upstream="pair", endpoint=b.address) == 0
    assert metric_value(at_end, "gateway_endpoint_healthy", upstream="pair", endpoint=b.address) == 1


async def test_readiness_follows_upstream_health_and_liveness_does_not(tmp_path: Path) -> None:
    port = free_port()
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - name: only
    protocol: echo
    endpoints: ["127.0.0.1:{port}"]
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1, healthy_threshold: 1}}
routes: [{{match: {{model: "*"}}, upstream: only}}]
"""
    server = EchoServer("late", tmp_path)
    server.port = port
    with echo_gateway(tmp_path, config) as gw:
        def status(url: str) -> int:
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    return int(reply.status)
            except urllib.error.HTTPError as error:
                return error.code

        rest, admin = rest_base(gw), f"http://127.0.0.1:{gw.ports['admin']}"
        assert status(f"{admin}/readyz") == 503 and status(f"{rest}/v2/health/ready") == 400
        assert status(f"{admin}/healthz") == 200 and status(f"{rest}/v2/health/live") == 200
        try:
            server.start()
            wait_for(lambda: status(f"{admin}/readyz") == 200, 5, "readiness once the upstream is up")
            assert status(f"{rest}/v2/health/ready") == 200
        finally:
            server.stop()
        wait_for(lambda: status(f"{admin}/readyz") == 503, 5, "readiness to drop with the upstream")
        assert status(f"{admin}/healthz") == 200
