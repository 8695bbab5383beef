"""UM-Bridge with real peers: the PyPI ``umbridge`` package on both sides.

One gateway process serves UM-Bridge (three listeners differing in their
NaN policy) and V2 REST. Behind it: the builtin models and a real
``umbridge.serve_models`` server in its own process (tests/peers). Clients:
``umbridge.HTTPModel``, plain ``requests`` (for what HTTPModel cannot send)
and ``tritonclient.http`` (V2 client -> UM-Bridge model).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from trig_reference import POINTS, check_httpmodel

from peers.umbridge_peer import UmbridgePeer
from support import GatewayProcess, free_port, write_config

CONFIG = """
admin: {address: "127.0.0.1:0"}
limits: {max_request_bytes: 1MiB}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
  - {name: umb, protocol: umbridge, address: "127.0.0.1:0"}
  - {name: umb_literal, protocol: umbridge, address: "127.0.0.1:0", nonfinite: literal}
  - {name: umb_strict, protocol: umbridge, address: "127.0.0.1:0", nonfinite: error, metadata_ttl: 0}
upstreams:
  - {name: local, protocol: builtin}
  - {name: peer, protocol: umbridge, endpoints: ["127.0.0.1:PEER"]}
  - {name: peer_keepalive, protocol: umbridge, endpoints: ["127.0.0.1:PEER"], keepalive: true}
  - {name: down, protocol: umbridge, endpoints: ["127.0.0.1:DOWN"]}
routes:
  - {match: {model: trig}, upstream: local, options: {umbridge: {finite_differences: true}}}
  - match: {model: trig_swapped}
    upstream: local
    rewrite: {model: trig}
    options: {umbridge: {inputs: [y, x], outputs: [g, f], finite_differences: {step: 1e-3}}}
  - {match: {model: gradient_only}, upstream: peer}
  - {match: {model: square}, upstream: peer}
  - {match: {model: square_keepalive}, upstream: peer_keepalive, rewrite: {model: square}}
  - {match: {model: evaluate_only}, upstream: peer}
  - match: {model: evaluate_only_fd}
    upstream: peer
    rewrite: {model: evaluate_only}
    options: {umbridge: {finite_differences: true}}
  - {match: {model: nonfinite}, upstream: peer}
  - {match: {model: broken}, upstream: peer}
  - {match: {model: ghost}, upstream: peer}
  - {match: {model: slow}, upstream: peer, timeout: 500ms}
  - {match: {model: unreachable}, upstream: down}
  - {match: {model: "*"}, upstream: local}
