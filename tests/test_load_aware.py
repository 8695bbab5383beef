"""Load-aware picking end to end: two real MLServers (their own processes)
host a model of fixed service time (mlserver_models/serial_20ms.py, one
call at a time), endpoint A on 127.0.0.1 and B on 127.0.0.2, their metrics
on the same port number as on two hosts. A load generator in this test
calls A directly, bypassing the gateway, so A's own queue is long while
the gateway's view of it (its own calls) is not.

Through one gateway process, at the same offered load (a fixed rate, open
loop), ``load_aware`` (MLServer's ``rest_server_requests_in_progress``)
sends most requests to B and its p99 is far better than ``least_request``'s,
which only sees the gateway's own calls. With A's metrics unreachable the
picks fall back to least_request: no error, counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest

from peers.echo_gateway import rest_base, upstream_state
from peers.load import Result, infer
from peers.mlserver import MLServerPeer
from support import GatewayProcess, free_port, scrape_metrics, wait_for, write_config

MODEL = "serial_20ms"
PAYLOAD = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
DIRECT_CONCURRENCY = 20  # A's queue: ~20 x 20 ms = 400 ms for every call that reaches it
RATE = 30.0  # requests/s through the gateway: 60% of one endpoint's capacity (50/s)
SECONDS = 5.0


class LoadOnlyOnB(BaseHTTPRequestHandler):
    """A metrics endpoint on B's host only (127.0.0.2): A's is unreachable."""

    def do_GET(self) -> None:
        body = b"rest_server_requests_in_progress{method=\"POST\"} 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MLServerPeer, MLServerPeer]]:
    metrics_port = free_port()  # the same number on both hosts, as on two machines
    a = MLServerPeer(tmp_path_factory.mktemp("mls_a"), [MODEL], "127.0.0.1", metrics_port)
    b = MLServerPeer(tmp_path_factory.mktemp("mls_b"), [MODEL], "127.0.0.2", metrics_port)
    threads = [threading.Thread(target=peer.start) for peer in (a, b)]  # their start-ups overlap
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for peer in (a, b):
            if peer.proc is None or peer.proc.poll() is not None:
                raise RuntimeError(f"MLServer on {peer.host} did not start:\n{peer.log()}")
        yield a, b
    finally:
        for peer in (a, b):
            peer.stop()


@pytest.fixture(scope="module")
def blind_metrics() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.2", 0), LoadOnlyOnB)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def gateway_config(a: MLServerPeer, b: MLServerPeer, blind_metrics: int) -> str:
    """Upstreams ``aware`` (load_aware), ``least`` (least_request) and, when
    ``blind_metrics`` is a port, ``blind`` (load_aware reading its loads
    there), each over A and B; models ``via_<upstream>`` route to them."""
    endpoints = f'["{a.rest_address}", "{b.rest_address}"]'
    blind = f"""
  - name: blind
    protocol: v2-rest
    endpoints: {endpoints}
    load_balancing: load_aware
    load_metrics: {{preset: mlserver, port: {blind_metrics}, interval: 100ms, stale_after: 300ms}}"""
    blind_route = f"""
  - {{match: {{model: via_blind}}, upstream: blind, rewrite: {{model: {MODEL}}}}}"""
    if not blind_metrics:
        blind = blind_route = ""
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - name: aware
    protocol: v2-rest
    endpoints: {endpoints}
    load_balancing: load_aware
    load_metrics: {{preset: mlserver, port: {a.metrics_port}, interval: 100ms, stale_after: 1s}}
  - {{name: least, protocol: v2-rest, endpoints: {endpoints}, load_balancing: least_request}}{blind}
routes:
  - {{match: {{model: via_aware}}, upstream: aware, rewrite: {{model: {MODEL}}}}}
  - {{match: {{model: via_least}}, upstream: least, rewrite: {{model: {MODEL}}}}}{blind_route}
"""


