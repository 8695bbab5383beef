"""Active health checks through every real upstream adapter: V2
REST (``/v2/health/ready``) and V2 gRPC (``ServerReady``) against a second
gateway process, UM-Bridge (``/Info``) against the umbridge package's
server, GraphStorm (``/ping``) against the stand-in endpoint.

Each upstream's peer is stopped and started again on the same port; the
gateway under test must mark its endpoint unhealthy and healthy again
(admin ``/upstreams`` and ``/metrics``), and readiness and traffic follow.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from graphstorm_payloads import JSON, TARGET_MODEL, movielens

from peers.echo_gateway import upstream_state
from peers.graphstorm_standin import StandIn
from peers.umbridge_peer import UmbridgePeer
from support import (
    SIMPLE_INFER_REQUEST,
    GatewayProcess,
    free_port,
    metric_value,
    scrape_metrics,
    wait_for,
    write_config,
)

CHECK = "health_check: {interval: 150ms, timeout: 500ms, unhealthy_threshold: 1, healthy_threshold: 1}"
# A flip takes about one check interval; these leave room for a loaded machine.
DOWN_WITHIN = 5.0  # seconds from the peer's exit to "unhealthy"
FLIP_TIMEOUT = 10.0  # other waits (a restarted peer takes its start-up time first)


@dataclass
class Peer:
    start: Callable[[], None]
    stop: Callable[[], None]


class Peers:
    """The real peers, each restartable on its own port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.v2_rest_port, self.v2_grpc_port = free_port(), free_port()
        back = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:{self.v2_rest_port}"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:{self.v2_grpc_port}"}}
upstreams: [{{name: local, protocol: builtin}}]
routes: [{{match: {{model: "*"}}, upstream: local}}]
"""
        self.back = GatewayProcess(write_config(directory, back, "back.yaml"), directory / "back.log")
        self.umbridge = UmbridgePeer(directory, free_port())
        self.graphstorm_port = free_port()
        self.standin: StandIn | None = None

    def start_standin(self) -> None:
        self.standin = StandIn(self.directory, "--port", str(self.graphstorm_port))

    def stop_standin(self) -> None:
        if self.standin is not None:
            self.standin.stop()
            self.standin = None

    def of(self, protocol: str) -> Peer:
        if protocol in ("v2-rest", "v2-grpc"):
            return Peer(lambda: self.back.start() and None, lambda: self.back.stop() and None)
        if protocol == "umbridge":
            return Peer(lambda: self.umbridge.start() and None, self.umbridge.stop)
        return Peer(self.start_standin, self.stop_standin)

    def start_all(self) -> None:
        self.back.start()
        self.umbridge.start()
        self.start_standin()

    def stop_all(self) -> None:
        for stop in (self.back.stop, self.umbridge.stop, self.stop_standin):
            try:
                stop()
            except Exception:  # stop the rest regardless
                pass


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    started = Peers(tmp_path_factory.mktemp("peers"))
    try:
        started.start_all()
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def gateway(peers: Peers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
readiness: {{upstreams: all}}
upstreams:
  - {{name: v2-rest, protocol: v2-rest, endpoints: ["127.0.0.1:{peers.v2_rest_port}"], {CHECK}}}
  - {{name: v2-grpc, protocol: v2-grpc, endpoints: ["127.0.0.1:{peers.v2_grpc_port}"], {CHECK}}}
  - {{name: umbridge, protocol: umbridge, endpoints: ["{peers.umbridge.address}"], {CHECK}}}
  - {{name: graphstorm, protocol: graphstorm, endpoints: ["127.0.0.1:{peers.graphstorm_port}"], {CHECK}}}
routes:
  - {{match: {{model: gs-model, listener: gs}}, upstream: graphstorm}}
  - {{match: {{model: square}}, upstream: umbridge}}
  - {{match: {{model: simple, headers: {{x-up: v2-grpc}}}}, upstream: v2-grpc}}
  - {{match: {{model: simple}}, upstream: v2-rest}}
"""
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def traffic_ok(gw: GatewayProcess, protocol: str) -> bool:
    """One real request of the kind each upstream serves, through the gateway."""
    if protocol == "graphstorm":
        reply = requests.post(f"http://{gw.url('gs')}/invocations", json=movielens(),
                              headers={**JSON, TARGET_MODEL: "gs-model"}, timeout=10)
        return reply.status_code == 200 and reply.json()["status_code"] == 200
    if protocol == "umbridge":
        body: dict[str, Any] = {"inputs": [{"name": "input_0", "datatype": "FP64", "shape": [3],
                                            "data": [1.0, 2.0, 3.0]}]}
        reply = requests.post(f"http://{gw.url('rest')}/v2/models/square/infer", json=body, timeout=10)
        return reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [1.0, 4.0, 9.0]
    reply = requests.post(f"http://{gw.url('rest')}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST,
                          headers={"x-up": protocol}, timeout=10)
    return reply.status_code == 200


def ready(gw: GatewayProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gw.ports['admin']}/readyz", timeout=5) as reply:
            return reply.status == 200
    except urllib.error.HTTPError:
        return False


def healthy(gw: GatewayProcess, upstream: str) -> bool:
    endpoint = upstream_state(gw, upstream)["endpoints"][0]
    return bool(endpoint["healthy"])


@pytest.mark.parametrize("protocol", ["v2-rest", "v2-grpc", "umbridge", "graphstorm"])
def test_health_check_follows_the_endpoint(gateway: GatewayProcess, peers: Peers, protocol: str) -> None:
    peer = peers.of(protocol)
    wait_for(lambda: all(healthy(gateway, u) for u in ("v2-rest", "v2-grpc", "umbridge", "graphstorm")),
             FLIP_TIMEOUT, "every upstream to be healthy")
    assert ready(gateway) and traffic_ok(gateway, protocol)
    failures_before = upstream_state(gateway, protocol)["endpoints"][0]["counters"]["health_check_failures_total"]

    peer.stop()
    try:
        wait_for(lambda: not healthy(gateway, protocol), DOWN_WITHIN, f"{protocol} to be marked unhealthy")
        endpoint = upstream_state(gateway, protocol)["endpoints"][0]
        assert endpoint["counters"]["health_check_failures_total"] > failures_before
        assert metric_value(scrape_metrics(gateway), "gateway_endpoint_healthy", upstream=protocol) == 0
        assert not ready(gateway)  # readiness: every routed upstream must have an endpoint
        assert not traffic_ok(gateway, protocol)
    finally:
        peer.start()  # on the same port

    wait_for(lambda: healthy(gateway, protocol), FLIP_TIMEOUT, f"{protocol} to be healthy again")
    assert metric_value(scrape_metrics(gateway), "gateway_endpoint_healthy", upstream=protocol) == 1
    wait_for(lambda: ready(gateway), FLIP_TIMEOUT, "readiness to come back")
    assert traffic_ok(gateway, protocol)