"""


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UmbridgePeer]:
    with UmbridgePeer(tmp_path_factory.mktemp("umbridge-peer")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, peer: UmbridgePeer) -> Iterator[GatewayProcess]:
    directory: Path = tmp_path_factory.mktemp("umbridge")
    text = CONFIG.replace("PEER", str(peer.port)).replace("DOWN", str(free_port()))
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def url(gw: GatewayProcess, listener: str = "umb") -> str:
    return f"http://{gw.url(listener)}"


def post(gw: GatewayProcess, endpoint: str, body: Any, listener: str = "umb", **kwargs: Any) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return requests.post(f"{url(gw, listener)}/{endpoint}", data=data, timeout=30, **kwargs)


def error_of(response: requests.Response) -> tuple[int, str, str]:
    assert response.headers["Content-Type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return response.status_code, body["error"]["type"], body["error"]["message"]


# --- UM-Bridge client -> gateway -> builtin models -----------------------------------


def test_info_lists_evaluate_capable_models_first(gateway: GatewayProcess) -> None:
    response = requests.get(f"{url(gateway)}/Info", timeout=30)
    info = response.json()
    assert response.status_code == 200 and b'"protocolVersion":1.0' in response.content
    assert info["protocolVersion"] == 1.0
    models = info["models"]
    for name in ("trig", "trig_swapped", "square", "forward", "simple", "evaluate_only", "gradient_only"):
        assert name in models
    assert models.index("gradient_only") > max(models.index(n) for n in ("square", "forward", "simple"))
    assert models[-1] == "unreachable"  # unknown capability (upstream down): listed, but last
    # No UM-Bridge view (BYTES tensors), or not on the upstream at all: not listed.
    assert not {"simple_string", "identity", "ghost"} & set(models)
    assert umbridge.supported_models(url(gateway)) == models  # the reference client's own check


def test_forward_with_httpmodel(gateway: GatewayProcess) -> None:
    model = umbridge.HTTPModel(url(gateway), "forward")
    assert model.get_input_sizes() == [2, 1] and model.get_output_sizes() == [3]
    assert all([model.supports_evaluate(), model.supports_gradient(), model.supports_apply_jacobian(),
                model.supports_apply_hessian()])
    x, y = [2.0, 5.0], [-1.0]
    assert model([x, y]) == [[7.0, -2.0, 25.0]]
    assert model([x, y], {"scale": 3}) == [[21.0, -6.0, 75.0]]
    sens = [1.0, 2.0, 3.0]
    assert model.gradient(0, 0, [x, y], sens, {"scale": 2}) == [2 * (1 - 2.0), 2 * (1 + 30.0)]
    assert model.gradient(0, 1, [x, y], sens) == [4.0]
    assert model.apply_jacobian(0, 0, [x, y], [1.0, -1.0]) == [0.0, -1.0, -10.0]
    assert model.apply_hessian(0, 0, 1, [x, y], sens, [2.0], {"scale": 0.5}) == [0.5 * 2 * 2.0, 0.0]
    assert model.apply_hessian(0, 0, 0, [x, y], sens, [1.0, 1.0]) == [0.0, 6.0]


@pytest.mark.parametrize(("x", "y"), POINTS)
def test_trig_finite_differences_with_httpmodel(gateway: GatewayProcess, x: np.ndarray, y: np.ndarray) -> None:
    check_httpmodel(umbridge.HTTPModel(url(gateway), "trig"), x, y)


def test_route_names_and_orders_tensors(gateway: GatewayProcess) -> None:
    """trig_swapped: inputs [y, x], outputs [g, f], a configured step."""
    check_httpmodel(umbridge.HTTPModel(url(gateway), "trig_swapped"), *POINTS[0], inputs=(1, 0), outputs=(1, 0))


def test_client_errors_reach_httpmodel(gateway: GatewayProcess) -> None:
    model = umbridge.HTTPModel(url(gateway), "forward")
    with pytest.raises(Exception, match="InvalidInput: 'input' vector 0 has length 3"):
        model([[1.0, 2.0, 3.0], [1.0]])
    with pytest.raises(Exception, match="InvalidInput: 'outWrt' is 1"):
        model.gradient(1, 0, [[1.0, 2.0], [1.0]], [1.0, 1.0, 1.0])
    with pytest.raises(Exception, match="not supported by server"):
        umbridge.HTTPModel(url(gateway), "no_such_model")


# --- error forms -------------------------------------------------------------------------

FORWARD_POINT = {"name": "forward", "input": [[1.0, 2.0], [3.0]]}
BAD_CALLS = [
    ("Evaluate", b"", 400, "InvalidInput", "empty"),
    ("Evaluate", b"{not json", 400, "InvalidInput", "not valid JSON"),
    ("Evaluate", b'["forward"]', 400, "InvalidInput", "must be a JSON object"),
    ("Evaluate", {"input": [[1.0, 2.0], [3.0]]}, 400, "InvalidInput", "no model 'name'"),
    ("Evaluate", {"name": "nope", "input": "garbage"}, 400, "ModelNotFound", "'nope'"),
    ("InputSizes", {"name": "nope"}, 400, "ModelNotFound", "'nope'"),
    ("OutputSizes", {"name": "nope"}, 400, "ModelNotFound", "'nope'"),
    ("ModelInfo", {"name": "nope"}, 400, "ModelNotFound", "'nope'"),
    ("ApplyHessian", {"name": "nope"}, 400, "ModelNotFound", "'nope'"),
    # Feature support is checked before the inputs.
    ("Gradient", {"name": "simple", "input": "garbage"}, 400, "UnsupportedFeature", "Gradient is not supported"),
    ("ApplyJacobian", {"name": "evaluate_only"}, 400, "UnsupportedFeature", "ApplyJacobian"),
    ("Evaluate", {"name": "gradient_only", "input": [[1.0]]}, 400, "UnsupportedFeature", "Evaluate"),
    ("InputSizes", {"name": "simple_string"}, 400, "UnsupportedFeature", "is BYTES"),
    ("Evaluate", {"name": "forward"}, 400, "InvalidInput", "missing 'input'"),
    ("Evaluate", {"name": "forward", "input": [[1.0, 2.0]]}, 400, "InvalidInput", "has 1 vectors but"),
    ("Evaluate", {"name": "forward", "input": [[1.0], [3.0]]}, 400, "InvalidInput", "vector 0 has length 1"),
    ("Evaluate", {"name": "forward", "input": [[1.0, "x"], [3.0]]}, 400, "InvalidInput", "only numbers"),
    ("Evaluate", {"name": "forward", "input": [[1.0, 2.0], [3.0]], "config": 5}, 400, "InvalidInput", "'config'"),
    ("Evaluate", {**FORWARD_POINT, "config": {"scale": "big"}}, 400, "InvalidInput", "'scale'"),
    ("Evaluate", {"name": "simple", "input": [[0.5] * 16, [0.0] * 16]}, 400, "InvalidInput", "takes integers"),
    ("Gradient", {**FORWARD_POINT, "outWrt": 1, "inWrt": 0, "sens": [1, 1, 1]}, 400, "InvalidInput", "'outWrt'"),
    ("Gradient", {**FORWARD_POINT, "outWrt": 0, "inWrt": 2, "sens": [1, 1, 1]}, 400, "InvalidInput", "'inWrt' is 2"),
    ("Gradient", {**FORWARD_POINT, "outWrt": 0, "inWrt": -1, "sens": [1, 1, 1]}, 400, "InvalidInput", "'inWrt' is -1"),
    ("Gradient", {**FORWARD_POINT, "outWrt": 0, "inWrt": 0, "sens": [1, 1]}, 400, "InvalidInput", "'sens' has length"),
    ("ApplyJacobian", {**FORWARD_POINT, "outWrt": 0, "inWrt": 1, "vec": [1, 1]}, 400, "InvalidInput",
     "'vec' has length 2 but input 1 has size 1"),
    ("ApplyHessian", {**FORWARD_POINT, "outWrt": 0, "inWrt1": 0, "inWrt2": 3, "sens": [1, 1, 1], "vec": [1]},
     400, "InvalidInput", "'inWrt2' is 3"),
    ("ApplyHessian", {**FORWARD_POINT, "outWrt": 0, "inWrt1": 0, "inWrt2": 0, "sens": [1, 1, 1], "vec": [1]},
     400, "InvalidInput", "'vec' has length 1 but input 0 has size 2"),
    ("NoSuchEndpoint", {"name": "forward"}, 404, "UnsupportedFeature", "no such endpoint: POST /NoSuchEndpoint"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "error_type", "needle"), BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_calls(gateway: GatewayProcess, endpoint: str, body: Any, status: int, error_type: str,
                   needle: str) -> None:
    got_status, got_type, message = error_of(post(gateway, endpoint, body))
    assert (got_status, got_type) == (status, error_type), message
    assert needle in message


def test_method_not_allowed_and_too_large(gateway: GatewayProcess) -> None:
    assert error_of(requests.get(f"{url(gateway)}/Evaluate", timeout=30))[:2] == (405, "UnsupportedFeature")
    big = {"name": "forward", "input": [[1.0] * 300_000, [1.0]]}
    assert error_of(post(gateway, "Evaluate", big))[:2] == (413, "InvalidInput")


def test_no_content_type_and_gzip(gateway: GatewayProcess) -> None:
    body = json.dumps(FORWARD_POINT).encode()
    plain = requests.post(f"{url(gateway)}/Evaluate", data=body, timeout=30)  # bytes: no Content-Type sent
    assert "Content-Type" not in plain.request.headers
    assert plain.status_code == 200 and plain.json() == {"output": [[3.0, 3.0, 4.0]]}
    packed = post(gateway, "Evaluate", gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert packed.json() == plain.json()


def test_nonfinite_outputs_follow_the_listener_policy(gateway: GatewayProcess) -> None:
    # FP32 overflow: x0·x1² = 1e57 is infinity in float32.
    call = {"name": "trig", "input": [[1e19, 1e19], [1.0]]}
    default = post(gateway, "Evaluate", call)
    assert default.status_code == 200 and default.json()["output"][0][1] is None
    literal = post(gateway, "Evaluate", call, listener="umb_literal")
    assert b"Infinity" in literal.content and json.loads(literal.content)["output"][0][1] == math.inf
    status, error_type, message = error_of(post(gateway, "Evaluate", call, listener="umb_strict"))
    assert (status, error_type) == (500, "InvalidOutput") and "NaN or infinity" in message
    # Inputs: NaN as null (nlohmann) or as a literal (Python's json) both arrive as NaN.
    for text in (b'{"name": "forward", "input": [[null, 1], [1]]}', b'{"name": "forward", "input": [[NaN, 1], [1]]}'):
        assert post(gateway, "Evaluate", text, listener="umb_literal").content == \
            b'{"output":[[NaN,NaN,1.0]]}'


# --- UM-Bridge client -> gateway -> real UM-Bridge server ---------------------------------


@pytest.mark.parametrize("name", ["square", "square_keepalive"])
def test_square_passthrough_with_config(gateway: GatewayProcess, name: str) -> None:
    model = umbridge.HTTPModel(url(gateway), name)
    assert model.get_input_sizes() == [3] and model.get_input_sizes({"n": 5}) == [5]  # sizes follow config
    assert model.get_output_sizes({"n": 2}) == [2]
    config = {"n": 2, "scale": 3.0}
    for _ in range(12):  # past the reference servers' keep-alive caps
        assert model([[1.0, 2.0]], config) == [[3.0, 12.0]]
    assert model.gradient(0, 0, [[1.0, 2.0]], [1.0, 1.0], config) == [6.0, 12.0]
    assert model.apply_jacobian(0, 0, [[1.0, 2.0]], [1.0, 0.5], config) == [6.0, 6.0]
    assert model.apply_hessian(0, 0, 0, [[1.0, 2.0]], [1.0, 2.0], [3.0, 4.0], config) == [18.0, 48.0]
    with pytest.raises(Exception, match="InvalidInput: 'input' vector 0 has length 3 but the model expects 2"):
        model([[1.0, 2.0, 3.0]], config)


def test_finite_differences_over_a_umbridge_upstream(gateway: GatewayProcess) -> None:
    assert not umbridge.HTTPModel(url(gateway), "evaluate_only").supports_gradient()
    model = umbridge.HTTPModel(url(gateway), "evaluate_only_fd")
    assert model.supports_gradient() and model.supports_apply_hessian()
    a, b, c, d = 0.5, -1.5, 0.25, 2.0
    point = [[a, b, c], [d]]
    # outputs [a·d + b², exp(c)] and [a + b + c + d]
    np.testing.assert_allclose(model.gradient(0, 0, point, [1.0, 1.0]), [d, 2 * b, math.exp(c)], rtol=1e-6)
    np.testing.assert_allclose(model.gradient(0, 1, point, [1.0, 0.0]), [a], rtol=1e-6)
    np.testing.assert_allclose(model.apply_jacobian(1, 0, point, [1.0, 2.0, 3.0]), [6.0], rtol=1e-6)
    np.testing.assert_allclose(model.apply_hessian(0, 0, 0, point, [1.0, 1.0], [0.0, 1.0, 1.0]),
                               [0.0, 2.0, math.exp(c)], rtol=1e-4, atol=1e-5)


def test_gradient_only_model(gateway: GatewayProcess) -> None:
    model = umbridge.HTTPModel(url(gateway), "gradient_only")
    assert not model.supports_evaluate() and model.supports_gradient()
    assert model.gradient(0, 0, [[3.0]], [2.0]) == [12.0]


def test_nonfinite_from_the_python_reference_server(gateway: GatewayProcess) -> None:
    # The reference server writes `nan`, `inf`: the gateway reads them anyway.
    assert umbridge.HTTPModel(url(gateway), "nonfinite")([[5.0]]) == [[None, None, None, 5.0]]
    (values,) = umbridge.HTTPModel(url(gateway, "umb_literal"), "nonfinite")([[5.0]])
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 5.0]


@pytest.mark.parametrize(("model", "status", "error_type", "needle"), [
    ("broken", 500, "InvalidOutput", "Output vector 0 has invalid length"),
    ("slow", 504, "UpstreamTimeout", "did not answer within 0."),
    ("unreachable", 503, "UpstreamUnavailable", "cannot connect to upstream down"),
])
def test_upstream_failures(gateway: GatewayProcess, model: str, status: int, error_type: str, needle: str) -> None:
    got = error_of(post(gateway, "Evaluate", {"name": model, "input": [[1.0]], "config": {"seconds": 2}}))
    assert got[:2] == (status, error_type) and needle in got[2], got


# --- V2 client -> gateway -> real UM-Bridge server -----------------------------------------


def test_v2_metadata_of_umbridge_models(gateway: GatewayProcess) -> None:
    metadata = requests.get(f"{url(gateway, 'rest')}/v2/models/evaluate_only", timeout=30).json()
    assert metadata["platform"] == "umbridge"
    assert metadata["inputs"] == [{"name": "input_0", "datatype": "FP64", "shape": [3]},
                                  {"name": "input_1", "datatype": "FP64", "shape": [1]}]
    assert metadata["outputs"] == [{"name": "output_0", "datatype": "FP64", "shape": [2]},
                                   {"name": "output_1", "datatype": "FP64", "shape": [1]}]
    assert metadata["parameters"] == {"umbridge_support": "Evaluate"}
    square = requests.get(f"{url(gateway, 'rest')}/v2/models/square", timeout=30).json()
    assert square["parameters"]["umbridge_support"] == "Evaluate,Gradient,ApplyJacobian,ApplyHessian"
    assert requests.get(f"{url(gateway, 'rest')}/v2/models/square/ready", timeout=30).status_code == 200
    assert requests.get(f"{url(gateway, 'rest')}/v2/models/ghost", timeout=30).status_code == 404
    assert requests.get(f"{url(gateway, 'rest')}/v2/models/unreachable/ready", timeout=30).status_code == 503


def test_v2_rest_infer_on_umbridge_model(gateway: GatewayProcess) -> None:
    request = {"parameters": {"umbridge_config": json.dumps({"n": 2, "scale": 2.0})},
               "inputs": [{"name": "input_0", "datatype": "FP64", "shape": [2], "data": [1.5, -2.0]}]}
    answer = requests.post(f"{url(gateway, 'rest')}/v2/models/square/infer", json=request, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [{"name": "output_0", "datatype": "FP64", "shape": [2], "data": [4.5, 8.0]}]
    wrong = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [3], "data": [1, 2, 3]}]}
    bad = requests.post(f"{url(gateway, 'rest')}/v2/models/square/infer", json=wrong, timeout=30)
    assert bad.status_code == 400 and "input_0" in bad.json()["error"]
    short = {"inputs": [{"name": "input_0", "datatype": "FP64", "shape": [2], "data": [1, 2]}]}
    upstream_says = requests.post(f"{url(gateway, 'rest')}/v2/models/square/infer", json=short, timeout=30)
    assert upstream_says.status_code == 400 and "InvalidInput" in upstream_says.json()["error"]


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_tritonclient_on_umbridge_model(gateway: GatewayProcess, client: str) -> None:
    """Unmodified tritonclient (HTTP: binary tensors; gRPC: raw contents) ->
    gateway -> the real UM-Bridge server."""
    library: Any = httpclient if client == "http" else grpcclient
    with library.InferenceServerClient(gateway.url("rest" if client == "http" else "grpc")) as triton:
        metadata = triton.get_model_metadata("evaluate_only")
        specs = metadata["inputs"] if client == "http" else [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in metadata.inputs]
        assert specs == [{"name": "input_0", "datatype": "FP64", "shape": [3]},
                         {"name": "input_1", "datatype": "FP64", "shape": [1]}]
        a = np.array([0.5, -1.5, 0.25])
        d = np.array([2.0])
        inputs = [library.InferInput("input_0", [3], "FP64"), library.InferInput("input_1", [1], "FP64")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(d)
        result = triton.infer("evaluate_only", inputs)
        np.testing.assert_allclose(result.as_numpy("output_0"), [0.5 * 2.0 + 2.25, math.exp(0.25)])
        np.testing.assert_allclose(result.as_numpy("output_1"), [1.25])
        config = {"n": 2, "scale": 2.0}  # UM-Bridge config as the documented request parameter
        square = [library.InferInput("input_0", [2], "FP64")]
        square[0].set_data_from_numpy(np.array([1.5, -2.0]))
        result = triton.infer("square", square, parameters={"umbridge_config": json.dumps(config)})
        np.testing.assert_allclose(result.as_numpy("output_0"), [4.5, 8.0])


# --- protocol conformity (the checks of UM-Bridge's testing/protocol_conformity_1.0) -----

NUMBERS = {"type": "array", "items": {"type": "number"}}
INFO_SCHEMA = {"type": "object", "required": ["protocolVersion", "models"], "additionalProperties": False,
               "properties": {"protocolVersion": {"type": "number"},
                              "models": {"type": "array", "items": {"type": "string"}}}}
SUPPORT_SCHEMA = {"type": "object", "required": ["support"], "additionalProperties": False,
                  "properties": {"support": {"type": "object", "additionalProperties": False, "properties": {
                      f: {"type": "boolean"} for f in ("Evaluate", "Gradient", "ApplyJacobian", "ApplyHessian")}}}}
EVALUATE_SCHEMA = {"type": "object", "required": ["output"], "additionalProperties": False,
                   "properties": {"output": {"type": "array", "minItems": 1,
                                             "items": {**NUMBERS, "minItems": 1}}}}
VECTOR_SCHEMA = {"type": "object", "required": ["output"], "additionalProperties": False,
                 "properties": {"output": {**NUMBERS, "minItems": 1}}}


def sizes_schema(key: str) -> dict[str, Any]:
    return {"type": "object", "required": [key], "additionalProperties": False,
            "properties": {key: {"type": "array", "minItems": 1, "items": {"type": "integer"}}}}


def error_schema(error_type: str) -> dict[str, Any]:
    error = {"type": "object", "required": ["type", "message"], "additionalProperties": False,
             "properties": {"type": {"enum": [error_type]}, "message": {"type": "string"}}}
    return {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {"error": error}}


def check_conformity(base: str, model: str, value: float = 0.0) -> list[str]:
    """Every conformity check for one model; returns the operations it exercised."""
    def call(endpoint: str, body: Any, status: int, schema: dict[str, Any]) -> Any:
        # json.dumps(indent=4) and no headers, as the suite sends it
        response = requests.post(f"{base}/{endpoint}", data=json.dumps(body, indent=4), timeout=30)
        assert response.status_code == status, (endpoint, response.text)
        jsonschema.validate(response.json(), schema)
        return response.json()

    info = requests.get(f"{base}/Info", timeout=30)
    assert info.status_code == 200
    jsonschema.validate(info.json(), INFO_SCHEMA)
    assert info.json()["protocolVersion"] == 1.0
    named = {"name": model}
    support = call("ModelInfo", named, 200, SUPPORT_SCHEMA)["support"]
    inputs = call("InputSizes", named, 200, sizes_schema("inputSizes"))["inputSizes"]
    outputs = call("OutputSizes", named, 200, sizes_schema("outputSizes"))["outputSizes"]
    point = [[value] * n for n in inputs]
    too_long = [[value] * (n + 1) for n in inputs]
    exercised = []
    invalid, unsupported = error_schema("InvalidInput"), error_schema("UnsupportedFeature")
    derivative_args = {"Gradient": {"outWrt": 0, "inWrt": 0, "sens": [0.0] * outputs[0]},
                       "ApplyJacobian": {"outWrt": 0, "inWrt": 0, "vec": [value] * inputs[0]},
                       "ApplyHessian": {"outWrt": 0, "inWrt1": 0, "inWrt2": 0, "sens": [0.0] * outputs[0],
                                        "vec": [0.0] * inputs[0]}}
    result_size = {"Gradient": inputs[0], "ApplyJacobian": outputs[0], "ApplyHessian": inputs[0]}
    for feature in ("Evaluate", *derivative_args):
        if not support[feature]:
            call(feature, named, 400, unsupported)
            continue
        exercised.append(feature)
        args = {"name": model, "config": {}, **derivative_args.get(feature, {})}
        if feature == "Evaluate":
            output = call(feature, {**args, "input": point}, 200, EVALUATE_SCHEMA)["output"]
            assert [len(o) for o in output] == outputs
        else:
            output = call(feature, {**args, "input": point}, 200, VECTOR_SCHEMA)["output"]
            assert len(output) == result_size[feature]
        call(feature, {**args, "input": too_long}, 400, invalid)
    if support["Gradient"]:
        gradient = {"name": model, "config": {}, "input": point, **derivative_args["Gradient"]}
        call("Gradient", {**gradient, "inWrt": len(inputs)}, 400, invalid)
        call("Gradient", {**gradient, "outWrt": len(outputs)}, 400, invalid)
    call("Evaluate", {"name": "wrong_model_name"}, 400, error_schema("ModelNotFound"))
    call("ModelInfo", {"name": "wrong_model_name"}, 400, error_schema("ModelNotFound"))
    return exercised


def test_conformity_of_models_0(gateway: GatewayProcess) -> None:
    """The public suite tests only models[0]: it must be Evaluate-capable."""
    first = requests.get(f"{url(gateway)}/Info", timeout=30).json()["models"][0]
    assert "Evaluate" in check_conformity(url(gateway), first)


@pytest.mark.parametrize(("model", "features"), [
    ("forward", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("trig", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("trig_swapped", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("simple", "Evaluate"),
    ("square", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("square_keepalive", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("evaluate_only", "Evaluate"),
    ("evaluate_only_fd", "Evaluate Gradient ApplyJacobian ApplyHessian"),
    ("gradient_only", "Gradient"),
])
def test_conformity_through_the_gateway(gateway: GatewayProcess, model: str, features: str) -> None:
    assert check_conformity(url(gateway), model, value=1.0) == features.split()


def test_conformity_checks_pass_on_the_reference_server(peer: UmbridgePeer) -> None:
    """The checks themselves agree with the reference implementation."""
    assert check_conformity(f"http://{peer.address}", "square") == [
        "Evaluate", "Gradient", "ApplyJacobian", "ApplyHessian"]
    assert check_conformity(f"http://{peer.address}", "evaluate_only") == ["Evaluate"]


# --- the repository index through a UM-Bridge upstream ------------------------------------

PEER_MODELS = {"gradient_only", "square", "evaluate_only", "nonfinite", "broken", "slow"}


def test_repository_index_lists_the_umbridge_servers_models(peer: UmbridgePeer, tmp_path: Path) -> None:
    """Behind a catch-all route, the models come only from the server's /Info."""
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams: [{{name: peer, protocol: umbridge, endpoints: ["{peer.address}"]}}]
routes: [{{match: {{model: "*"}}, upstream: peer}}]
"""
    assert set(umbridge.supported_models(f"http://{peer.address}")) == PEER_MODELS  # what the server says
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
        with httpclient.InferenceServerClient(gw.url("rest")) as http:
            over_http = {e["name"]: e["state"] for e in http.get_model_repository_index()}
        with grpcclient.InferenceServerClient(gw.url("grpc")) as grpc_client:
            over_grpc = {m.name: m.state for m in grpc_client.get_model_repository_index().models}
    assert over_http == over_grpc == dict.fromkeys(PEER_MODELS, "READY")
