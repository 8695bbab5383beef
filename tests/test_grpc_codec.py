"""The V2 gRPC codec as pure functions: no sockets."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from gateway.protocols.v2_grpc import codec
from gateway.protocols.v2_grpc import messages as pb

MAX = 1 << 20

TYPED_CASES: dict[str, tuple[np.ndarray, str]] = {
    "BOOL": (np.array([True, False]), "bool_contents"),
    "INT8": (np.array([-128, 127], dtype=np.int8), "int_contents"),
    "INT16": (np.array([-32768, 7], dtype=np.int16), "int_contents"),
    "INT32": (np.array([-(2**31), 2**31 - 1], dtype=np.int32), "int_contents"),
    "INT64": (np.array([-(2**63), 2**63 - 1], dtype=np.int64), "int64_contents"),
    "UINT8": (np.array([0, 255], dtype=np.uint8), "uint_contents"),
    "UINT16": (np.array([0, 65535], dtype=np.uint16), "uint_contents"),
    "UINT32": (np.array([0, 2**32 - 1], dtype=np.uint32), "uint_contents"),
    "UINT64": (np.array([0, 2**64 - 1], dtype=np.uint64), "uint64_contents"),
    "FP32": (np.array([0.5, -1e30], dtype=np.float32), "fp32_contents"),
    "FP64": (np.array([1e300, -0.0]), "fp64_contents"),
    "BYTES": (np.array([b"a", b"\xff\x00"], dtype=object), "bytes_contents"),
}


@pytest.mark.parametrize("datatype", sorted(TYPED_CASES))
def test_typed_round_trip(datatype: str) -> None:
    """Typed outputs we write decode back to the same array (typed inputs)."""
    array, field = TYPED_CASES[datatype]
    response = InferResponse("m", outputs=[Tensor.from_numpy("x", array.reshape(1, 2), datatype)])
    wire = codec.encode_infer_response(response, typed=True)
    message = pb.ModelInferResponse.FromString(wire)
    assert not message.raw_output_contents
    assert [d.name for d, _ in message.outputs[0].contents.ListFields()] == [field]
    (decoded,) = codec.decode_infer_response(wire, MAX).outputs
    assert decoded.datatype == datatype and decoded.shape == (1, 2)
    assert decoded.data.tolist() == array.reshape(1, 2).tolist()


@pytest.mark.parametrize("datatype", sorted(TYPED_CASES))
def test_raw_round_trip(datatype: str) -> None:
    array, _ = TYPED_CASES[datatype]
    request = InferRequest("m", inputs=[Tensor.from_numpy("x", array, datatype)])
    wire = codec.encode_infer_request(request)
    message = pb.ModelInferRequest.FromString(wire)  # hand-serialized, still what protobuf reads
    assert len(message.raw_input_contents) == 1 and not message.inputs[0].HasField("contents")
    assert message.raw_input_contents[0] == bytes(codec.array_to_raw(request.inputs[0]))
    (decoded,) = codec.decode_infer_request(wire, MAX).inputs
    assert decoded.data.tolist() == array.tolist()
    # ... and protobuf's own serialization decodes the same
    (again,) = codec.decode_infer_request(message.SerializeToString(), MAX).inputs
    assert again.data.tolist() == array.tolist()


def test_raw_contents_are_zero_copy_views() -> None:
    data = np.arange(1 << 16, dtype=np.float32)
    wire = codec.encode_infer_request(InferRequest("m", inputs=[Tensor.from_numpy("x", data)]))
    (decoded,) = codec.decode_infer_request(wire, MAX).inputs
    assert np.shares_memory(decoded.data, np.frombuffer(wire, dtype=np.uint8))
    np.testing.assert_array_equal(decoded.data, data)


@pytest.mark.parametrize("wire", [b"\x0a\xff", b"\x3a\x05ab", b"\x0f", b"\xff" * 11])
def test_malformed_wire_is_invalid_argument(wire: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        codec.decode_infer_request(wire, MAX)
    assert info.value.kind is ErrorKind.MALFORMED_REQUEST


def test_parameters_of_every_kind() -> None:
    parameters: dict[str, Any] = {"flag": True, "small": -3, "huge": 2**64 - 1, "ratio": 0.5, "name": "n",
                                  "nested": {"a": [1, 2]}, "nothing": None, "too_big": 2**70}
    message = pb.ModelInferRequest()
    codec.parameters_to_proto(parameters, message.parameters)
    which = {k: v.WhichOneof("parameter_choice") for k, v in message.parameters.items()}
    assert which == {"flag": "bool_param", "small": "int64_param", "huge": "uint64_param", "ratio": "double_param",
                     "name": "string_param", "nested": "string_param", "nothing": "string_param",
                     "too_big": "string_param"}
    back = codec.parameters_from_proto(message.parameters)
    assert back["nested"] == '{"a":[1,2]}' and back["nothing"] == "null" and back["too_big"] == str(2**70)
    assert {k: back[k] for k in ("flag", "small", "huge", "ratio", "name")} == {
        "flag": True, "small": -3, "huge": 2**64 - 1, "ratio": 0.5, "name": "n"}


def test_rest_binary_parameters_do_not_cross_to_grpc() -> None:
    request = InferRequest("m", parameters={"binary_data_output": True, "keep": 1},
                           outputs=[RequestedOutput("y", {"binary_data": True, "classification": 2})])
    message = pb.ModelInferRequest.FromString(codec.encode_infer_request(request))
    assert set(message.parameters) == {"keep"}
    assert set(message.outputs[0].parameters) == {"classification"}


def test_typed_reply_falls_back_to_raw_for_fp16() -> None:
    outputs = [Tensor.from_numpy("a", np.zeros(2, np.float16)), Tensor.from_numpy("b", np.zeros(2, np.int32))]
    wire = codec.encode_infer_response(InferResponse("m", outputs=outputs), typed=True)
    message = pb.ModelInferResponse.FromString(wire)
    assert len(message.raw_output_contents) == 2
    assert not any(o.HasField("contents") for o in message.outputs)


def test_empty_contents_next_to_raw_is_no_mix() -> None:
    """MLServer's replies carry an empty contents message beside raw data."""
    message = pb.ModelInferResponse(raw_output_contents=[b"\1\0\0\0"])
    output = message.outputs.add(name="y", datatype="INT32", shape=[1])
    output.contents.SetInParent()
    assert codec.decode_infer_response(message.SerializeToString(), MAX).outputs[0].data.tolist() == [1]


