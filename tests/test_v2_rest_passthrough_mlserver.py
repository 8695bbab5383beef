"""Pass-through and its fallbacks against a real MLServer 1.7.1 (no binary
tensor extension, no output selection): what a client sees must not change.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import requests
import tritonclient.http as httpclient

from peers.mlserver import MLServerPeer
from support import SIMPLE_INFER_REQUEST, GatewayProcess, passthrough_counts, wait_for, write_config

HEADER_LENGTH = "Inference-Header-Content-Length"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("passthrough-mlserver")
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: mlserver, protocol: v2-rest, endpoints: ["{mlserver.rest_address}"]}}
routes:
  - {{match: {{model: "*"}}, upstream: mlserver}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw




def counted(gateway: GatewayProcess, mode: str, before: dict[tuple[str, str], float]) -> None:
    wait_for(lambda: passthrough_counts(gateway).get(("mlserver", mode), 0) > before.get(("mlserver", mode), 0), 5,
             f"a {mode} request to be counted")


def test_a_json_request_gets_mlserver_s_own_answer(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    body = orjson.dumps({**SIMPLE_INFER_REQUEST, "id": "same-id"})
    before = passthrough_counts(gateway)
    direct = requests.post(f"http://{mlserver.rest_address}/v2/models/simple/infer", data=body, timeout=10)
    via = requests.post(f"http://{gateway.url()}/v2/models/simple/infer", data=body, timeout=10)
    assert direct.status_code == via.status_code == 200, via.text
    assert via.content == direct.content
    counted(gateway, "verbatim", before)


def test_tritonclient_binary_inputs_are_translated_for_mlserver(gateway: GatewayProcess) -> None:
    """tritonclient sends binary tensors by default; MLServer answers those
    with 422, so the gateway sends it JSON and answers in binary."""
    before = passthrough_counts(gateway)
    with httpclient.InferenceServerClient(gateway.url()) as client:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    counted(gateway, "translated", before)


def test_binary_outputs_of_a_json_request_are_written_by_the_gateway(gateway: GatewayProcess) -> None:
    """JSON inputs go to MLServer unchanged; it ignores binary_data_output,
    so the gateway writes the binary answer the client asked for."""
    before = passthrough_counts(gateway)
    body = orjson.dumps({**SIMPLE_INFER_REQUEST, "parameters": {"binary_data_output": True}})
    reply = requests.post(f"http://{gateway.url()}/v2/models/simple/infer", data=body, timeout=10)
    assert reply.status_code == 200, reply.text
    length = int(reply.headers[HEADER_LENGTH])
    head = orjson.loads(reply.content[:length])
    assert [o["parameters"]["binary_data_size"] for o in head["outputs"]] == [64, 64]
    np.testing.assert_array_equal(np.frombuffer(reply.content[length:length + 64], dtype="<i4"), (A + B).ravel())
    counted(gateway, "request_only", before)
    with httpclient.InferenceServerClient(gateway.url()) as client:  # tritonclient: JSON in, binary out
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(A, binary_data=False)
        inputs[1].set_data_from_numpy(B, binary_data=False)
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_the_outputs_asked_for_are_selected_by_the_gateway(gateway: GatewayProcess) -> None:
    """MLServer answers every output whatever the request's `outputs` say."""
    body = orjson.dumps({**SIMPLE_INFER_REQUEST, "outputs": [{"name": "OUTPUT1"}]})
    reply = requests.post(f"http://{gateway.url()}/v2/models/simple/infer", data=body, timeout=10)
    assert reply.status_code == 200, reply.text
    assert [o["name"] for o in reply.json()["outputs"]] == ["OUTPUT1"]


def test_mlserver_errors_keep_their_mapping(gateway: GatewayProcess) -> None:
    body = orjson.dumps({"inputs": [SIMPLE_INFER_REQUEST["inputs"][0]]})  # simple needs both inputs
    reply = requests.post(f"http://{gateway.url()}/v2/models/simple/infer", data=body, timeout=10)
    assert reply.status_code == 400
    assert "simple expects inputs INPUT0 and INPUT1" in reply.json()["error"]
