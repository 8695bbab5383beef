"""The V2 gRPC listener against the builtin models, in its own process:
unmodified tritonclient.grpc, grpcio's own health and reflection clients,
and hand-made bad requests (built with tritonclient's message classes, so
the requests do not depend on the gateway's own codec)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from support import GatewayProcess, write_config

LIMIT = 8 << 20  # a small limit, so the over-limit test stays cheap

CONFIG = f"""
admin: {{address: "127.0.0.1:0"}}
limits: {{max_request_bytes: {LIMIT}, max_tensor_elements: 100000000}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: typed, protocol: v2-grpc, address: "127.0.0.1:0", output_contents: typed}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: "*"}}
    upstream: local
"""
SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("grpc")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as c:
        yield c


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.url("grpc"), options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]) as ch:
        yield ch


def _inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


# --- tritonclient.grpc, unmodified ----------------------------------------------


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no_such_model")
    assert client.get_server_metadata().name == "inference-gateway"
    metadata = client.get_model_metadata("simple")
    assert [(i.name, i.datatype, list(i.shape)) for i in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert list(metadata.versions) == ["1"]


def test_simple(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    b = np.full((3, 16), 5, dtype=np.int32)
    result = client.infer("simple", _inputs({"INPUT0": a, "INPUT1": b}), request_id="r-1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "r-1"


def test_simple_string(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([str(i).encode() for i in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"10"] * 16, dtype=np.object_).reshape(1, 16)
    result = client.infer("simple_string", _inputs({"INPUT0": a, "INPUT1": b}))
    assert [int(x) for x in result.as_numpy("OUTPUT0").reshape(-1)] == [i + 10 for i in range(16)]
    assert [int(x) for x in result.as_numpy("OUTPUT1").reshape(-1)] == [i - 10 for i in range(16)]


IDENTITY_CASES = {
    "FP32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
    "FP16": np.array([[0.5, -2.25, 65504.0]], dtype=np.float16),
    "INT64": np.array([[-(2**62), 0, 2**62 + 5]], dtype=np.int64),
    "UINT64": np.array([2**64 - 1, 0], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "BOOL": np.array([True, False, True]),
    "BYTES": np.array([b"hello", b"", b"\xff\x00binary", b"x" * 300], dtype=np.object_),
    "FP64": np.array([1e300, -1e-300, 0.0]),
    "EMPTY": np.zeros((0, 3), dtype=np.float32),
}


@pytest.mark.parametrize("name", sorted(IDENTITY_CASES))
def test_identity(client: grpcclient.InferenceServerClient, name: str) -> None:
    array = IDENTITY_CASES[name]
    out = client.infer("identity", _inputs({"INPUT0": array})).as_numpy("OUTPUT0")
    assert out.shape == array.shape
    if array.dtype == object:
        assert list(out.reshape(-1)) == list(array.reshape(-1))
    else:
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)


def test_compressed_messages(client: grpcclient.InferenceServerClient) -> None:
    a = np.zeros((64, 16), dtype=np.int32)
    result = client.infer("simple", _inputs({"INPUT0": a, "INPUT1": a + 1}), compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)


def test_unknown_model_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", _inputs({"INPUT0": a}))
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in info.value.message()


def test_model_error_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 8), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", _inputs({"INPUT0": a, "INPUT1": a}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "shape" in info.value.message()


# --- grpcio's own health and reflection clients --------------------------------------


def test_health_check(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName(SERVICE)
    # Every RPC of Triton's service: the core six, the extensions served and those refused.
    assert {m.name for m in service.methods} == set(
        service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)
    parameter = pool.FindMessageTypeByName("inference.InferParameter")
    assert parameter.fields_by_name["uint64_param"].number == 5


# --- typed contents ------------------------------------------------------------------


def _call(channel: grpc.Channel, request: service_pb2.ModelInferRequest | bytes, **kwargs: object) -> object:
    method = channel.unary_unary(f"/{SERVICE}/ModelInfer",
                                 request_serializer=lambda r: r if isinstance(r, bytes) else r.SerializeToString(),
                                 response_deserializer=service_pb2.ModelInferResponse.FromString)
    return method(request, timeout=10, **kwargs)


def _typed_simple_request(values: list[int]) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="simple", id="typed-1")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(values)
    return request


def test_typed_inputs_raw_outputs(channel: grpc.Channel) -> None:
    reply = _call(channel, _typed_simple_request(list(range(16))))
    assert len(reply.raw_output_contents) == 2  # type: ignore[attr-defined]
    total = np.frombuffer(reply.raw_output_contents[0], dtype="<i4")  # type: ignore[attr-defined]
    np.testing.assert_array_equal(total, np.arange(16) * 2)


def test_typed_outputs_listener(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.url("typed")) as typed_channel:
        reply = _call(typed_channel, _typed_simple_request(list(range(16))))
    assert len(reply.raw_output_contents) == 0  # type: ignore[attr-defined]
    outputs = {o.name: o for o in reply.outputs}  # type: ignore[attr-defined]
    assert list(outputs["OUTPUT0"].contents.int_contents) == [2 * i for i in range(16)]
    assert list(outputs["OUTPUT1"].contents.int_contents) == [0] * 16
    assert reply.id == "typed-1"  # type: ignore[attr-defined]


def test_typed_listener_still_works_for_tritonclient_raw_only_types(gateway: GatewayProcess) -> None:
    """FP16 has no typed field: the whole reply falls back to raw."""
    array = np.array([1.5, -2.0], dtype=np.float16)
    with grpcclient.InferenceServerClient(gateway.url("typed")) as c:
        out = c.infer("identity", _inputs({"INPUT0": array})).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, array)


# --- bad input -------------------------------------------------------------------------


def _raw_request(datatype: str, shape: list[int], raw: bytes, model: str = "identity") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


def _mixed_request() -> service_pb2.ModelInferRequest:
    request = _typed_simple_request(list(range(16)))
    request.raw_input_contents.extend([b"\0" * 64, b"\0" * 64])
    return request


def _count_mismatch_request() -> service_pb2.ModelInferRequest:
    request = _raw_request("INT32", [1, 16], b"\0" * 64, "simple")
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    return request


def _wrong_typed_field_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2]).contents.int_contents.extend([1, 2])
    return request


def _typed_fp16_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    return request


def _out_of_range_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    return request


BAD_REQUESTS = {
    "raw length != shape x datatype": (_raw_request("INT32", [1, 16], b"\0" * 60), "needs 64"),
    "BYTES prefix overruns": (_raw_request("BYTES", [1], struct.pack("<I", 100) + b"abc"), "overruns"),
    "BYTES truncated prefix": (_raw_request("BYTES", [2], struct.pack("<I", 1) + b"a\x01"), "length prefix"),
    "unknown datatype": (_raw_request("FLOAT32", [1], b"\0" * 4), "unknown datatype 'FLOAT32'"),
    "lower-case datatype": (_raw_request("fp32", [1], b"\0" * 4), "unknown datatype 'fp32'"),
    "negative dimension": (_raw_request("FP32", [-1], b""), "negative dimension"),
    "raw mixed with typed": (_mixed_request(), "mixes raw_input_contents with typed"),
    "raw count mismatch": (_count_mismatch_request(), "1 raw_input_contents entries for 2 inputs"),
    "typed field of another type": (_wrong_typed_field_request(), "must be in 'fp32_contents'"),
    "typed FP16": (_typed_fp16_request(), "no typed contents field"),
    "typed value out of range": (_out_of_range_request(), "out of range for INT8"),
    "no model name": (service_pb2.ModelInferRequest(), "no model_name"),
    "not protobuf": (b"\xff\xff\xff\xff not a protobuf message", "not a valid inference.ModelInferRequest"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_is_invalid_argument(channel: grpc.Channel, case: str) -> None:
    request, expected = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert expected in (info.value.details() or "")


def test_message_over_the_limit_is_resource_exhausted(channel: grpc.Channel, gateway: GatewayProcess) -> None:
    too_big = _raw_request("UINT8", [LIMIT + 16], b"\0" * (LIMIT + 16))
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, too_big)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(LIMIT) in (info.value.details() or "")
    # the same limit on the REST listener
    with httpclient.InferenceServerClient(gateway.url("rest")) as rest:
        item = httpclient.InferInput("INPUT0", [LIMIT + 16], "UINT8")
        item.set_data_from_numpy(np.zeros(LIMIT + 16, dtype=np.uint8))
        with pytest.raises(InferenceServerException) as rest_info:
            rest.infer("identity", [item])
    assert rest_info.value.status() == "413"
    # and the listener still serves after both
    assert _call(channel, _raw_request("UINT8", [4], b"\1\2\3\4")).raw_output_contents[0] == b"\1\2\3\4"  # type: ignore[attr-defined]


def test_gateway_log_has_no_traceback(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
