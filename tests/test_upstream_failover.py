"""Killing a real V2 endpoint under load, for both V2 upstream protocols.

Two gateway processes serve the builtin ``simple`` model over REST and gRPC
(real V2 servers in their own processes); a front gateway balances over
both, once through a ``v2-rest`` upstream and once through a ``v2-grpc``
one. One backend is killed mid-run: with retries on connect failure and
reset, no client sees an error, whichever protocol the upstream speaks.
gRPC reports both failures as UNAVAILABLE, so this checks that the gRPC
adapter tells them apart from a server answering UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.core.errors import CONNECT_FAILURE, CONNECTION_RESET, ErrorKind, UpstreamFailure
from gateway.protocols.v2_grpc.codec import decode_error
from peers.echo_gateway import rest_base, until, upstream_state
from peers.load import assert_all_answered, run_load
from support import GatewayProcess, free_port, write_config

SIMPLE = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                     {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}

BACKEND = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams: [{name: local, protocol: builtin}]
routes: [{match: {model: "*"}, upstream: local}]
"""


def front_config(backends: list[GatewayProcess], dead_port: int) -> str:
    rest = ", ".join(f'"127.0.0.1:{b.ports["rest"]}"' for b in backends)
    grpc_ = ", ".join(f'"127.0.0.1:{b.ports["grpc"]}"' for b in backends)
    retry = "retry: {attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}"
    # Every call in flight on the killed backend resets at once; the budget
    # must let all of them retry (it is tested on its own in test_cluster).
    budget = "retry_budget: {min_concurrency: 8}"
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: via-rest, protocol: v2-rest, endpoints: [{rest}], {budget}}}
  - {{name: via-grpc, protocol: v2-grpc, endpoints: [{grpc_}], {budget}}}
  - {{name: first-dead, protocol: v2-grpc, endpoints: ["127.0.0.1:{dead_port}", {grpc_}]}}
routes:
  - {{match: {{headers: {{x-upstream: rest}}}}, upstream: via-rest, {retry}}}
  - {{match: {{headers: {{x-upstream: first-dead}}}}, upstream: first-dead}}
  - {{match: {{model: "*"}}, upstream: via-grpc, {retry}}}
"""


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    started = []
    try:
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            started.append(GatewayProcess(write_config(directory, BACKEND), directory / "gateway.log").start())
        yield started
    finally:
        for backend in started:
            backend.stop()


def test_grpc_transport_failures_are_named_for_retries() -> None:
    # The details grpc core gives (grpcio 1.7x/1.8x) when nothing listens and
    # when the server dies mid-call.
    refused = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
               "Failed to connect to remote host: Connection refused")
    refused_error = decode_error(grpc.StatusCode.UNAVAILABLE, refused, "u")
    assert isinstance(refused_error, UpstreamFailure) and refused_error.reason == CONNECT_FAILURE
    died = decode_error(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)", "u")
    assert isinstance(died, UpstreamFailure) and died.reason == CONNECTION_RESET
    answered = decode_error(grpc.StatusCode.UNAVAILABLE, "model is loading", "u")
    assert not isinstance(answered, UpstreamFailure) and answered.kind is ErrorKind.UPSTREAM_UNAVAILABLE
    assert not isinstance(decode_error(grpc.StatusCode.INTERNAL, "Socket closed", "u"), UpstreamFailure)


async def test_a_dead_first_grpc_endpoint_is_skipped_by_the_default_retry(backends: list[GatewayProcess],
                                                                          tmp_path: Path) -> None:
    # The default policy retries connect failures only: a gRPC endpoint that
    # refuses connections must count as one.
    with GatewayProcess(write_config(tmp_path, front_config(backends, free_port())), tmp_path / "front.log") as gw:
        results = await run_load(rest_base(gw), "simple", total=12, concurrency=1,
                                 headers={"x-upstream": "first-dead"}, payload=SIMPLE)
    assert_all_answered(results, at_least=12)


@pytest.mark.parametrize("upstream", ["rest", "grpc"])
async def test_killing_a_v2_endpoint_under_load_is_invisible_to_clients(backends: list[GatewayProcess],
                                                                         tmp_path: Path, upstream: str) -> None:
    name = f"via-{upstream}"

    def sent(endpoint: int) -> int:
        return int(upstream_state(gw, name)["endpoints"][endpoint]["counters"]["requests_total"])

    with GatewayProcess(write_config(tmp_path, front_config(backends, free_port())), tmp_path / "front.log") as gw:
        stop = asyncio.Event()
        load = asyncio.ensure_future(run_load(rest_base(gw), "simple", duration=60, concurrency=6, stop=stop,
                                              headers={"x-upstream": upstream}, payload=SIMPLE))
        await until(lambda: sent(1) >= 20, 10, "load on the backend to be killed")
        victim = backends[1].proc
        assert victim is not None
        victim.send_signal(signal.SIGKILL)  # no drain: connections die under in-flight calls
        await asyncio.to_thread(victim.wait, 10)
        survivor = sent(0)
        await until(lambda: upstream_state(gw, name)["endpoints"][1]["counters"]["failures_total"] >= 1
                    and sent(0) >= survivor + 50, 10, "the death noticed and load going on")
        stop.set()
        results = await load
    assert_all_answered(results, at_least=60)
    answers = [r.body["outputs"][0]["data"] for r in results]
    assert all(a == [i + 1 for i in range(16)] for a in answers)
