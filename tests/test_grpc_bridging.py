"""Any-to-any bridging against a real MLServer (separate processes).

tritonclient.http (JSON and binary) and tritonclient.grpc talk to the
gateway; the gateway talks to MLServer over REST or gRPC (picked by the
``x-upstream`` header). Every combination must give numpy's numbers and,
where MLServer itself supports the client's form, the same answer as
calling MLServer directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from peers.mlserver import MLServerPeer
from support import GatewayProcess, free_port, write_config

CLIENTS = ["http-json", "http-binary", "grpc"]
UPSTREAMS = ["rest", "grpc"]
OUTPUT_NAMES = {"simple": ["OUTPUT0", "OUTPUT1"], "upper_bytes": ["UPPER", "LENGTH"], "identity_fp32": ["OUTPUT0"]}


def bridge_config(peer: MLServerPeer) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: mlserver-rest, protocol: v2-rest, endpoints: ["{peer.rest_address}"]}}
  - {{name: mlserver-grpc, protocol: v2-grpc, endpoints: ["{peer.grpc_address}"]}}
  - {{name: nowhere, protocol: v2-rest, endpoints: ["127.0.0.1:{free_port()}"]}}
routes:
  - match: {{headers: {{x-upstream: nowhere}}}}
    upstream: nowhere
  - match: {{model: mls_simple}}
    upstream: mlserver-grpc
    rewrite: {{model: simple, version: "1"}}
  - match: {{headers: {{x-upstream: grpc}}}}
    upstream: mlserver-grpc
  - match: {{model: "*"}}
    upstream: mlserver-rest
"""


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("bridge")
    with GatewayProcess(write_config(directory, bridge_config(mlserver)), directory / "gateway.log") as gw:
        yield gw


def infer(client: str, address: str, model: str, arrays: dict[str, np.ndarray], upstream: str | None = None,
          request_id: str = "", parameters: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], Any]:
    """One inference with an unmodified tritonclient; outputs as numpy
    (BYTES normalized to bytes) and the raw response."""
    headers = {"x-upstream": upstream} if upstream else None
    if client == "grpc":
        with grpcclient.InferenceServerClient(address) as gc:
            inputs = []
            for name, array in arrays.items():
                item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                item.set_data_from_numpy(array)
                inputs.append(item)
            result = gc.infer(model, inputs, request_id=request_id, parameters=parameters, headers=headers)
            names = [o.name for o in result.get_response().outputs]
            return {n: _normalize(result.as_numpy(n)) for n in names}, result.get_response()
    binary = client == "http-binary"
    with httpclient.InferenceServerClient(address, network_timeout=120, connection_timeout=120) as hc:
        inputs = []
        for name, array in arrays.items():
            item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array, binary_data=binary)
            inputs.append(item)
        # tritonclient asks for binary outputs unless each output says otherwise
        outputs = None if binary else [httpclient.InferRequestedOutput(n, binary_data=False)
                                       for n in OUTPUT_NAMES[model]]
        result = hc.infer(model, inputs, request_id=request_id, parameters=parameters, headers=headers,
                          outputs=outputs)
        names = [o["name"] for o in result.get_response()["outputs"]]
        return {n: _normalize(result.as_numpy(n)) for n in names}, result.get_response()


def _normalize(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.array([x.encode() if isinstance(x, str) else x for x in array.reshape(-1)],
                        dtype=object).reshape(array.shape)
    return array


def direct_address(client: str, peer: MLServerPeer) -> str | None:
    """Where MLServer answers this client's form itself (it lacks binary)."""
    return {"http-json": peer.rest_address, "grpc": peer.grpc_address}.get(client)


def assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        assert got[name].shape == array.shape, name
        assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array)


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_simple_add_sub(gateway: GatewayProcess, mlserver: MLServerPeer, client: str, upstream: str) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), -7, dtype=np.int32)
    address = gateway.url("grpc" if client == "grpc" else "rest")
    got, response = infer(client, address, "simple", {"INPUT0": a, "INPUT1": b}, upstream,
                          request_id="req-7", parameters={"tenant": "blue", "retries": 2})
    assert_same(got, {"OUTPUT0": a + b, "OUTPUT1": a - b})
    if client == "grpc":
        assert response.id == "req-7"
        assert response.parameters["tenant"].string_param == "blue"  # reached MLServer and came back
        assert response.parameters["retries"].int64_param == 2
    else:
        assert response["id"] == "req-7"
        assert response["parameters"]["tenant"] == "blue"
        assert response["parameters"]["retries"] == 2
        # the client's own form, whatever form the upstream answered in
        for output in response["outputs"]:
            if client == "http-binary":
                assert output["parameters"]["binary_data_size"] == 2 * 16 * 4 and "data" not in output
            else:
                assert "data" in output and "binary_data_size" not in output.get("parameters", {})
    direct = direct_address(client, mlserver)
    if direct:
        expected, _ = infer(client, direct, "simple", {"INPUT0": a, "INPUT1": b})
        assert_same(got, expected)


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_bytes(gateway: GatewayProcess, mlserver: MLServerPeer, client: str, upstream: str) -> None:
    words = [b"hello", b"", "gr\u00fc\u00dfe".encode(), b"x" * 1000, b"MiXeD 42"]
    text = np.array(words, dtype=np.object_)
    address = gateway.url("grpc" if client == "grpc" else "rest")
    got, _ = infer(client, address, "upper_bytes", {"TEXT": text}, upstream)
    expected = {"UPPER": np.array([w.upper() for w in words], dtype=np.object_),
                "LENGTH": np.array([len(w) for w in words], dtype=np.int64)}
    assert_same(got, expected)
    direct = direct_address(client, mlserver)
    if direct:
        assert_same(got, infer(client, direct, "upper_bytes", {"TEXT": text})[0])


