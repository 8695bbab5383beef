"""Unmodified tritonclient.http against the gateway's builtin models."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from support import GatewayProcess


@pytest.fixture(scope="module")
def client(builtin_gateway: GatewayProcess):
    with httpclient.InferenceServerClient(builtin_gateway.url("rest")) as c:
        yield c


def _inputs(arrays: dict[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    return inputs


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no_such_model")
    metadata = client.get_server_metadata()
    assert "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("simple")
    assert [i["name"] for i in model["inputs"]] == ["INPUT0", "INPUT1"]
    assert model["inputs"][0]["shape"] == [-1, 16]


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_simple(client: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple", _inputs({"INPUT0": a, "INPUT1": b}, binary_in), outputs=outputs,
                          request_id="req-42")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "req-42"


def test_simple_default_outputs_are_binary(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    result = client.infer("simple", _inputs({"INPUT0": a, "INPUT1": a}, True))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == a.nbytes


def test_requested_output_filtering(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", _inputs({"INPUT0": a, "INPUT1": a}, True),
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))


@pytest.mark.parametrize("binary", [False, True])
def test_simple_string(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.array([str(i).encode() for i in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple_string", _inputs({"INPUT0": a, "INPUT1": b}, binary), outputs=outputs)
    total = result.as_numpy("OUTPUT0").reshape(-1)
    diff = result.as_numpy("OUTPUT1").reshape(-1)
    assert [int(x) for x in total] == [i + 1 for i in range(16)]
    assert [int(x) for x in diff] == [i - 1 for i in range(16)]


IDENTITY_CASES = {
    "FP32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
    "INT64": np.array([[-(2**62), 0, 2**62 + 5]], dtype=np.int64),
    "BOOL": np.array([True, False, True, True]),
    "FP16": np.array([[0.5, -2.25, 65504.0]], dtype=np.float16),
    "BYTES": np.array([b"hello", b"", "gr\u00fc\u00dfe".encode(), b"x" * 300], dtype=np.object_),
    "UINT8": np.arange(10, dtype=np.uint8),
    "FP64": np.array([1e300, -1e-300, 0.0]),
}


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("name", sorted(IDENTITY_CASES))
def test_identity(client: httpclient.InferenceServerClient, name: str, binary: bool) -> None:
    array = IDENTITY_CASES[name]
    result = client.infer("identity", _inputs({"INPUT0": array}, binary),
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == array.shape
    if name == "BYTES":
        # tritonclient hands JSON strings back as str, binary ones as bytes
        got = [x.encode() if isinstance(x, str) else x for x in out.reshape(-1)]
        assert got == list(array.reshape(-1))
    else:
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)


def test_unknown_model_is_404(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", _inputs({"INPUT0": a, "INPUT1": a}, True))
    assert info.value.status() == "404"
    assert "no_such_model" in info.value.message()


def test_compressed_request_and_response(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4096, dtype=np.float32)  # big enough for the answer to be compressed
    for algorithm in ("gzip", "deflate"):
        result = client.infer("identity", _inputs({"INPUT0": a}, True),
                              request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