@pytest.fixture(scope="module")
def gateway(servers: tuple[MLServerPeer, MLServerPeer], blind_metrics: int,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = gateway_config(*servers, blind_metrics)
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def endpoint_requests(gateway: GatewayProcess, upstream: str) -> dict[str, int]:
    return {e["address"]: e["counters"]["requests_total"] for e in upstream_state(gateway, upstream)["endpoints"]}


def p99(results: list[Result]) -> float:
    elapsed = sorted(r.elapsed for r in results)
    return elapsed[min(len(elapsed) - 1, int(len(elapsed) * 0.99))]


async def offered_load(gateway: GatewayProcess, a: MLServerPeer, model: str) -> list[Result]:
    """``RATE`` requests/s through the gateway for ``SECONDS`` while
    ``DIRECT_CONCURRENCY`` clients call A directly, back to back."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def direct() -> None:
            while not stop.is_set():
                result = await infer(session, f"http://{a.rest_address}", MODEL, payload=PAYLOAD, timeout=10)
                assert result.ok, result

        loaders = [asyncio.ensure_future(direct()) for _ in range(DIRECT_CONCURRENCY)]
        try:
            await asyncio.sleep(1.0)  # A's queue builds up (and its gauge is read)
            started = time.monotonic()
            calls = []
            for i in range(int(RATE * SECONDS)):
                await asyncio.sleep(max(0.0, started + i / RATE - time.monotonic()))
                calls.append(asyncio.ensure_future(
                    infer(session, rest_base(gateway), model, payload=PAYLOAD, timeout=10)))
            return list(await asyncio.gather(*calls))
        finally:
            stop.set()
            await asyncio.gather(*loaders)


async def test_load_aware_avoids_the_endpoint_loaded_behind_the_gateways_back(
        gateway: GatewayProcess, servers: tuple[MLServerPeer, MLServerPeer]) -> None:
    a, b = servers
    wait_for(lambda: all(e["load"] is not None for e in upstream_state(gateway, "aware")["endpoints"]), 10,
             "both endpoints' loads read")
    async with aiohttp.ClientSession() as session:  # connections to both endpoints open before measuring
        for model in ("via_aware", "via_least") * 4:
            assert (await infer(session, rest_base(gateway), model, payload=PAYLOAD)).ok
    before = endpoint_requests(gateway, "aware")
    aware = await offered_load(gateway, a, "via_aware")
    after = endpoint_requests(gateway, "aware")
    least = await offered_load(gateway, a, "via_least")
    assert all(r.ok for r in aware + least), [r for r in aware + least if not r.ok][:3]
    to_b = after[b.rest_address] - before[b.rest_address]
    to_a = after[a.rest_address] - before[a.rest_address]
    assert to_b >= 0.9 * len(aware) and to_a + to_b == len(aware), (to_a, to_b)
    aware_p99, least_p99 = p99(aware), p99(least)
    assert least_p99 >= 2 * aware_p99, (aware_p99, least_p99)
    assert upstream_state(gateway, "aware")["counters"]["load_fallbacks_total"] == 0
    loads = {labels["endpoint"] for name, labels, _ in scrape_metrics(gateway)
             if name == "gateway_endpoint_load" and labels["upstream"] == "aware"}
    assert loads == {a.rest_address, b.rest_address}


async def test_unreachable_metrics_fall_back_to_least_request(
        gateway: GatewayProcess, servers: tuple[MLServerPeer, MLServerPeer]) -> None:
    a, b = servers

    def loads() -> dict[str, float | None]:
        return {e["address"]: e["load"] for e in upstream_state(gateway, "blind")["endpoints"]}

    wait_for(lambda: loads()[b.rest_address] == 0, 10, "B's load read from the stand-in on its host")
    assert loads()[a.rest_address] is None  # nothing answers on A's host at that port
    state = upstream_state(gateway, "blind")
    before = state["counters"]["load_fallbacks_total"]
    async with aiohttp.ClientSession() as session:
        results = [await infer(session, rest_base(gateway), "via_blind", payload=PAYLOAD) for _ in range(20)]
    assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
    assert upstream_state(gateway, "blind")["counters"]["load_fallbacks_total"] - before == 20
    assert "load metrics not read" in gateway.log() and "picking by least_request" in gateway.log()

