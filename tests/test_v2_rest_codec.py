"""V2 REST codec: golden files and round trips for every datatype, no sockets."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.core import tensors
from gateway.core.errors import GatewayError
from gateway.core.types import DATATYPES, NUMPY_DTYPES, InferRequest, InferResponse, RequestedOutput, Tensor
from gateway.protocols.v2_rest import codec

GOLDEN = Path(__file__).parent / "golden" / "v2_rest"
MAX = 1 << 31


def _describe(tensor: Tensor) -> dict[str, Any]:
    if tensor.datatype == "BYTES":
        data: Any = np.vectorize(lambda b: b.hex(), otypes=[object])(tensor.data).tolist()
    else:
        data = tensor.data.tolist()
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
            "dtype": tensor.data.dtype.str, "data": data, "parameters": tensor.parameters}


def test_golden_request_decodes() -> None:
    body = (GOLDEN / "simple_request.json").read_bytes()
    request = codec.decode_infer_request(body, None, "simple", "", MAX)
    described = {
        "model_name": request.model_name, "model_version": request.model_version, "id": request.id,
        "parameters": request.parameters, "inputs": [_describe(t) for t in request.inputs],
        "outputs": [{"name": o.name, "parameters": o.parameters} for o in request.outputs],
    }
    assert described == orjson.loads((GOLDEN / "simple_request.decoded.json").read_bytes())


def test_golden_mixed_response_encodes() -> None:
    response = InferResponse("simple", "1", "golden-1", [
        Tensor.from_numpy("OUTPUT0", np.array([[1, -2, 3, 2**31 - 1]], dtype=np.int32)),
        Tensor.from_numpy("OUTPUT1", np.array([b"ab", b""], dtype=object)),
    ])
    request = InferRequest("simple", outputs=[RequestedOutput("OUTPUT0", {"binary_data": True}),
                                              RequestedOutput("OUTPUT1")])
    body, headers = codec.encode_infer_response(response, request)
    head = (GOLDEN / "mixed_response.head.json").read_bytes().strip()
    assert headers == {"Content-Type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(len(head))}
    assert body == head + struct.pack("<4i", 1, -2, 3, 2**31 - 1)


def _sample(datatype: str) -> np.ndarray:
    rng = np.random.default_rng(len(datatype))
    shape = (2, 3)
    if datatype == "BYTES":
        items = [b"", b"a", "\u00fc".encode(), b"xyz" * 50, b"0", b" "]
        array = np.empty(6, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BF16":
        return tensors.float_to_bf16(rng.normal(size=shape))
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    values.flat[0], values.flat[1] = info.min, info.max  # extremes survive JSON too
    return values


def _assert_same(got: Tensor, want: Tensor) -> None:
    assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
    if want.datatype == "BYTES":
        assert got.data.tolist() == want.data.tolist()
    else:
        assert got.data.dtype == want.data.dtype
        np.testing.assert_array_equal(got.data, want.data)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_request_round_trip(datatype: str, binary: bool) -> None:
    tensor = Tensor("X", datatype, (2, 3), _sample(datatype), {"k": "v"})
    request = InferRequest("m", "2", "id-7", [tensor], [RequestedOutput("Y")], {"p": 1})
    body, headers = codec.encode_infer_request(request, binary)
    decoded = codec.decode_infer_request(body, headers.get(codec.HEADER_LENGTH), "m", "2", MAX)
    _assert_same(decoded.inputs[0], tensor)
    assert decoded.inputs[0].parameters == {"k": "v"}
    assert decoded.id == "id-7" and decoded.parameters["p"] == 1
    assert [o.name for o in decoded.outputs] == ["Y"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_response_round_trip(datatype: str, binary: bool) -> None:
    tensor = Tensor("Y", datatype, (2, 3), _sample(datatype))
    response = InferResponse("m", "1", "id-9", [tensor])
    request = InferRequest("m", parameters={"binary_data_output": binary})
    body, headers = codec.encode_infer_response(response, request)
    assert (headers["Content-Type"] == codec.BINARY_TYPE) == binary
    decoded = codec.decode_infer_response(body, headers.get(codec.HEADER_LENGTH), MAX)
    _assert_same(decoded.outputs[0], tensor)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", "id-9")


def test_binary_inputs_are_zero_copy_views() -> None:
    data = np.arange(1024, dtype=np.float32)
    request = InferRequest("m", inputs=[Tensor.from_numpy("X", data)])
    body, headers = codec.encode_infer_request(request, binary=True)
    decoded = codec.decode_infer_request(body, headers[codec.HEADER_LENGTH], "m", "", MAX)
    assert np.shares_memory(decoded.inputs[0].data, np.frombuffer(body, dtype=np.uint8))


def test_per_output_binary_choice_beats_request_default() -> None:
    response = InferResponse("m", outputs=[Tensor.from_numpy(n, np.ones(2, np.float32)) for n in ("A", "B")])
    request = InferRequest("m", outputs=[RequestedOutput("A", {"binary_data": False}), RequestedOutput("B")],
                           parameters={"binary_data_output": True})
    assert codec.output_binary_flags(response, request) == [False, True]


def test_bf16_json_rounds_to_nearest_even() -> None:
    # 1 + 2^-8 lies exactly between two bf16 values: ties go to the even one (1.0)
    bits = tensors.float_to_bf16(np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, np.inf]))
    assert tensors.bf16_to_float(bits).tolist() == [1.0, 1.0 + 2**-6, -0.0, np.inf]


def test_non_utf8_bytes_output_asks_for_binary() -> None:
    response = InferResponse("m", outputs=[Tensor.from_numpy("B", np.array([b"\xff"], dtype=object))])
    with pytest.raises(GatewayError, match="binary_data: true"):
        codec.encode_infer_response(response, InferRequest("m"))


def test_upstream_errors_are_mapped_not_passed_through() -> None:
    kinds = {status: codec.decode_error(status, b'{"error": "boom"}', "up").kind.name
             for status in (400, 404, 422, 429, 500, 503, 504)}
    assert kinds == {400: "INVALID_INPUT", 404: "MODEL_NOT_FOUND", 422: "INVALID_INPUT", 429: "UPSTREAM_OVERLOADED",
                     500: "UPSTREAM_BAD_RESPONSE", 503: "UPSTREAM_UNAVAILABLE", 504: "UPSTREAM_TIMEOUT"}
    assert "boom" in codec.decode_error(500, b'{"error": "boom"}', "up").message


def test_non_finite_values_in_json() -> None:
    """Written as null (valid JSON, as MLServer writes them); read back as NaN,
    and Triton's NaN/Infinity literals are read too, so both servers' JSON
    answers cross a v2-rest hop."""
    values = np.array([1.5, np.nan, np.inf, -np.inf], dtype=np.float32)
    body, _ = codec.encode_infer_response(InferResponse("m", outputs=[Tensor.from_numpy("y", values)]),
                                          InferRequest("m"))
    assert orjson.loads(body)["outputs"][0]["data"] == [1.5, None, None, None]
    (nulls,) = codec.decode_infer_response(body, None, 100).outputs
    np.testing.assert_array_equal(nulls.data, [1.5, np.nan, np.nan, np.nan])
    triton = (b'{"outputs": [{"name": "y", "datatype": "FP64", "shape": [2, 2], '
              b'"data": [[NaN, Infinity], [-Infinity, 2]]}]}')
    (literals,) = codec.decode_infer_response(triton, None, 100).outputs
    np.testing.assert_array_equal(literals.data, [[np.nan, np.inf], [-np.inf, 2.0]])
    for datatype, data in [("INT32", [1, None]), ("FP32", [None, "1"]), ("FP32", [None, True])]:
        request = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": data}]}
        with pytest.raises(GatewayError, match=f"{datatype} data must be"):
            codec.decode_infer_request(orjson.dumps(request), None, "m", "", 100)
    with pytest.raises(GatewayError, match="not valid JSON"):
        codec.decode_infer_request(b'{"inputs": [NaN', None, "m", "", 100)
