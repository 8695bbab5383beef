"""Priorities and shedding over real sockets and processes: the gateway in
its own process in front of a V2 stand-in (peers/echo_upstream.py) that
holds every call until released, one call at a time per endpoint
(``max_concurrent: 1``) and a short line (``max_queue: 3``). Requests of a
higher priority push the lowest out of a full line; the shed ones are
answered at once in the protocol's overload form (HTTP 429 with
Retry-After, gRPC RESOURCE_EXHAUSTED) and counted by priority."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from peers.echo_gateway import rest_base, until, upstream_state
from peers.echo_upstream import EchoServer
from peers.load import PAYLOAD, Result, infer
from support import GatewayProcess, metric_value, scrape_metrics, write_config

UPSTREAM = "one_at_a_time"


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoServer]:
    server = EchoServer("HELD", tmp_path_factory.mktemp("echo"))
    try:
        EchoServer.start_all([server])
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(held: EchoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - name: {UPSTREAM}
    protocol: v2-rest
    endpoints: ["{held.address_for('v2-rest')}"]
    timeout: 30s
    max_concurrent: 1
    max_queue: 3
routes:
  - {{match: {{model: urgent}}, upstream: {UPSTREAM}, priority: 1}}
  - {{match: {{model: "*"}}, upstream: {UPSTREAM}}}
"""
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def waiting(gateway: GatewayProcess) -> int:
    return int(upstream_state(gateway, UPSTREAM)["pending"])


def shed_count(gateway: GatewayProcess, priority: str) -> float:
    return metric_value(scrape_metrics(gateway), "gateway_shed_total", upstream=UPSTREAM, priority=priority)


async def test_higher_priorities_push_the_lowest_out_of_a_full_line(gateway: GatewayProcess,
                                                                   held: EchoServer) -> None:
    base = rest_base(gateway)
    before = {p: shed_count(gateway, p) for p in ("0", "1", "2")}
    held.control(hold=True)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            def send(model: str = "plain", headers: dict[str, str] | None = None,
                     payload: dict[str, Any] | None = None) -> asyncio.Future[Result]:
                return asyncio.ensure_future(infer(session, base, model, headers, payload, timeout=30))

            first = send()  # takes the one slot and is held upstream
            await until(lambda: held.stats()["in_flight"] == 1, 10, "the first call held upstream")
            lows = [send() for _ in range(3)]  # no priority anywhere: the lowest
            await until(lambda: waiting(gateway) == 3, 10, "three waiting")
            # Each way of asking for priority 1 pushes one lowest waiter out: the newest first.
            highs = [send(headers={"x-gateway-priority": "1"})]
            await until(lambda: lows[2].done(), 10, "the newest low one shed")
            highs.append(send(payload={**PAYLOAD, "parameters": {"priority": 1}}))  # Triton's own parameter
            await until(lambda: lows[1].done(), 10, "the next low one shed")
            highs.append(send("urgent"))  # the route's default
            await until(lambda: lows[0].done(), 10, "the last low one shed")
            # The line now holds priority 1 only: a lower newcomer is refused, and so is an equal one.
            late_low, late_two, late_high = await asyncio.gather(
                send(), send(headers={"x-gateway-priority": "2"}), send(headers={"x-gateway-priority": "1"}))
            shed = [lows[0].result(), lows[1].result(), lows[2].result(), late_low, late_two, late_high]
            assert not first.done() and not any(h.done() for h in highs), "shed while the line still waits"
            assert waiting(gateway) == 3 and held.stats()["in_flight"] == 1
            held.control(hold=False)
            answered = await asyncio.gather(first, *highs)
    finally:
        held.control(hold=False)
    assert [r.status for r in answered] == [200] * 4, answered
    for result in shed:
        assert result.status == 429 and "saturated" in result.error, result
        assert result.elapsed < 5, result
    counts = {p: shed_count(gateway, p) - before[p] for p in ("0", "1", "2")}
    assert counts == {"0": 4, "1": 1, "2": 1}, counts
    assert held.stats()["max_in_flight"] <= 1


async def test_the_shed_carry_retry_after(gateway: GatewayProcess, held: EchoServer) -> None:
    base = rest_base(gateway)
    held.control(hold=True)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            calls = [asyncio.ensure_future(infer(session, base, "urgent", timeout=30)) for _ in range(4)]
            await until(lambda: waiting(gateway) == 3, 10, "three waiting")
            async with session.post(f"{base}/v2/models/plain/infer", json=PAYLOAD) as reply:
                status, retry_after = reply.status, reply.headers.get("Retry-After")
            held.control(hold=False)
            results = await asyncio.gather(*calls)
    finally:
        held.control(hold=False)
    assert (status, retry_after) == (429, "1")
    assert [r.status for r in results] == [200] * 4


async def test_grpc_requests_wait_by_their_priority_and_are_shed_as_resource_exhausted(
        gateway: GatewayProcess, held: EchoServer) -> None:
    base = rest_base(gateway)

    def grpc_call(priority: int) -> str:
        with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
            item = grpcclient.InferInput("x", [4], "INT32")
            item.set_data_from_numpy(np.arange(4, dtype=np.int32))
            try:
                client.infer("plain", [item], priority=priority, client_timeout=20)
            except InferenceServerException as error:
                return f"{error.status()} {error.message()}"
            return "ok"

    held.control(hold=True)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            first = asyncio.ensure_future(infer(session, base, "plain", timeout=30))
            await until(lambda: held.stats()["in_flight"] == 1, 10, "the first call held upstream")
            lows = [asyncio.ensure_future(infer(session, base, "plain", timeout=30)) for _ in range(3)]
            await until(lambda: waiting(gateway) == 3, 10, "three waiting")
            high = asyncio.ensure_future(asyncio.to_thread(grpc_call, 1))  # Triton's priority, over gRPC
            await until(lambda: lows[2].done(), 10, "the newest low one shed for the gRPC request")
            refused = await asyncio.to_thread(grpc_call, 0)  # no priority: the lowest, refused at once
            assert not high.done() and waiting(gateway) == 3
            held.control(hold=False)
            answered = await asyncio.gather(first, lows[0], lows[1])
            outcome = await high
    finally:
        held.control(hold=False)
    assert refused.startswith("StatusCode.RESOURCE_EXHAUSTED") and "saturated" in refused, refused
    assert lows[2].result().status == 429
    assert outcome == "ok" and [r.status for r in answered] == [200] * 3, (outcome, answered)
