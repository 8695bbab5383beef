"""Load-aware picking and the priority wait line, part by part: the
Prometheus text reader, the picker, the line's order and shedding, the
config's rules and the request's priority. End to end with real MLServers
and a real gateway: test_load_aware.py."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
import yaml

from gateway.app.configure import parse_config
from gateway.config.address import Address
from gateway.config.model import starvation_warnings
from gateway.config.upstreams import CircuitBreaker, LoadBalancing, LoadMetrics, UpstreamConfig
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.promtext import gauge_sum, parse_selector
from gateway.dataplane.cluster.balancing import LoadAware
from gateway.dataplane.cluster.cluster import Cluster, Shed
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.dataplane.cluster.loadmetrics import MAX_SCRAPE_BYTES, LoadScraper
from gateway.dataplane.cluster.waiting import Waiter, WaitLine
from gateway.dataplane.priority import PRIORITY_HEADER, parameter_priority, request_priority
from gateway.observability.counters import Counters, EndpointCounters, Event
from peers.fake_upstream import FakeFleet
from support import Clock

# As MLServer 1.7.1 writes it on its metrics port (trimmed).
MLSERVER_EXPOSITION = b"""# HELP rest_server_requests_in_progress Total HTTP requests currently in progress
# TYPE rest_server_requests_in_progress gauge
rest_server_requests_in_progress{app_name="mlserver",method="GET"} 1.0
rest_server_requests_in_progress{app_name="mlserver",method="POST"} 6.0
rest_server_requests_total{app_name="mlserver",method="POST",path="/v2/models/{model_name}/infer"} 34.0
"""
TRITON_EXPOSITION = b"""# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="simple",version="1"} 3
nv_inference_pending_request_count{model="dense",version="1"} 4 1700000000000
nv_inference_pending_request_count_other{model="x"} 100
xnv_inference_pending_request_count{model="x"} 100
nv_inference_pending_request_count{model="odd\\"}",version="2"} NaN
"""


# --- the Prometheus text reader ------------------------------------------------------


def test_a_preset_gauge_sums_every_label_set_and_only_its_own_name() -> None:
    assert gauge_sum(MLSERVER_EXPOSITION, "rest_server_requests_in_progress") == 7.0
    assert gauge_sum(TRITON_EXPOSITION, "nv_inference_pending_request_count") == 7.0  # NaN skipped


def test_a_gauge_with_labels_sums_only_the_series_carrying_them() -> None:
    assert gauge_sum(TRITON_EXPOSITION, "nv_inference_pending_request_count", (("model", "dense"),)) == 4.0
    assert gauge_sum(MLSERVER_EXPOSITION, "rest_server_requests_in_progress", (("method", "POST"),)) == 6.0
    assert gauge_sum(TRITON_EXPOSITION, "nv_inference_pending_request_count", (("model", "none"),)) is None
    assert gauge_sum(b"", "anything") is None
    assert gauge_sum(b"plain_gauge 2.5\n", "plain_gauge") == 2.5


def test_selectors_parse_as_written_and_malformed_ones_are_refused() -> None:
    assert parse_selector("queue_depth") == ("queue_depth", ())
    assert parse_selector('queue_depth{pool="gpu", zone="a\\"b"}') == ("queue_depth",
                                                                     (("pool", "gpu"), ("zone", 'a"b')))
    for bad in ("", "1metric", "m{pool=gpu}", 'm{pool="gpu"', 'm{pool="gpu"} x', "m{}x"):
        assert parse_selector(bad) is None, bad


# --- the picker --------------------------------------------------------------------------


def endpoint(address: str, load: float | None, in_flight: int = 0, in_flight_at_load: int = 0) -> Endpoint:
    e = Endpoint(None, address, EndpointCounters())  # type: ignore[arg-type]
    e.load, e.in_flight, e.in_flight_at_load = load, in_flight, in_flight_at_load
    return e


def test_load_aware_picks_the_endpoint_reporting_less_load() -> None:
    fallbacks: list[int] = []
    picker = LoadAware(random.Random(1), lambda: fallbacks.append(1))
    busy, idle = endpoint("a:1", 9.0), endpoint("b:1", 1.0, in_flight=3)  # more of ours on b, less in all
    picks = [picker.choose([busy, idle], [busy, idle], None) for _ in range(50)]
    assert picks.count(idle) == 50 and not fallbacks


def test_load_aware_counts_our_calls_since_the_load_was_read() -> None:
    picker = LoadAware(random.Random(1), lambda: None)
    a = endpoint("a:1", 2.0, in_flight=6, in_flight_at_load=1)  # 2 + 5 started since
    b = endpoint("b:1", 5.0, in_flight=1, in_flight_at_load=1)
    assert {picker.choose([a, b], [a, b], None) for _ in range(20)} == {b}


def test_load_aware_falls_back_to_least_request_while_a_load_is_unknown() -> None:
    fallbacks: list[int] = []
    picker = LoadAware(random.Random(1), lambda: fallbacks.append(1))
    a, b = endpoint("a:1", None, in_flight=4), endpoint("b:1", 0.0, in_flight=1)
    assert {picker.choose([a, b], [a, b], None) for _ in range(20)} == {b}
    assert len(fallbacks) == 20


# --- the wait line -----------------------------------------------------------------------


async def test_the_line_goes_by_priority_then_arrival_and_sheds_the_newest_lowest() -> None:
    line = WaitLine()
    waiters = [Waiter(p) for p in (0, 2, 1, 2, 0, 1)]
    for w in waiters:
        line.add(w)
    order = [w.priority for w in line]
    assert order == [1, 1, 2, 2, 0, 0]
    assert [w for w in line][:2] == [waiters[2], waiters[5]]  # first come, first served within one
    assert line.victim_for(Waiter(1).rank) is waiters[4]  # the newest of priority 0 (the lowest)
    assert line.victim_for(Waiter(0).rank) is None  # not higher than the lowest: the newcomer goes
    line.remove(waiters[4])
    line.remove(waiters[0])
    line.remove(waiters[0])  # twice is harmless
    assert len(line) == 4 and line.victim_for(Waiter(1).rank) is waiters[3]
    assert line.victim_for(Waiter(2).rank) is None
    assert Waiter(500).priority == 32 and Waiter(-3).priority == 0


def cluster(**changes: Any) -> Cluster:
    config = dataclasses.replace(UpstreamConfig("u", "fake", (Address("127.0.0.1", 9000),)), **changes)
    return Cluster(config, None, Counters(), client_factory=FakeFleet(), clock=Clock(1000.0), rng=random.Random(0))


async def wait_until(check: Any, what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


async def test_a_full_line_sheds_the_lowest_priority_and_grants_the_highest_first() -> None:
    c = cluster(max_concurrent=1, max_queue=3)
    events: list[Event] = []
    c.counters.subscribe(events.append)
    held = await c.acquire()
    low = [asyncio.ensure_future(c.acquire(priority=p)) for p in (0, 3, 0)]
    await wait_until(lambda: c.pending == 3, "three waiting")
    top = asyncio.ensure_future(c.acquire(priority=1))  # the newest priority-0 waiter makes room
    await wait_until(lambda: low[2].done(), "the newest lowest shed")
    error = low[2].exception()
    assert isinstance(error, Shed) and error.kind is ErrorKind.OVERLOADED and error.retry_after == 1
    with pytest.raises(Shed):  # a newcomer of the lowest priority is the one refused
        await c.acquire(priority=0)
    assert c.stats.shed_total == 2 and [e.detail for e in events if e.name == "shed"] == ["0", "0"]
    granted = []
    lease = held
    for _ in range(3):
        lease.release(None)
        done, _ = await asyncio.wait([top, low[0], low[1]], return_when=asyncio.FIRST_COMPLETED)
        winner = next(t for t in (top, low[1], low[0]) if t in done and t not in granted)
        granted.append(winner)
        lease = winner.result()
    lease.release(None)
    assert granted == [top, low[1], low[0]]  # priority 1, then 3, then none
    assert c.pending == 0 and c.in_flight == 0


async def test_a_cancelled_or_timed_out_waiter_gives_its_place_back() -> None:
    c = cluster(max_concurrent=1, max_queue=1)
    held = await c.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await c.acquire(priority=2)
    assert c.pending == 0
    waiting = asyncio.ensure_future(c.acquire(priority=2))
    await wait_until(lambda: c.pending == 1, "one waiting")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert c.pending == 0 and c.stats.shed_total == 0
    held.release(None)
    (await c.acquire()).release(None)
    assert c.in_flight == 0


async def test_without_max_queue_the_breaker_refuses_as_before_but_by_priority() -> None:
    c = cluster(circuit_breaker=CircuitBreaker(max_requests=1, max_pending=1))
    held = await c.acquire()
    low = asyncio.ensure_future(c.acquire())
    await wait_until(lambda: c.pending == 1, "one waiting")
    high = asyncio.ensure_future(c.acquire(priority=1))
    await wait_until(lambda: low.done(), "the lower one refused")
    error = low.exception()
    assert isinstance(error, GatewayError) and error.kind is ErrorKind.UPSTREAM_OVERLOADED
    assert c.stats.overflows_total == 1 and c.stats.shed_total == 0
    held.release(None)
    (await high).release(None)


# --- the request's priority ----------------------------------------------------------------


def test_a_request_priority_comes_from_its_parameter_else_its_header_else_the_route() -> None:
    def priority(parameters: dict[str, Any], headers: dict[str, str], route: int) -> int:
        return parameter_priority(parameters) or request_priority(headers, route)  # as the data plane asks

    assert priority({"priority": 3}, {PRIORITY_HEADER: "1"}, 5) == 3
    assert priority({"priority": 0}, {PRIORITY_HEADER: " 2 "}, 5) == 2
    assert priority({}, {PRIORITY_HEADER: "0"}, 5) == 5
    assert priority({}, {}, 0) == 0
    for bad in ({"priority": -1}, {"priority": "high"}, {"priority": True}, {"priority": 1.5}):
        with pytest.raises(GatewayError) as caught:
            parameter_priority(bad)
        assert caught.value.kind is ErrorKind.INVALID_INPUT
    for text in ("high", "-1", "1e3", "٣", "9" * 30):
        with pytest.raises(GatewayError) as caught:
            request_priority({PRIORITY_HEADER: text}, 0)
        assert caught.value.kind is ErrorKind.INVALID_INPUT


# --- the config ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("load_balancing: load_aware", "load_aware needs load_metrics"),
    ("load_metrics: {preset: triton}", "load_metrics: only applies to load_balancing: load_aware"),
    ("load_balancing: load_aware, load_metrics: {preset: triton, gauge: q}", "needs exactly one of"),
    ("load_balancing: load_aware, load_metrics: {preset: vllm}", "preset: must be one of triton, mlserver"),
    ("load_balancing: load_aware, load_metrics: {gauge: 'q{x=1}'}", "gauge: must be a metric name"),
    ("load_balancing: load_aware, load_metrics: {preset: triton, interval: 1s, stale_after: 500ms}",
     "stale_after: must not be less than interval"),
    ("load_balancing: load_aware, load_metrics: {preset: triton, path: metrics}", "path: must be a URL path"),
    ("max_queue: -1", "max_queue: must be at least 0"),
    ("max_concurrent: 0", "max_concurrent: must be at least 1"),
])
def test_load_aware_and_queue_settings_are_checked(text: str, expected: str) -> None:
    from test_routing import problems
    found = problems(f"listeners: []\nupstreams: [{{name: u, protocol: v2-rest, endpoints: ['127.0.0.1:1'], {text}}}]\n"
                     "routes: []\n")
    assert any(expected in p for p in found), found


def test_a_route_priority_is_a_level_from_1_to_32() -> None:
    from test_routing import problems
    base = "listeners: []\nupstreams: [{name: u, protocol: v2-rest, endpoints: ['127.0.0.1:1']}]\n"
    assert any("priority: must be from 1 (highest) to 32" in p
               for p in problems(base + "routes: [{upstream: u, priority: 33}]\n"))
    config = parse_config(yaml.safe_load(base + "routes: [{upstream: u, priority: 32}]\n"))
    assert config.routes[0].priority == 32


def test_an_upstream_whose_line_can_hold_every_slot_is_warned_about() -> None:
    base = ("limits: {max_concurrent_requests: 100}\nlisteners: []\nroutes: []\nupstreams:\n"
            "  - {name: other, protocol: v2-rest, endpoints: ['127.0.0.1:2']}\n")
    lined = parse_config(yaml.safe_load(base + "  - {name: u, protocol: v2-rest, endpoints: ['127.0.0.1:1'], "
                                               "circuit_breaker: {max_requests: 10}, max_queue: 90}\n"))
    assert [w for w in starvation_warnings(lined) if "'u'" in w and "max_queue (100)" in w]
    short = parse_config(yaml.safe_load(base + "  - {name: u, protocol: v2-rest, endpoints: ['127.0.0.1:1'], "
                                               "circuit_breaker: {max_requests: 10}, max_queue: 89}\n"))
    assert not [w for w in starvation_warnings(short) if "'u'" in w]


def test_load_metrics_presets_name_their_servers_gauges() -> None:
    assert LoadMetrics(preset="mlserver").selector == ("rest_server_requests_in_progress", ())
    assert LoadMetrics(preset="triton").selector == ("nv_inference_pending_request_count", ())
    assert LoadMetrics(gauge='q{pool="gpu"}').selector == ("q", (("pool", "gpu"),))
    assert UpstreamConfig("u", "fake", max_concurrent=4).endpoint_limit == 4
    assert UpstreamConfig("u", "fake").endpoint_limit == 128


# --- the scraper, over a real socket -----------------------------------------------------


async def test_the_scraper_reads_loads_and_forgets_them_when_the_endpoint_fails() -> None:
    answers = {"body": MLSERVER_EXPOSITION, "status": b"200 OK"}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 " + answers["status"] + b"\r\ncontent-type: text/plain\r\n\r\n" + answers["body"])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        clock = Clock(1000.0)
        e = endpoint(f"127.0.0.1:{port}", None, in_flight=2)
        events: list[Event] = []
        counters = Counters()
        counters.subscribe(events.append)
        scraper = LoadScraper("u", LoadMetrics(preset="mlserver", interval=0.2, stale_after=1.0), lambda: [e],
                              counters, clock)
        await scraper.scrape_all()
        assert (e.load, e.in_flight_at_load) == (7.0, 2)
        assert events[-1] == Event("endpoint_load", "u", e.address, "7.0")
        answers["status"] = b"404 Not Found"
        clock.now += 0.5
        await scraper.scrape_all()
        assert e.load == 7.0  # one failure keeps the last load until it is stale
        clock.now += 0.6
        await scraper.scrape_all()
        assert e.load is None and events[-1].detail == "nan"
        answers["status"], answers["body"] = b"200 OK", b"x" * (MAX_SCRAPE_BYTES + 10)
        await scraper.scrape_all()
        assert e.load is None  # too large: refused
        answers["body"] = b"other_metric 3\n"
        await scraper.scrape_all()
        assert e.load is None  # no such gauge
    finally:
        server.close()
        await server.wait_closed()


async def test_a_cluster_with_load_metrics_scrapes_them_until_closed() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + TRITON_EXPOSITION)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        c = cluster(load_balancing=LoadBalancing("load_aware"),
                    load_metrics=LoadMetrics(preset="triton", port=port, interval=0.01))
        await c.start()
        await asyncio.wait_for(_loaded(c), 10)
        await c.close()
        assert c.snapshot()["endpoints"][0]["load"] == 7.0
    finally:
        server.close()
        await server.wait_closed()


async def _loaded(c: Cluster) -> None:
    while c.endpoints[0].load is None:
        await asyncio.sleep(0.01)
