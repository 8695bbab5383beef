"""Tenants kept apart by listener: Triton's statistics show a listener only
the models it routes (the test ``/ready`` applies), with the counts of the
route it resolves them to, so one tenant never learns another's models or
traffic, not even for a model name both use. ``GET /v2/models/stats``
gets the same answer on the fast path (HTTP/1.1) and on the aiohttp app
(HTTP/1.0 is handed over); gRPC's ModelStatistics the same, with and
without a name.

Tenant A has listeners ``a`` (REST) and ``ga`` (gRPC) and the model
``simple``; tenant B has ``b`` and ``gb`` and the model ``identity``; both
name a model ``m``, each its own (a rewrite).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from http_wire import exchange
from tritonclient.utils import InferenceServerException

from support import SIMPLE_INFER_REQUEST, GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: a, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: b, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: ga, protocol: v2-grpc, address: "127.0.0.1:0"}
  - {name: gb, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - {match: {listener: a, model: simple}, upstream: local}
  - {match: {listener: a, model: m}, upstream: local, rewrite: {model: simple}}
  - {match: {listener: ga, model: simple}, upstream: local}
  - {match: {listener: b, model: identity}, upstream: local}
  - {match: {listener: b, model: m}, upstream: local, rewrite: {model: identity}}
  - {match: {listener: gb, model: identity}, upstream: local}
"""
IDENTITY_REQUEST = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
# Inferences per (listener, model): distinct counts, so a leak shows as a wrong number.
SENT = {("a", "simple"): 2, ("a", "m"): 1, ("b", "identity"): 3, ("b", "m"): 4}


def http(port: int, method: str, path: str, body: Any = None, version: str = "1.1") -> tuple[int, Any]:
    """One request on its own connection; HTTP/1.0 makes the fast path hand
    the connection to the aiohttp app."""
    data = json.dumps(body).encode() if body is not None else b""
    status, _, answer = exchange(port, method, path, [("Content-Type", "application/json")], data, version)
    return status, json.loads(answer) if answer else None


def both_paths(port: int, path: str) -> tuple[int, Any]:
    """``GET path`` on a connection the fast path reads (HTTP/1.1) and on
    one it hands to the aiohttp app at once (HTTP/1.0): one answer."""
    fast_status, fast_body = http(port, "GET", path)
    slow_status, slow_body = http(port, "GET", path, version="1.0")
    assert (fast_status, fast_body) == (slow_status, slow_body), path
    return fast_status, fast_body


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("tenants")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        for (listener, model), count in SENT.items():
            body = SIMPLE_INFER_REQUEST if (listener, model) in (("a", "simple"), ("a", "m")) else IDENTITY_REQUEST
            for _ in range(count):
                status, answer = http(gw.ports[listener], "POST", f"/v2/models/{model}/infer", body)
                assert status == 200, answer

        def counted() -> bool:  # a request is counted (metrics, then statistics) once its answer has left
            return metric_value(scrape_metrics(gw), "gateway_requests_total", operation="infer") == sum(SENT.values())

        wait_for(counted, 10, "the last inference to be counted")
        yield gw


def executions(body: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: int(s.get("execution_count", 0)) for s in body["model_stats"]}


@pytest.mark.parametrize(("listener", "own", "other"), [("a", "simple", "identity"), ("b", "identity", "simple")])
def test_rest_statistics_show_only_the_listeners_models(gateway: GatewayProcess, listener: str, own: str,
                                                        other: str) -> None:
    port = gateway.ports[listener]
    status, body = both_paths(port, "/v2/models/stats")
    assert status == 200 and executions(body) == {own: SENT[(listener, own)], "m": SENT[(listener, "m")]}
    status, body = both_paths(port, f"/v2/models/{own}/stats")
    assert status == 200 and executions(body) == {own: SENT[(listener, own)]}
    status, body = both_paths(port, "/v2/models/m/stats")  # one name, each tenant's own model and counts
    assert status == 200 and executions(body) == {"m": SENT[(listener, "m")]}
    # What /ready says of the other tenant's model, statistics say too.
    ready_status, ready_body = http(port, "GET", f"/v2/models/{other}/ready")
    status, body = both_paths(port, f"/v2/models/{other}/stats")
    assert ready_status == status == 404 and ready_body == body and other in body["error"], body
    status, body = both_paths(port, f"/v2/models/{other}/versions/1/stats")
    assert status == 404 and other in body["error"]


def _grpc_stats(gw: GatewayProcess, listener: str, model: str = "") -> dict[str, int]:
    with grpcclient.InferenceServerClient(gw.url(listener)) as client:
        return executions(client.get_inference_statistics(model, as_json=True))


def test_grpc_statistics_show_only_the_listeners_models(gateway: GatewayProcess) -> None:
    array = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = grpcclient.InferInput(name, [1, 16], "INT32")
        item.set_data_from_numpy(array)
        inputs.append(item)
    with grpcclient.InferenceServerClient(gateway.url("ga")) as client:
        for _ in range(5):
            client.infer("simple", inputs)
    wait_for(lambda: metric_value(scrape_metrics(gateway), "gateway_requests_total", listener="ga",
                                  operation="infer") == 5, 10, "the inferences to be counted")
    assert _grpc_stats(gateway, "ga", "simple") == {"simple": 5}
    assert _grpc_stats(gateway, "ga") == {"simple": 5}  # listener a's own route counts its own requests
    assert _grpc_stats(gateway, "gb") == {"identity": 0}  # routed, never used: zeros
    assert _grpc_stats(gateway, "gb", "identity") == {"identity": 0}
    for listener, model in (("gb", "simple"), ("ga", "identity"), ("ga", "m")):
        with pytest.raises(InferenceServerException) as error:
            _grpc_stats(gateway, listener, model)
        assert error.value.status() == "StatusCode.NOT_FOUND" and model in error.value.message()
