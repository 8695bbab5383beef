"""V2 gRPC pass-through against a real MLServer (separate processes):
tritonclient.grpc -> gateway -> MLServer gRPC, with the model name
rewritten by an appended field, classification falling back to
translation, a mirror to MLServer's REST side, and big raw tensors."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from gateway.protocols.v2_grpc import messages as pb
from peers.mlserver import MLServerPeer
from support import GatewayProcess, passthrough_counts, wait_for, write_config


def config(peer: MLServerPeer) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
limits: {{max_request_bytes: 64MiB}}
listeners:
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: mlserver-grpc, protocol: v2-grpc, endpoints: ["{peer.grpc_address}"]}}
  - {{name: mlserver-rest, protocol: v2-rest, endpoints: ["{peer.rest_address}"]}}
routes:
  - match: {{model: alias}}
    upstream: mlserver-grpc
    rewrite: {{model: simple}}
  - match: {{model: trig_fp32}}
    upstream: mlserver-grpc
    mirror: [{{upstream: mlserver-rest}}]
  - match: {{model: "*"}}
    upstream: mlserver-grpc
"""


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("passthrough")
    with GatewayProcess(write_config(directory, config(mlserver)), directory / "gateway.log") as gw:
        yield gw


def passthrough_count(gateway: GatewayProcess, mode: str) -> float:
    return passthrough_counts(gateway).get(("mlserver-grpc", mode), 0.0)


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        item = grpcclient.InferInput(name, list(array.shape), "INT32")
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def test_same_answer_as_mlserver_itself(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    """The reply the client gets is the very message MLServer sends."""
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), -5, dtype=np.int32)
    before = passthrough_count(gateway, "verbatim")
    answers = []
    for address in (gateway.url("grpc"), mlserver.grpc_address):
        with grpcclient.InferenceServerClient(address) as client:
            result = client.infer("simple", simple_inputs(a, b), request_id="r-9", parameters={"tenant": "blue"})
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            answers.append(result.get_response().SerializeToString())
    assert answers[0] == answers[1]
    assert passthrough_count(gateway, "verbatim") == before + 1


def test_rewrite_reaches_mlserver_by_an_appended_field(gateway: GatewayProcess) -> None:
    """MLServer has no model 'alias': it answers because it reads the
    appended model_name (the last value wins), and the client sees 'alias'."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        result = client.infer("alias", simple_inputs(a, a))
    assert result.get_response().model_name == "alias"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_classification_is_done_by_the_gateway(gateway: GatewayProcess) -> None:
    """A request asking for classification is translated: the gateway
    classifies MLServer's tensor (MLServer knows no classification)."""
    a = np.array([[5, 1, 9, 3] * 4], dtype=np.int32)
    before = passthrough_count(gateway, "translated")
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        result = client.infer("simple", simple_inputs(a, np.zeros_like(a)),
                              outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    top = [item.decode() for item in result.as_numpy("OUTPUT0").reshape(-1)]
    assert top == ["9:2", "9:6"]
    assert passthrough_count(gateway, "translated") == before  # not a same-protocol copy any more


def test_typed_request_gets_raw_reply(gateway: GatewayProcess) -> None:
    """MLServer answers a typed request with typed contents; the listener
    answers raw (its default), so that reply is re-encoded, not relayed."""
    message = pb.ModelInferRequest(model_name="simple", id="typed")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    before = passthrough_count(gateway, "request_only")
    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        reply = pb.ModelInferResponse.FromString(
            channel.unary_unary(pb.method_path("ModelInfer"))(message.SerializeToString(), timeout=30))
    assert [np.frombuffer(raw, dtype=np.int32).tolist() for raw in reply.raw_output_contents] == [
        [2 * i for i in range(16)], [0] * 16]
    assert passthrough_count(gateway, "request_only") == before + 1


def test_mirror_to_mlserver_rest(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    """The shadow speaks REST: it gets the decoded request, the main
    upstream the client's bytes; MLServer logs both calls."""
    x = np.array([[0.5, 2.0]], dtype=np.float32)
    y = np.array([[3.0]], dtype=np.float32)
    seen = len(mlserver.calls("trig_fp32"))
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        inputs = [grpcclient.InferInput("x", [1, 2], "FP32"), grpcclient.InferInput("y", [1, 1], "FP32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(y)
        result = client.infer("trig_fp32", inputs, request_id="mirrored")
    np.testing.assert_allclose(result.as_numpy("g"), np.exp(x[:, 1:] / 2) + y * y, rtol=1e-6)

    def both_calls() -> list[dict[str, object]] | None:
        calls = mlserver.calls("trig_fp32")[seen:]
        return calls if len(calls) >= 2 else None

    calls = wait_for(both_calls, 20, "the mirrored copy to reach MLServer")
    assert [c["id"] for c in calls] == ["mirrored", "mirrored"]


def test_16_mib_raw_tensor(gateway: GatewayProcess) -> None:
    array = np.random.default_rng(7).random(4 << 20, dtype=np.float32).reshape(1, -1)
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        item = grpcclient.InferInput("INPUT0", list(array.shape), "FP32")
        item.set_data_from_numpy(array)
        out = client.infer("identity_fp32", [item], client_timeout=120).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, array)


def test_gateway_log_is_clean(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