# 16 MiB and a bit. MLServer's REST side speaks only JSON (82 MB of text for
# this tensor, several seconds in MLServer), and tritonclient's JSON form
# would be as big, over the default request limit: binary and gRPC clients.
BIG_CASES = [("http-binary", "grpc"), ("grpc", "grpc"), ("http-binary", "rest"), ("grpc", "rest")]


@pytest.mark.parametrize(("client", "upstream"), BIG_CASES)
def test_big_tensor(gateway: GatewayProcess, client: str, upstream: str) -> None:
    big = np.random.default_rng(3).standard_normal((4097, 1024)).astype(np.float32)
    assert big.nbytes >= 16 << 20
    address = gateway.url("grpc" if client == "grpc" else "rest")
    got, _ = infer(client, address, "identity_fp32", {"INPUT0": big}, upstream)
    assert_same(got, {"OUTPUT0": big})


@pytest.mark.parametrize("client", CLIENTS)
def test_header_picks_the_upstream(gateway: GatewayProcess, client: str) -> None:
    """The x-upstream header (gRPC metadata for the gRPC client) really
    routes: naming an upstream that is down fails, naming it."""
    a = np.ones((1, 16), dtype=np.int32)
    address = gateway.url("grpc" if client == "grpc" else "rest")
    with pytest.raises(InferenceServerException) as info:
        infer(client, address, "simple", {"INPUT0": a, "INPUT1": a}, "nowhere")
    assert info.value.status() in ("503", "StatusCode.UNAVAILABLE")
    assert "upstream nowhere" in info.value.message()


def test_binary_client_needs_the_gateway(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    """The point of bridging: MLServer refuses tritonclient's default binary
    form, the gateway in front of it does not (it learned to send JSON)."""
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        infer("http-binary", mlserver.rest_address, "simple", {"INPUT0": a, "INPUT1": a})
    assert info.value.status() == "422"
    got, _ = infer("http-binary", gateway.url("rest"), "simple", {"INPUT0": a, "INPUT1": a}, "rest")
    assert_same(got, {"OUTPUT0": a * 2, "OUTPUT1": a * 0})


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_metadata_and_readiness_forwarded(gateway: GatewayProcess, upstream: str) -> None:
    headers = {"x-upstream": upstream}
    with httpclient.InferenceServerClient(gateway.url("rest")) as hc:
        metadata = hc.get_model_metadata("simple", headers=headers)
        assert metadata["name"] == "simple"
        assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
            ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
        assert hc.is_model_ready("simple", headers=headers)
        assert not hc.is_model_ready("no_such_model", headers=headers)
        with pytest.raises(InferenceServerException) as info:
            hc.get_model_metadata("no_such_model", headers=headers)
        assert info.value.status() == "404"
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as gc:
        metadata = gc.get_model_metadata("simple", headers=headers)
        assert [o.name for o in metadata.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert gc.is_model_ready("simple", headers=headers)
        assert not gc.is_model_ready("no_such_model", headers=headers)


def test_rewrite_applies_both_ways(gateway: GatewayProcess) -> None:
    """mls_simple is MLServer's simple version 1; clients only see mls_simple."""
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as gc:
        metadata = gc.get_model_metadata("mls_simple")
        assert metadata.name == "mls_simple"
        assert gc.is_model_ready("mls_simple")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    got, response = infer("grpc", gateway.url("grpc"), "mls_simple", {"INPUT0": a, "INPUT1": a})
    assert response.model_name == "mls_simple"
    assert_same(got, {"OUTPUT0": a * 2, "OUTPUT1": a * 0})


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_unknown_model_upstream(gateway: GatewayProcess, upstream: str) -> None:
    """MLServer's own 'not found' becomes the client's not found."""
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        infer("grpc", gateway.url("grpc"), "no_such_model", {"INPUT0": a}, upstream)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in info.value.message()


def test_gateway_log_is_clean(gateway: GatewayProcess) -> None:
    """Upstream failures above were answered, not crashed on."""
    assert "Traceback" not in gateway.log()
