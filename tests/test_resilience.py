"""Routing and resilience over real sockets and processes: the gateway in
its own process reaches V2 stand-in processes (peers/echo_upstream.py) that
can be slowed down, held, failed or killed on cue, through the product's
own upstream clients, ``v2-rest`` and ``v2-grpc``. Each behaviour that does
not depend on the wire runs over both."""

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

from peers.echo_gateway import rest_base, until, upstream_state
from peers.echo_upstream import WIRES, EchoServer
from peers.load import PAYLOAD, Result, assert_all_answered, infer, output, run_load
from support import GatewayProcess, free_port, metric_value, scrape_metrics, wait_for, write_config


def binomial_ok(count: int, total: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(count - total * p) <= sigmas * math.sqrt(total * p * (1 - p))


@pytest.fixture(scope="module")
def echoes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EchoServer]]:
    directory = tmp_path_factory.mktemp("echo")
    servers = {name: EchoServer(name, directory) for name in ("A", "B", "C", "SLOW", "SHADOW", "SAMPLED")}
    try:
        EchoServer.start_all(list(servers.values()))
        servers["SLOW"].control(hold=True)  # never answers: only a per-try timeout gets past it
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def wire_config(wire: str, echoes: dict[str, EchoServer]) -> str:
    """The upstreams and routes of one wire: every name ends in ``-{wire}``."""
    protocol = WIRES[wire]

    def at(*names: str) -> str:
        return ", ".join(f'"{echoes[name].address_for(protocol)}"' for name in names)

    return f"""
upstreams:
  - {{name: a-{wire}, protocol: {protocol}, endpoints: [{at('A')}]}}
  - {{name: b-{wire}, protocol: {protocol}, endpoints: [{at('B')}]}}
  - {{name: c-{wire}, protocol: {protocol}, endpoints: [{at('C')}]}}
  - {{name: ab-{wire}, protocol: {protocol}, endpoints: [{at('A', 'B')}]}}
  - name: slow_and_fast-{wire}
    protocol: {protocol}
    endpoints: [{at('SLOW', 'A')}]
    outlier_detection: {{consecutive_failures: 0}}
  - name: limited-{wire}
    protocol: {protocol}
    endpoints: [{at('C')}]
    circuit_breaker: {{max_requests: 4, max_pending: 2}}
  - name: failing_first-{wire}
    protocol: {protocol}
    endpoints: [{at('B', 'A')}]
    outlier_detection: {{consecutive_failures: 0}}
  - {{name: shadow-{wire}, protocol: {protocol}, endpoints: [{at('SHADOW')}]}}
  - {{name: sampled_shadow-{wire}, protocol: {protocol}, endpoints: [{at('SAMPLED')}]}}
  - {{name: dead_shadow-{wire}, protocol: {protocol}, endpoints: ["127.0.0.1:{free_port()}"]}}
routes:
  - match: {{model: split-{wire}}}
    split: [{{upstream: a-{wire}, weight: 80}}, {{upstream: b-{wire}, weight: 20}}, {{upstream: c-{wire}, weight: 0}}]
  - match: {{model: sticky-{wire}}}
    split: [{{upstream: a-{wire}, weight: 50}}, {{upstream: b-{wire}, weight: 50}}]
    sticky_header: x-user
  - {{match: {{model: slow-{wire}}}, upstream: a-{wire}, timeout: 300ms}}
  - match: {{model: per_try-{wire}}}
    upstream: slow_and_fast-{wire}
    timeout: 3s
    retry: {{attempts: 2, retry_on: [per-try-timeout], per_try_timeout: 200ms, backoff: 1ms}}
  - match: {{model: bounded-{wire}}}
    upstream: ab-{wire}
    timeout: 700ms
    retry: {{attempts: 5, retry_on: [per-try-timeout], per_try_timeout: 300ms}}
  - {{match: {{model: limited-{wire}}}, upstream: limited-{wire}}}
  - match: {{model: retried-{wire}}}
    upstream: failing_first-{wire}
    retry: {{attempts: 2, retry_on: [unavailable], backoff: 1ms}}
  - {{match: {{model: unretried-{wire}}}, upstream: failing_first-{wire}}}
  - match: {{model: mirrored-{wire}}}
    upstream: a-{wire}
    mirror: [{{upstream: shadow-{wire}}}, {{upstream: dead_shadow-{wire}}}]
  - {{match: {{model: sampled-{wire}}}, upstream: b-{wire}, mirror: {{upstream: sampled_shadow-{wire}, percent: 50}}}}
  - {{match: {{model: headers-{wire}}}, upstream: a-{wire}, forward_headers: [x-tenant, "x-feature-*"]}}
  - {{match: {{model: "echo-{wire}-*"}}, upstream: a-{wire}, rewrite: {{model: renamed}}}}
"""


