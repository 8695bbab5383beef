"""Request id and W3C trace context travel client -> gateway -> upstream ->
response, over REST and gRPC, on both upstream protocols.

Gateway A (the one under test) forwards to gateway B over V2 REST or V2 gRPC;
B's JSON access log shows what reached the upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from support import JSON_ACCESS_LOG_CONFIG, SIMPLE_INFER_REQUEST, GatewayProcess, wait_for, write_config

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE"

UPSTREAM = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - upstream: local
"""


def _front(rest_port: int, grpc_port: int) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: via-rest, protocol: v2-rest, endpoints: ["127.0.0.1:{rest_port}"]}}
  - {{name: via-grpc, protocol: v2-grpc, endpoints: ["127.0.0.1:{grpc_port}"]}}
routes:
  - {{match: {{headers: {{x-hop: grpc}}}}, upstream: via-grpc}}
  - {{upstream: via-rest}}
"""


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    directory = tmp_path_factory.mktemp("trace")
    log = directory / "upstream-access.jsonl"
    upstream_config = write_config(directory, UPSTREAM + JSON_ACCESS_LOG_CONFIG.format(log=log), "upstream.yaml")
    with GatewayProcess(upstream_config, directory / "upstream.log") as upstream:
        front_config = write_config(directory, _front(upstream.ports["rest"], upstream.ports["grpc"]), "front.yaml")
        with GatewayProcess(front_config, directory / "front.log") as front:
            yield front, log


def _upstream_line(log: Path, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        lines = log.read_text().splitlines() if log.exists() else []
        return next((json.loads(x) for x in lines if json.loads(x)["request_id"] == request_id), None)

    return wait_for(find, 5, f"the upstream's log line for {request_id}")  # type: ignore[no-any-return]


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_rest_client(chain: tuple[GatewayProcess, Path], hop: str) -> None:
    front, log = chain
    request_id = f"rest-client-via-{hop}"
    reply = requests.post(f"http://{front.url('rest')}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST,
                          timeout=10, headers={"x-request-id": request_id, "traceparent": TRACEPARENT,
                                               "tracestate": TRACESTATE, "x-hop": hop})
    assert reply.status_code == 200, reply.text
    assert (reply.headers["x-request-id"], reply.headers["traceparent"]) == (request_id, TRACEPARENT)
    assert reply.headers["tracestate"] == TRACESTATE
    line = _upstream_line(log, request_id)
    assert line["trace_id"] == TRACEPARENT[3:35]
    assert line["protocol"] == {"rest": "v2-rest", "grpc": "v2-grpc"}[hop]


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_grpc_client(chain: tuple[GatewayProcess, Path], hop: str) -> None:
    front, log = chain
    request_id = f"grpc-client-via-{hop}"
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(a)
    client = grpcclient.InferenceServerClient(front.url("grpc"))
    try:
        result = client.infer("simple", inputs, headers={"x-request-id": request_id, "traceparent": TRACEPARENT,
                                                         "tracestate": TRACESTATE, "x-hop": hop})
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    line = _upstream_line(log, request_id)
    assert line["trace_id"] == TRACEPARENT[3:35]