@pytest.mark.parametrize(("code", "details", "kind"), [
    (grpc.StatusCode.NOT_FOUND, "no model", ErrorKind.MODEL_NOT_FOUND),
    (grpc.StatusCode.UNKNOWN, "Unexpected <class 'mlserver.errors.ModelNotFound'>", ErrorKind.MODEL_NOT_FOUND),
    (grpc.StatusCode.UNAVAILABLE, "connection refused", ErrorKind.UPSTREAM_UNAVAILABLE),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "", ErrorKind.UPSTREAM_TIMEOUT),
    (grpc.StatusCode.INVALID_ARGUMENT, "bad shape", ErrorKind.INVALID_INPUT),
    (grpc.StatusCode.INTERNAL, "boom", ErrorKind.UPSTREAM_BAD_RESPONSE),
    (grpc.StatusCode.UNKNOWN, "boom", ErrorKind.UPSTREAM_BAD_RESPONSE),
])
def test_upstream_status_to_kind(code: grpc.StatusCode, details: str, kind: ErrorKind) -> None:
    error = codec.decode_error(code, details, "up (127.0.0.1:1)")
    assert error.kind is kind
    assert "up (127.0.0.1:1)" in error.message


def test_encode_error_uses_the_table() -> None:
    code, message = codec.encode_error(GatewayError(ErrorKind.TOO_LARGE, "too big"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and message == "too big"


def test_an_upstreams_resource_exhausted_is_its_overload_unless_it_names_the_size() -> None:
    """RESOURCE_EXHAUSTED from an upstream is its own limit (UPSTREAM_OVERLOADED,
    as REST's 429), except grpc's message-size refusal, which is the request's."""
    busy = codec.decode_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests", "'up'")
    big = codec.decode_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             "Received message larger than max (9 vs. 4)", "'up'")
    assert busy.kind is ErrorKind.UPSTREAM_OVERLOADED and big.kind is ErrorKind.TOO_LARGE