def merged(*parts: str) -> str:
    """Several ``upstreams:``/``routes:`` blocks as one config's lists."""
    upstreams, routes = [], []
    for part in parts:
        head, tail = part.split("routes:\n")
        upstreams.append(head.split("upstreams:\n")[1])
        routes.append(tail)
    return "upstreams:\n" + "".join(upstreams) + "routes:\n" + "".join(routes)


@pytest.fixture(scope="module")
def gateway(echoes: dict[str, EchoServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
{merged(*(wire_config(wire, echoes) for wire in WIRES))}"""
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(params=list(WIRES))
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_split_ratios_over_1000_requests(gateway: GatewayProcess, wire: str) -> None:
    results = await run_load(rest_base(gateway), f"split-{wire}", total=1000, concurrency=16)
    assert len(results) == 1000 and all(r.ok for r in results), Counter(r.status for r in results)
    servers = Counter(r.server for r in results)
    assert servers["C"] == 0  # weight 0: never
    assert binomial_ok(servers["B"], 1000, 0.2), servers
    assert servers["A"] + servers["B"] == 1000


async def test_sticky_split_keeps_each_user_on_one_upstream(gateway: GatewayProcess, wire: str) -> None:
    seen: dict[str, set[str]] = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            results = await asyncio.gather(*(infer(session, rest_base(gateway), f"sticky-{wire}",
                                                   {"x-user": f"user-{i}"}) for i in range(60)))
            for i, result in enumerate(results):
                assert result.ok, result
                seen.setdefault(f"user-{i}", set()).add(result.server)
    assert all(len(servers) == 1 for servers in seen.values())
    assert {next(iter(s)) for s in seen.values()} == {"A", "B"}  # users land on both


async def test_route_timeout_answers_504_at_the_timeout(gateway: GatewayProcess, wire: str) -> None:
    delay = 5.0
    payload = {**PAYLOAD, "parameters": {"delay_ms": delay * 1000}}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), f"slow-{wire}", payload=payload)
    assert result.status == 504 and "within 0.3s" in result.error, result
    assert 0.3 <= result.elapsed < delay  # not before the timeout, not after the upstream's answer


async def test_per_try_timeout_retries_on_the_other_endpoint(gateway: GatewayProcess, wire: str,
                                                              echoes: dict[str, EchoServer]) -> None:
    name = f"slow_and_fast-{wire}"
    before = upstream_state(gateway, name)["counters"]
    scraped_before = scrape_metrics(gateway)
    async with aiohttp.ClientSession() as session:
        results = [await infer(session, rest_base(gateway), f"per_try-{wire}") for _ in range(6)]
    after = upstream_state(gateway, name)["counters"]
    scraped_after = scrape_metrics(gateway)
    # Every answer comes from the fast endpoint: the slow one holds every call it gets.
    assert all(r.ok and r.server == "A" for r in results), results
    timed_out = after["per_try_timeouts_total"] - before["per_try_timeouts_total"]
    assert 2 <= timed_out <= 4  # round robin sends every other request to the slow one first
    assert after["retries_total"] - before["retries_total"] == timed_out
    assert sum(1 for r in results if r.elapsed >= 0.2) >= timed_out  # a retried one waited its 200ms

    # The same events on /metrics.
    def moved(metric: str, **labels: str) -> float:
        return metric_value(scraped_after, metric, **labels) - metric_value(scraped_before, metric, **labels)

    assert moved("gateway_upstream_retries_total", upstream=name) == timed_out
    assert moved("gateway_upstream_timeouts_total", upstream=name) == timed_out
    slow = echoes["SLOW"].address_for(WIRES[wire])
    assert moved("gateway_upstream_requests_total", upstream=name, endpoint=slow,
                 outcome="upstream_timeout") == timed_out


async def test_route_timeout_bounds_all_retries(gateway: GatewayProcess, wire: str,
                                                echoes: dict[str, EchoServer]) -> None:
    def tries() -> int:
        return echoes["A"].stats()["infer"] + echoes["B"].stats()["infer"]

    before = tries()
    payload = {**PAYLOAD, "parameters": {"delay_ms": 5000}}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), f"bounded-{wire}", payload=payload)
    assert result.status == 504 and "within 0.7s" in result.error, result
    assert result.elapsed >= 0.7
    # Tries of 300ms start at 0, 0.3 and 0.6s at the earliest: the 700ms ends the fourth and fifth.
    assert 2 <= tries() - before <= 3


async def test_circuit_breaker_answers_at_once_instead_of_queueing(gateway: GatewayProcess, wire: str,
                                                                   echoes: dict[str, EchoServer]) -> None:
    name = f"limited-{wire}"
    before = upstream_state(gateway, name)["counters"]["overflows_total"]
    c = echoes["C"]
    c.control(hold=True)  # every call the breaker lets through stays in flight until released
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            calls = [asyncio.ensure_future(infer(session, rest_base(gateway), f"limited-{wire}"))
                     for _ in range(24)]
            # 4 in flight + 2 waiting; the rest refused while those are still held.
            await until(lambda: sum(call.done() for call in calls) == 18 and c.stats()["in_flight"] == 4, 10,
                        "the overflow refused and four calls held upstream")
            assert sum(call.done() for call in calls) == 18  # the two in line still wait
            c.control(hold=False)
            results = await asyncio.gather(*calls)
    finally:
        c.control(hold=False)
    statuses = Counter(r.status for r in results)
    assert statuses == {200: 6, 503: 18}, statuses
    refused = [r for r in results if r.status == 503]
    assert all("at its limits" in r.error for r in refused)
    assert c.stats()["max_in_flight"] <= 4  # the two that waited got the freed slots
    assert upstream_state(gateway, name)["counters"]["overflows_total"] - before == 18
    rejected = metric_value(scrape_metrics(gateway), "gateway_circuit_breaker_rejections_total", upstream=name)
    assert rejected == 18


async def test_an_answered_503_is_retried_only_where_the_route_says(gateway: GatewayProcess, wire: str,
                                                                    echoes: dict[str, EchoServer]) -> None:
    name = f"failing_first-{wire}"
    b = echoes["B"]
    # (arrivals: a slow call of an earlier test may still be answered meanwhile)
    before, tried_b = upstream_state(gateway, name)["counters"]["retries_total"], b.stats()["infer"]
    b.control(status=503)  # answers every infer with 503 (over gRPC: UNAVAILABLE)
    try:
        async with aiohttp.ClientSession() as session:
            retried = [await infer(session, rest_base(gateway), f"retried-{wire}") for _ in range(6)]
            unretried = [await infer(session, rest_base(gateway), f"unretried-{wire}") for _ in range(6)]
    finally:
        b.control(status=200)
    assert all(r.ok and r.server == "A" for r in retried), retried
    retries = upstream_state(gateway, name)["counters"]["retries_total"] - before
    assert retries >= 3  # round robin: every other request tried B first
    refused = [r for r in unretried if not r.ok]
    assert len(refused) >= 3 and len(refused) + retries == b.stats()["infer"] - tried_b
    for result in refused:  # the upstream named, its words kept, no address
        assert result.status == 503 and name in result.error and "echo B answers 503" in result.error, result
        assert "127.0.0.1" not in result.error


async def test_mirroring_changes_neither_answers_nor_latency(gateway: GatewayProcess, wire: str,
                                                             echoes: dict[str, EchoServer]) -> None:
    shadow = echoes["SHADOW"]
    before = shadow.stats()
    shadow.control(hold=True)  # the shadow answers nothing while the clients are served
    try:
        async with aiohttp.ClientSession() as session:
            mirrored = [await infer(session, rest_base(gateway), f"mirrored-{wire}") for _ in range(40)]
            plain = await infer(session, rest_base(gateway), f"slow-{wire}")  # the same upstream, no mirror
        assert shadow.stats()["answered"] == before["answered"]
        await until(lambda: shadow.stats()["infer"] - before["infer"] == 40, 10, "the shadow to see every copy")
    finally:
        shadow.control(hold=False)
    # Neither the held shadow nor the dead one shows in the answers.
    assert all(r.ok and r.server == "A" for r in mirrored)
    assert all(output(r.body, "x") == output(plain.body, "x") == [1, 2, 3, 4] for r in mirrored)
    await until(lambda: shadow.stats()["answered"] - before["answered"] == 40, 10, "the shadow to answer")
    dead = f"dead_shadow-{wire}"
    await until(lambda: upstream_state(gateway, dead)["counters"]["mirror_failures_total"] == 40, 10,
                "the dead shadow's failures")
    assert upstream_state(gateway, dead)["counters"]["mirrored_total"] == 40


async def test_mirror_sampling_follows_the_percentage(gateway: GatewayProcess, wire: str,
                                                      echoes: dict[str, EchoServer]) -> None:
    before = echoes["SAMPLED"].stats()["infer"]
    results = await run_load(rest_base(gateway), f"sampled-{wire}", total=400, concurrency=8)
    assert all(r.ok and r.server == "B" for r in results)
    await until(lambda: upstream_state(gateway, f"sampled_shadow-{wire}")["in_flight"] == 0, 10,
                "mirrors to finish")
    copies = echoes["SAMPLED"].stats()["infer"] - before
    assert binomial_ok(copies, 400, 0.5), copies


async def test_headers_forwarded_by_allowlist_with_request_id_and_trace(gateway: GatewayProcess,
                                                                       wire: str) -> None:
    sent = {"x-tenant": "blue", "x-feature-beta": "on", "x-secret": "hunter2", "x-request-id": "req-7",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b"}
    async with aiohttp.ClientSession() as session:
        result = await infer(session, rest_base(gateway), f"headers-{wire}", sent)
        generated = await infer(session, rest_base(gateway), f"split-{wire}")
    received = json.loads(output(result.body, "HEADERS")[0])
    for name in ("x-tenant", "x-feature-beta", "x-request-id", "traceparent", "tracestate"):
        assert received[name] == sent[name]
    assert "x-secret" not in received
    # Without an incoming id the gateway's own travels upstream (and back to the client).
    assert json.loads(output(generated.body, "HEADERS")[0])["x-request-id"]


async def test_no_route_and_rewrite(gateway: GatewayProcess, wire: str) -> None:
    async with aiohttp.ClientSession() as session:
        missing = await infer(session, rest_base(gateway), "no-such-model")
        rewritten = await infer(session, rest_base(gateway), f"echo-{wire}-1")
    assert missing.status == 404 and "'no-such-model'" in missing.error
    assert rewritten.ok and rewritten.body["model_name"] == f"echo-{wire}-1"


# --- endpoints dying and coming back ------------------------------------------------------


async def test_killing_an_endpoint_under_load_is_invisible_to_clients(tmp_path: Path,
                                                                      echoes: dict[str, EchoServer]) -> None:
    """Both wires at once: B's REST and gRPC listeners die with its process."""
    a, b = echoes["A"], EchoServer("B", tmp_path).start()  # B: its own, to be killed
    config = """
admin: {address: "127.0.0.1:0"}
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams:
""" + "".join(f"""
  - name: pair-{wire}
    protocol: {protocol}
    endpoints: ["{a.address_for(protocol)}", "{b.address_for(protocol)}"]
    health_check: {{interval: 300ms, timeout: 200ms, unhealthy_threshold: 2, healthy_threshold: 1}}
    outlier_detection: {{consecutive_failures: 2, base_ejection_time: 1s}}
""" for wire, protocol in WIRES.items()) + "routes:\n" + "".join(f"""
  - match: {{model: m-{wire}}}
    upstream: pair-{wire}
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
""" for wire in WIRES)

    def out_of_rotation() -> bool:  # ejected by the failed calls and marked down by the health checks
        states = [upstream_state(gw, f"pair-{wire}")["endpoints"][1] for wire in WIRES]
        return all(state["counters"]["ejections_total"] >= 1 and not state["healthy"] for state in states)

    def back_in_rotation() -> bool:
        states = [upstream_state(gw, f"pair-{wire}") for wire in WIRES]
        return all(state["available"] and all(not e["ejected"] and e["healthy"] for e in state["endpoints"])
                   for state in states)

    try:
        with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
            stop = asyncio.Event()
            loads = {wire: asyncio.ensure_future(run_load(rest_base(gw), f"m-{wire}", duration=60, concurrency=3,
                                                          stop=stop)) for wire in WIRES}
            answered_by_a = a.stats()["answered"]
            await until(lambda: min(a.stats()["answered"] - answered_by_a, b.stats()["answered"]) >= 40, 10,
                        "load on both")
            b.kill()
            killed_at = time.monotonic()
            await until(out_of_rotation, 10, "B out of rotation")
            answered_by_a = a.stats()["answered"]
            await until(lambda: a.stats()["answered"] >= answered_by_a + 40, 10, "load while B is out")
            while_dead = scrape_metrics(gw)
            relaunched_at = time.monotonic()
            b.start()  # back on the same ports
            back_at = time.monotonic()
            await until(back_in_rotation, 10, "B to be re-admitted")
            await until(lambda: b.stats()["answered"] >= 40, 10, "B to take load again")
            stop.set()
            results: dict[str, list[Result]] = {wire: await load for wire, load in loads.items()}
            final = {wire: upstream_state(gw, f"pair-{wire}") for wire in WIRES}
            at_end = scrape_metrics(gw)
    finally:
        b.stop()
    for wire, protocol in WIRES.items():
        assert_all_answered(results[wire], at_least=30)
        # B out of rotation while dead: every request that started after it died
        # and was answered before it was started again went to A. (One that was
        # still on its way when B came back may rightly reach B.)
        during = [r for r in results[wire] if killed_at < r.started and r.started + r.elapsed < relaunched_at]
        odd = [(round(r.started - killed_at, 3), round(r.elapsed, 3), r.server, r.status) for r in during
               if r.server != "A"]
        assert during and not odd, (wire, odd)
        assert any(r.server == "B" for r in results[wire] if r.started > back_at)  # and back afterwards
        name, victim = f"pair-{wire}", final[wire]["endpoints"][1]["counters"]
        assert victim["ejections_total"] >= 1
        assert final[wire]["counters"]["retries_total"] >= 1
        # The same events on /metrics.
        b_address, a_address = b.address_for(protocol), a.address_for(protocol)
        assert metric_value(at_end, "gateway_outlier_ejections_total", upstream=name, endpoint=b_address) \
            == victim["ejections_total"]
        assert metric_value(at_end, "gateway_outlier_ejections_total", upstream=name, endpoint=a_address) == 0
        assert metric_value(at_end, "gateway_upstream_retries_total", upstream=name) \
            == final[wire]["counters"]["retries_total"]
        assert metric_value(while_dead, "gateway_endpoint_healthy", upstream=name, endpoint=b_address) == 0
        assert metric_value(at_end, "gateway_endpoint_healthy", upstream=name, endpoint=b_address) == 1


async def test_readiness_follows_upstream_health_and_liveness_does_not(tmp_path: Path) -> None:
    """Both wires at once: one upstream health-checked over REST, one over gRPC."""
    server = EchoServer("late", tmp_path)
    server.ports = {"rest": free_port(), "grpc": free_port()}
    config = """
admin: {address: "127.0.0.1:0"}
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams:
""" + "".join(f"""
  - name: only-{wire}
    protocol: {protocol}
    endpoints: ["{server.address_for(protocol)}"]
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1, healthy_threshold: 1}}
""" for wire, protocol in WIRES.items()) + "routes:\n" + "".join(
        f"  - {{match: {{model: m-{wire}}}, upstream: only-{wire}}}\n" for wire in WIRES)
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
        def status(url: str) -> int:
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    return int(reply.status)
            except urllib.error.HTTPError as error:
                return error.code

        def healthy() -> set[str]:
            return {wire for wire in WIRES if upstream_state(gw, f"only-{wire}")["endpoints"][0]["healthy"]}

        rest, admin = rest_base(gw), f"http://127.0.0.1:{gw.ports['admin']}"
        assert status(f"{admin}/readyz") == 503 and status(f"{rest}/v2/health/ready") == 400
        assert status(f"{admin}/healthz") == 200 and status(f"{rest}/v2/health/live") == 200
        try:
            server.start()
            wait_for(lambda: healthy() == set(WIRES), 5, "both health checks to pass")
            assert status(f"{admin}/readyz") == 200 and status(f"{rest}/v2/health/ready") == 200
            server.control(ready=False)  # up, but says it is not ready
            wait_for(lambda: not healthy(), 5, "both health checks to fail")
            assert status(f"{admin}/readyz") == 503
            server.control(ready=True)
            wait_for(lambda: healthy() == set(WIRES), 5, "both health checks to pass again")
            assert status(f"{admin}/readyz") == 200
        finally:
            server.stop()
        wait_for(lambda: not healthy(), 5, "both upstreams down with the server")
        assert status(f"{admin}/readyz") == 503 and status(f"{admin}/healthz") == 200
