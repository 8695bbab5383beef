"""The gateway's own overhead, measured: ``gateway_overhead_seconds``, the
access log's ``overhead_ms`` and the ``server_timing`` listener key, over real
sockets with the gateway in its own process in front of a V2 stand-in
(peers/echo_upstream.py) that holds every answer for a known time, so the
upstream's share of each request is known from outside."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from tritonclient.grpc import service_pb2

from peers.echo_upstream import EchoServer
from peers.load import PAYLOAD
from support import GatewayProcess, metric_value, parse_yaml_config, scrape_metrics, wait_for, write_config

DELAY = 0.05  # s, the stand-in's answer time
REQUESTS = 12
# W3C Server Timing, as the gateway writes it: two metrics with a duration in milliseconds.
SERVER_TIMING = re.compile(r"^gateway;dur=(\d+(?:\.\d+)?), upstream;dur=(\d+(?:\.\d+)?)$")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoServer]:
    with EchoServer.running({"slow": EchoServer("SLOW", tmp_path_factory.mktemp("echo"), delay=DELAY)}) as servers:
        yield servers["slow"]


@pytest.fixture(scope="module")
def gateway(slow: EchoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    directory = tmp_path_factory.mktemp("gw")
    access_log = directory / "access.log"
    config = f"""
admin: {{address: "127.0.0.1:0"}}
observability:
  access_log: {{format: json, destination: "{access_log}"}}
listeners:
  - {{name: timed, protocol: v2-rest, address: "127.0.0.1:0", server_timing: true}}
  - {{name: plain, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0", server_timing: true}}
upstreams:
  - {{name: slow, protocol: v2-rest, endpoints: ["{slow.address_for('v2-rest')}"], timeout: 10s}}
routes:
  - {{match: {{model: "*"}}, upstream: slow}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw, access_log


def infer_url(gw: GatewayProcess, listener: str) -> str:
    return f"http://{gw.url(listener)}/v2/models/echo/infer"


def timings(header: str | None) -> tuple[float, float]:
    """(gateway, upstream) milliseconds of a Server-Timing value."""
    assert header is not None, "no Server-Timing header"
    match = SERVER_TIMING.fullmatch(header)
    assert match is not None, header
    return float(match.group(1)), float(match.group(2))


def log_lines(access_log: Path, listener: str, count: int) -> list[dict[str, Any]]:
    def lines() -> list[dict[str, Any]] | None:
        found = [json.loads(line) for line in access_log.read_text().splitlines()] if access_log.exists() else []
        mine = [line for line in found if line["listener"] == listener]
        return mine if len(mine) >= count else None

    return wait_for(lines, 10, f"{count} access-log lines of {listener}")  # type: ignore[no-any-return]


def test_overhead_is_the_time_in_the_gateway_less_the_upstream_wait(
        gateway: tuple[GatewayProcess, Path]) -> None:
    gw, access_log = gateway
    with requests.Session() as session:
        for _ in range(REQUESTS):
            reply = session.post(infer_url(gw, "plain"), json=PAYLOAD, timeout=10)
            assert reply.status_code == 200, reply.text
            assert "server-timing" not in reply.headers  # off by default

    # The histogram is observed once the answer has left: wait for all of them.
    def settled() -> list[tuple[str, dict[str, str], float]] | None:
        samples = scrape_metrics(gw)
        done = metric_value(samples, "gateway_overhead_seconds_count", listener="plain", operation="infer")
        return samples if done == REQUESTS else None

    samples = wait_for(settled, 10, "every request's overhead observed")
    labels = {"listener": "plain", "operation": "infer"}
    overhead = metric_value(samples, "gateway_overhead_seconds_sum", **labels)
    duration = metric_value(samples, "gateway_request_duration_seconds_sum", **labels)
    assert metric_value(samples, "gateway_request_duration_seconds_count", **labels) == REQUESTS
    # Each request waited DELAY on the upstream: that wait is not the gateway's.
    assert 0 < overhead < duration - REQUESTS * DELAY * 0.9, (overhead, duration)
    # The whole of it is in the histogram: every request below the largest finite bucket (1 s).
    assert metric_value(samples, "gateway_overhead_seconds_bucket", le="1.0", **labels) == REQUESTS

    for line in log_lines(access_log, "plain", REQUESTS):
        assert line["upstream_ms"] >= DELAY * 1000 * 0.9, line
        assert 0 < line["overhead_ms"] < line["duration_ms"], line
        # duration = overhead + upstream, up to the three decimals' rounding
        assert abs(line["overhead_ms"] + line["upstream_ms"] - line["duration_ms"]) <= 0.002, line


@pytest.mark.parametrize("chunked", [False, True], ids=["fast-path", "aiohttp"])
def test_server_timing_tells_the_gateways_and_the_upstreams_share(gateway: tuple[GatewayProcess, Path],
                                                                  chunked: bool) -> None:
    gw, _ = gateway
    body = json.dumps(PAYLOAD).encode()
    with requests.Session() as session:
        for _ in range(3):
            # A chunked body is not the fast path's: the aiohttp server answers it.
            data: Any = iter([body]) if chunked else body
            started = time.perf_counter()
            reply = session.post(infer_url(gw, "timed"), data=data, timeout=10,
                                 headers={"content-type": "application/json"})
            latency_ms = (time.perf_counter() - started) * 1000
            assert reply.status_code == 200, reply.text
            gateway_ms, upstream_ms = timings(reply.headers.get("server-timing"))
            assert upstream_ms >= DELAY * 1000 * 0.9
            assert 0 < gateway_ms and gateway_ms + upstream_ms <= latency_ms, (gateway_ms, upstream_ms, latency_ms)
        # An answer without an upstream (an unknown path) is all the gateway's.
        reply = session.get(f"http://{gw.url('timed')}/nope", timeout=10)
        assert reply.status_code == 404
        assert timings(reply.headers.get("server-timing"))[1] == 0.0


def test_server_timing_on_grpc_is_trailing_metadata(gateway: tuple[GatewayProcess, Path]) -> None:
    gw, _ = gateway
    request = service_pb2.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="x", datatype="INT32", shape=[4])
    tensor.contents.int_contents.extend([1, 2, 3, 4])
    with grpc.insecure_channel(gw.url("grpc")) as channel:
        rpc = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        started = time.perf_counter()
        _, call = rpc.with_call(request.SerializeToString(), timeout=10)
        latency_ms = (time.perf_counter() - started) * 1000
    gateway_ms, upstream_ms = timings(dict(call.trailing_metadata() or ()).get("server-timing"))
    assert upstream_ms >= DELAY * 1000 * 0.9
    assert 0 < gateway_ms and gateway_ms + upstream_ms <= latency_ms


def test_server_timing_must_be_a_bool() -> None:
    from gateway.config.node import ConfigError

    config = """
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0", server_timing: "on"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - {match: {model: "*"}, upstream: local}
"""
    with pytest.raises(ConfigError, match="server_timing"):
        parse_yaml_config(config)
    assert parse_yaml_config(config.replace('"on"', "true")).listeners[0].server_timing is True
    assert parse_yaml_config(config.replace(', server_timing: "on"', "")).listeners[0].server_timing is False
