"""Any client -> gateway -> a V1 server (the ``v1-rest`` upstream).

Behind the gateway (its own process): a real KServe ModelServer (its own
virtualenv and process, tests/peers/kserve.py) with custom V1 models
(tests/peers/kserve_models/models.py). In front: tritonclient over HTTP
(JSON and binary tensors) and gRPC, and UM-Bridge's own client through the
UM-Bridge -> V2 mapping. The codec's pure functions are checked at the end.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import AsyncIterator, Iterator

import numpy as np
import orjson
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from aiohttp import web
from tritonclient.utils import InferenceServerException

from gateway.app.configure import parse_config
from gateway.config.address import parse_address
from gateway.config.node import ConfigError, Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferRequest, OperationRequest, RawPayload, RequestContext, Tensor, TensorSpec
from gateway.protocols.v1_rest import EXPLAIN_OPERATION
from gateway.protocols.v1_rest import upstream_codec as codec
from gateway.protocols.v1_rest.backend import V1RestClient
from gateway.protocols.v1_rest.upstream_options import COLUMNAR, ROW, V1UpstreamOptions
from gateway.runtime.services import GatewayServices
from peers.kserve import KServePeer, kserve  # noqa: F401 - the session-wide KServe fixture
from peers.kserve import ensure_venv as kserve_python
from support import GatewayProcess, write_config

MAX_ELEMENTS = 1 << 20


def config(peer: KServePeer) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, models: [simple]}}
  - name: v1
    protocol: v1-rest
    endpoints: ["{peer.address}"]
    models:
      doubler:
        inputs: [{{name: x, datatype: FP64, shape: [-1, 2]}}]
        outputs: [{{name: doubled, datatype: FP64, shape: [-1, 2]}}]
      summer:
        inputs: [{{name: a, datatype: FP32, shape: [-1, 2]}}, {{name: b, datatype: FP32, shape: [-1, 1]}}]
        outputs: [{{name: sum, datatype: FP64, shape: [-1]}}]
  - name: v1-columnar
    protocol: v1-rest
    endpoints: ["{peer.address}"]
    request_format: inputs
    output_name: y
routes:
  - {{match: {{model: simple}}, upstream: local}}
  - {{match: {{model: doubler_columnar}}, upstream: v1-columnar, rewrite: {{model: doubler}}}}
  - match: {{model: doubler, listener: umb}}
    upstream: v1
    options: {{umbridge: {{finite_differences: true}}}}
  # No retry on reset: after KServe's 500 (it then closes the connection
  # silently) the transport must not reuse the connection (docs/v1-rest.md).
  - {{match: {{model: "*"}}, upstream: v1}}
"""


@pytest.fixture(scope="module")
def gateway(kserve: KServePeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:  # noqa: F811
    directory = tmp_path_factory.mktemp("v1-upstream")
    with GatewayProcess(write_config(directory, config(kserve)), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def http_client(gateway: GatewayProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(gateway: GatewayProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    yield client
    client.close()


def _http_infer(client: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray],
                datatypes: dict[str, str], binary: bool, outputs: list[str] | None = None
                ) -> httpclient.InferResult:
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatypes[name])
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    asked = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in outputs] if outputs else None
    return client.infer(model, tensors, outputs=asked)


def _grpc_infer(client: grpcclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray],
                datatypes: dict[str, str]) -> grpcclient.InferResult:
    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), datatypes[name])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors)


# --- V2 clients -> V1 server ------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rows_over_http(http_client: httpclient.InferenceServerClient, binary: bool) -> None:
    """Three rows go as three instances; the predictions come back stacked
    as the model's declared output (FP64, from the upstream's options)."""
    x = np.array([[1.5, 2.0], [3.0, -4.25], [0.0, 1e10]])
    result = _http_infer(http_client, "doubler", {"x": x}, {"x": "FP64"}, binary, ["doubled"])
    np.testing.assert_array_equal(result.as_numpy("doubled"), 2 * x)
    assert result.get_output("doubled")["datatype"] == "FP64"


def test_rows_over_grpc(grpc_client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[1.0, 2.0]])
    result = _grpc_infer(grpc_client, "doubler", {"x": x}, {"x": "FP64"})
    np.testing.assert_array_equal(result.as_numpy("doubled"), 2 * x)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_columnar_upstream_infers_datatypes(http_client: httpclient.InferenceServerClient, binary: bool) -> None:
    """``request_format: inputs``: the whole tensor goes as ``inputs`` and
    comes back as ``outputs``, named by ``output_name``; no model options,
    so integers read as INT64."""
    x = np.array([[1, 2], [3, 4]], dtype=np.int32)
    result = _http_infer(http_client, "doubler_columnar", {"x": x}, {"x": "INT32"}, binary, ["y"])
    assert result.get_output("y")["datatype"] == "INT64"
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)


def test_several_inputs_become_named_instances(http_client: httpclient.InferenceServerClient,
                                               grpc_client: grpcclient.InferenceServerClient) -> None:
    inputs = {"a": np.array([[1, 2], [3, 4]], dtype=np.float32), "b": np.array([[10], [20]], dtype=np.float32)}
    types = {"a": "FP32", "b": "FP32"}
    for result in (_http_infer(http_client, "summer", inputs, types, False),
                   _grpc_infer(grpc_client, "summer", inputs, types)):
        np.testing.assert_array_equal(result.as_numpy("sum"), [13.0, 27.0])


def test_rows_must_agree(http_client: httpclient.InferenceServerClient) -> None:
    inputs = {"a": np.ones((2, 2), dtype=np.float32), "b": np.ones((3, 1), dtype=np.float32)}
    with pytest.raises(InferenceServerException) as info:
        _http_infer(http_client, "summer", inputs, {"a": "FP32", "b": "FP32"}, False)
    assert info.value.status() == "400"
    assert "rows" in str(info.value)


def test_dict_predictions_become_outputs(http_client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 2], [30, 4]], dtype=np.int64)
    result = _http_infer(http_client, "labeller", {"x": x}, {"x": "INT64"}, False)
    assert result.get_output("total")["datatype"] == "INT64"
    assert result.get_output("label")["datatype"] == "BYTES"
    np.testing.assert_array_equal(result.as_numpy("total"), [3, 34])
    assert list(result.as_numpy("label")) == [b"small", b"big"]


@pytest.mark.parametrize("client_kind", ["http", "grpc"])
def test_bytes_travel_as_text_or_b64(http_client: httpclient.InferenceServerClient,
                                     grpc_client: grpcclient.InferenceServerClient, client_kind: str) -> None:
    """UTF-8 elements go as strings, others as {"b64"}; the echo model
    sends both back unchanged and they return as the same bytes."""
    items = np.array([b"plain", "\u00fcn\u00efcode".encode(), b"\xff\x00\x80raw"], dtype=object)
    if client_kind == "http":
        result = _http_infer(http_client, "echo", {"s": items}, {"s": "BYTES"}, True, ["predictions"])
    else:
        result = _grpc_infer(grpc_client, "echo", {"s": items}, {"s": "BYTES"})
    assert list(result.as_numpy("predictions")) == list(items)


def test_what_the_v1_server_receives(gateway: GatewayProcess, kserve: KServePeer) -> None:  # noqa: F811
    """The body as the V1 server read it: one input's rows as plain values,
    UTF-8 as text, other bytes as {"b64"}, request parameters without the
    V2 client's wire ones."""
    seen = len(kserve.echo_calls())
    body = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a\u00e9", "b"]}],
            "parameters": {"tag": "t1", "binary_data_output": False}}
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/echo/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == ["a\u00e9", "b"]
    items = np.array([b"\xff"], dtype=object)
    _http_infer(httpclient.InferenceServerClient(gateway.url("rest")), "echo", {"s": items}, {"s": "BYTES"}, True)
    assert kserve.echo_calls()[seen:] == [{"instances": ["a\u00e9", "b"], "parameters": {"tag": "t1"}},
                                          {"instances": [{"b64": "/w=="}]}]


# --- V1 clients: the V1 listener in front of the V1 server (and of a V2 model) ------------------

# KServe's own V1 REST client (kserve.InferenceRESTClient), run in the
# KServe peer's virtualenv: it prints each answer (or error) as one JSON line.
KSERVE_CLIENT = """
import asyncio, json, sys
from kserve import InferenceRESTClient, RESTConfig

async def main(base_url):
    client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    for model, data in json.loads(sys.stdin.read()):
        try:
            answer = await client.infer(base_url, data, model_name=model)
            print(json.dumps({"answer": answer}))
        except Exception as error:
            print(json.dumps({"error": type(error).__name__, "message": str(error)}))
    await client.close()

asyncio.run(main(sys.argv[1]))
"""


def _kserve_client(gateway: GatewayProcess, calls: list[tuple[str, object]]) -> list[dict[str, object]]:
    result = subprocess.run([str(kserve_python()), "-c", KSERVE_CLIENT,
                             f"http://{gateway.url('v1')}"], input=json.dumps(calls), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_kserves_own_v1_client_through_the_gateway(gateway: GatewayProcess) -> None:
    simple = {"instances": [{"INPUT0": list(range(16)), "INPUT1": [1] * 16}]}
    answers = _kserve_client(gateway, [
        ("doubler", {"instances": [[1, 2], [3, 4]]}),  # V1 -> V1 server
        ("simple", simple),  # V1 -> a V2 model (builtin), names from its metadata
        ("nope", {"instances": [[1]]}),
    ])
    assert answers[0] == {"answer": {"predictions": [[2, 4], [6, 8]]}}
    prediction = answers[1]["answer"]["predictions"][0]  # type: ignore[index]
    assert prediction == {"OUTPUT0": list(range(1, 17)), "OUTPUT1": list(range(-1, 15))}
    assert "error" in answers[2] and "nope" in str(answers[2]["message"])


def test_plain_v1_http_to_the_v1_server(gateway: GatewayProcess) -> None:
    base = f"http://{gateway.url('v1')}/v1/models"
    reply = requests.post(f"{base}/summer:predict", timeout=30,
                          json={"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5], "b": [6]}]})
    assert reply.status_code == 200 and reply.json() == {"predictions": [6, 15]}, reply.text
    reply = requests.post(f"{base}/labeller:explain", json={"instances": [[1, 2]]}, timeout=30)
    assert reply.status_code == 200 and reply.json() == {"explanations": [{"total": 3, "threshold": 10}]}
    assert requests.get(f"{base}/doubler", timeout=30).json() == {"name": "doubler", "ready": True}
    reply = requests.post(f"{base}/broken:predict", json={"instances": [[1]]}, timeout=30)
    assert reply.status_code == 502 and set(reply.json()) == {"error"}  # the server's 500, in V1's form
    # Ragged rows are no tensors, but valid V1: the server answers them (tests/test_v1_passthrough.py).
    reply = requests.post(f"{base}/doubler:predict", json={"instances": [[1, 2], [3]]}, timeout=30)
    assert reply.status_code == 200 and reply.json() == {"predictions": [[2, 4], [6]]}, reply.text
    reply = requests.post(f"{base}/doubler:predict", json={"instances": [[1, 2], ["x"]]}, timeout=30)
    assert reply.status_code == 400 and "not a number" in reply.json()["error"], reply.text  # the server's 400


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "rest_status", "grpc_code"), [
    ("doubler", "400", "StatusCode.INVALID_ARGUMENT"),  # the model's InvalidInput: the client's error
    ("broken", "502", "StatusCode.INTERNAL"),  # its 500: an upstream failure
    ("sleeper", "503", "StatusCode.UNAVAILABLE"),  # not ready: 503
    ("nope", "404", "StatusCode.NOT_FOUND"),  # KServe's ModelNotFound
])
def test_v1_errors_reach_v2_clients_by_class(http_client: httpclient.InferenceServerClient,
                                             grpc_client: grpcclient.InferenceServerClient, model: str,
                                             rest_status: str, grpc_code: str) -> None:
    # Strings where the doubler wants numbers: KServe's model raises InvalidInput (400).
    inputs = {"x": np.array([b"one", b"two"], dtype=object)}
    with pytest.raises(InferenceServerException) as info:
        _http_infer(http_client, model, inputs, {"x": "BYTES"}, False)
    assert info.value.status() == rest_status, str(info.value)
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(grpc_client, model, inputs, {"x": "BYTES"})
    assert info.value.status() == grpc_code, str(info.value)
    assert "127.0.0.1" not in str(info.value)


# --- readiness and metadata ------------------------------------------------------------


def test_model_readiness(gateway: GatewayProcess, http_client: httpclient.InferenceServerClient) -> None:
    """From GET /v1/models/{name}: ready, not ready (KServe's 503), unknown (404)."""
    assert http_client.is_model_ready("doubler")
    base = f"http://{gateway.url('rest')}/v2/models"
    assert requests.get(f"{base}/doubler/ready", timeout=10).status_code == 200
    assert requests.get(f"{base}/sleeper/ready", timeout=10).status_code != 200
    assert not http_client.is_model_ready("sleeper")
    assert requests.get(f"{base}/nope/ready", timeout=10).status_code == 404


def test_metadata_from_the_upstream_options(http_client: httpclient.InferenceServerClient,
                                            grpc_client: grpcclient.InferenceServerClient) -> None:
    http_meta = http_client.get_model_metadata("summer")
    assert http_meta["platform"] == "v1-rest"
    assert [(t["name"], t["datatype"], t["shape"]) for t in http_meta["inputs"]] == [
        ("a", "FP32", [-1, 2]), ("b", "FP32", [-1, 1])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in http_meta["outputs"]] == [("sum", "FP64", [-1])]
    grpc_meta = grpc_client.get_model_metadata("doubler")
    assert [(t.name, t.datatype, list(t.shape)) for t in grpc_meta.inputs] == [("x", "FP64", [-1, 2])]


def test_metadata_of_an_undescribed_model(gateway: GatewayProcess) -> None:
    """A model the options do not describe exists (the server says) but shows no tensors."""
    base = f"http://{gateway.url('rest')}/v2/models"
    meta = requests.get(f"{base}/labeller", timeout=10)
    assert meta.status_code == 200
    assert meta.json()["inputs"] == [] and meta.json()["name"] == "labeller"
    assert requests.get(f"{base}/nope", timeout=10).status_code == 404


# --- UM-Bridge clients -> V1 server ---------------------------------------------------------


def test_umbridge_client_reaches_a_v1_model(gateway: GatewayProcess) -> None:
    """Sizes from the options' metadata; Evaluate as one instance; a
    Gradient by finite differences as one request of several instances."""
    model = umbridge.HTTPModel(f"http://{gateway.url('umb')}", "doubler")
    assert model.get_input_sizes() == [2]
    assert model.get_output_sizes() == [2]
    assert model([[1.5, -2.0]]) == [[3.0, -4.0]]
    assert model.supports_gradient()
    gradient = model.gradient(0, 0, [[1.5, -2.0]], [1.0, 0.5])
    np.testing.assert_allclose(gradient, [2.0, 1.0], rtol=1e-6)


# --- the codec, unit by unit ---------------------------------------------------------------


def test_encode_forms() -> None:
    request = InferRequest("m", inputs=[Tensor.from_numpy("a", np.array([[1, 2], [3, 4]], dtype=np.int32)),
                                        Tensor.from_numpy("b", np.array([b"x", b"\xff"], dtype=object), "BYTES")])
    assert orjson.loads(codec.encode_request(request, ROW)) == {
        "instances": [{"a": [1, 2], "b": "x"}, {"a": [3, 4], "b": {"b64": "/w=="}}]}
    assert orjson.loads(codec.encode_request(request, COLUMNAR)) == {
        "inputs": {"a": [[1, 2], [3, 4]], "b": ["x", {"b64": "/w=="}]}}
    single = InferRequest("m", inputs=[Tensor.from_numpy("a", np.array([[np.nan, 1.0]]))], parameters={"k": 1})
    assert orjson.loads(codec.encode_request(single, ROW)) == {"instances": [[None, 1.0]], "parameters": {"k": 1}}
    scalar = InferRequest("m", inputs=[Tensor("a", "FP64", (), np.array(1.0))])
    with pytest.raises(GatewayError) as info:
        codec.encode_request(scalar, ROW)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def _decode(answer: object, outputs: tuple[TensorSpec, ...] = ()) -> list[Tensor]:
    return codec.decode_answer(orjson.dumps(answer), outputs, "predictions", MAX_ELEMENTS)


def test_decode_datatypes() -> None:
    [ints] = _decode({"predictions": [[1, 2], [3, 4]]})
    assert (ints.name, ints.datatype, ints.shape) == ("predictions", "INT64", (2, 2))
    [floats] = _decode({"predictions": [1, 2.5, None]})
    assert floats.datatype == "FP64" and np.isnan(floats.data[2])
    [flags] = _decode({"predictions": [True, False]})
    assert flags.datatype == "BOOL"
    [text] = _decode({"predictions": ["a", {"b64": "/w=="}]})
    assert text.datatype == "BYTES" and list(text.data) == [b"a", b"\xff"]
    [declared] = _decode({"predictions": [1, 2]}, (TensorSpec("score", "FP32", (-1,)),))
    assert (declared.name, declared.datatype) == ("score", "FP32")
    named = _decode({"outputs": {"p": [[0.5]], "q": [1]}})
    assert [(t.name, t.datatype, t.shape) for t in named] == [("p", "FP64", (1, 1)), ("q", "INT64", (1,))]
    [empty] = _decode({"predictions": []})
    assert empty.shape == (0,)
    [literals] = codec.decode_answer(b'{"predictions": [NaN, -Infinity, 1]}', (), "predictions", MAX_ELEMENTS)
    assert literals.datatype == "FP64" and np.isnan(literals.data[0]) and literals.data[1] == -np.inf


@pytest.mark.parametrize("answer", [
    {"predictions": [[1, 2], [3]]},  # ragged
    {"predictions": [1, "a"]},  # mixed
    {"predictions": [{"a": 1}, {"b": 2}]},  # objects with other keys
    {"predictions": ["x", {"b64": "not base64!"}]},
    {"result": [1]},  # neither predictions nor outputs
    [1, 2],
])
def test_decode_refuses_broken_answers(answer: object) -> None:
    """The caller reads them as the upstream's fault (reading_reply: 502)."""
    with pytest.raises(GatewayError) as info:
        _decode(answer)
    assert info.value.kind in (ErrorKind.INVALID_INPUT, ErrorKind.MALFORMED_REQUEST)


def test_decode_error_statuses() -> None:
    assert codec.decode_error(400, b'{"error": "bad"}', "u").kind is ErrorKind.INVALID_INPUT
    assert codec.decode_error(418, b"", "u").kind is ErrorKind.INVALID_INPUT  # any 4xx: the client's
    assert codec.decode_error(404, b"", "u").kind is ErrorKind.MODEL_NOT_FOUND
    assert codec.decode_error(500, b'{"error": "boom"}', "u").kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    assert codec.decode_error(503, b"", "u").kind is ErrorKind.UPSTREAM_UNAVAILABLE
    assert "boom" in codec.decode_error(500, b'{"error": "boom"}', "u").message
    hidden = codec.decode_error(503, b'{"error": "cannot reach http://10.1.2.3:8080/v1/models/m:predict"}', "u")
    assert "10.1.2.3" not in hidden.message and "cannot reach" in hidden.message


# --- the upstream's keys ---------------------------------------------------------------------


def _upstream_config(**keys: object) -> dict[str, object]:
    return {"listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:0"}],
            "upstreams": [{"name": "v1", "protocol": "v1-rest", "endpoints": ["127.0.0.1:1"], **keys}],
            "routes": [{"match": {"model": "*"}, "upstream": "v1"}]}


def test_upstream_keys() -> None:
    parsed = parse_config(_upstream_config(
        request_format="inputs", output_name="scores",
        models={"m": {"inputs": [{"name": "x", "datatype": "INT32", "shape": [-1, 3]}],
                      "request_format": "instances"}}))
    options = parsed.upstreams[0].options
    assert isinstance(options, V1UpstreamOptions)
    assert (options.request_format, options.output_name, options.format_of("m"), options.format_of("n")) == (
        "inputs", "scores", "instances", "inputs")
    assert options.models["m"].inputs == (TensorSpec("x", "INT32", (-1, 3)),)


@pytest.mark.parametrize(("keys", "problem"), [
    ({"request_format": "rows"}, "request_format: must be one of"),
    ({"models": {"m": {"inputs": [{"name": "x", "datatype": "FP99"}]}}}, "datatype: must be one of"),
    ({"models": {"m": {"inputs": [{"name": "x", "shape": [-2]}]}}}, "shape: must be a list of integers"),
    ({"models": {"m": {"outputs": [{"name": "y"}, {"name": "y"}]}}}, "names tensor 'y' twice"),
    ({"models": {"m": {"input": []}}}, "input: unknown key"),
    ({"health_path": "health"}, "health_path: must start with '/'"),
])
def test_upstream_key_errors(keys: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_upstream_config(**keys))
    assert problem in str(info.value)


# --- :explain, as a V1 listener asks it (call_operation) ------------------------------------------


@pytest.fixture
async def v1_client(kserve: KServePeer) -> AsyncIterator[V1RestClient]:  # noqa: F811
    """A V1RestClient of its own (no gateway) for the KServe peer."""
    parsed = parse_config(_upstream_config())
    upstream = dataclasses.replace(parsed.upstreams[0], endpoints=(parse_address(Node(kserve.address, "", [])),))
    client = V1RestClient(upstream, upstream.endpoints[0], GatewayServices(parsed, parsed.server))
    await client.start()
    yield client
    await client.close()


async def test_explain_is_forwarded(v1_client: V1RestClient) -> None:
    ctx = RequestContext("rest", "v2-rest")
    assert EXPLAIN_OPERATION in v1_client.operations
    request = InferRequest("labeller", inputs=[Tensor.from_numpy("x", np.array([[1, 2], [30, 4]]))])
    answer = await v1_client.call_operation(EXPLAIN_OPERATION, OperationRequest(request), ctx)
    assert isinstance(answer, RawPayload)
    assert orjson.loads(answer.body) == {"explanations": [{"total": 3, "threshold": 10},
                                                           {"total": 34, "threshold": 10}]}
    raw = RawPayload("v1-rest", b'{"instances": [[5, 6]]}')
    forwarded = await v1_client.call_operation(EXPLAIN_OPERATION, OperationRequest(
        InferRequest("labeller", raw=raw)), ctx)
    assert orjson.loads(forwarded.body) == {"explanations": [{"total": 11, "threshold": 10}]}
    with pytest.raises(GatewayError) as info:  # no explainer: KServe's 501
        await v1_client.call_operation(EXPLAIN_OPERATION, OperationRequest(
            InferRequest("doubler", inputs=request.inputs)), ctx)
    assert info.value.kind is ErrorKind.UNSUPPORTED


async def test_a_v1_clients_body_goes_unchanged(v1_client: V1RestClient) -> None:
    """Its answer comes back as bytes beside the tensors, or alone when it
    is valid V1 but no V2 tensor (ragged rows)."""
    ctx = RequestContext("v1", "v1-rest")
    body = b'{"instances": [[1, 2], [3, 4]]}'
    response = await v1_client.infer(InferRequest("doubler", raw=RawPayload("v1-rest", body)), ctx)
    assert response.raw is not None and orjson.loads(response.raw.body) == {"predictions": [[2, 4], [6, 8]]}
    np.testing.assert_array_equal(response.outputs[0].data, [[2, 4], [6, 8]])
    ragged = await v1_client.infer(InferRequest("echo", raw=RawPayload("v1-rest", b'{"instances": [[1], [2, 3]]}')),
                                   ctx)
    assert ragged.outputs == [] and ragged.raw is not None
    assert orjson.loads(ragged.raw.body) == {"predictions": [[1], [2, 3]]}


# --- TF Serving's forms (a stand-in: TF Serving itself needs TensorFlow) ----------------------------


async def test_tf_serving_versions_and_status() -> None:
    """Versioned paths, ``model_version_status`` as readiness, columnar
    ``outputs``; TF Serving has no ``GET /``, hence ``health_path``."""
    seen: list[tuple[str, str, bytes]] = []

    async def status(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, b""))
        state = "AVAILABLE" if request.match_info["version"] == "2" else "LOADING"
        return web.json_response({"model_version_status": [{"version": request.match_info["version"],
                                                            "state": state}]})

    async def predict(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.method, request.path, body))
        return web.json_response({"outputs": [x / 2 + 2 for x in orjson.loads(body)["inputs"]]})

    app = web.Application()
    app.router.add_get("/v1/models/half/versions/{version}", status)
    app.router.add_post("/v1/models/half/versions/{version}:predict", predict)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    parsed = parse_config(_upstream_config(request_format="inputs", health_path="/v1/models/half/versions/2"))
    upstream = dataclasses.replace(parsed.upstreams[0], endpoints=(parse_address(Node(f"127.0.0.1:{port}", "", [])),))
    client = V1RestClient(upstream, upstream.endpoints[0], GatewayServices(parsed, parsed.server))
    await client.start()
    try:
        ctx = RequestContext("rest", "v2-rest")
        assert await client.model_ready("half", "2", ctx)
        assert not await client.model_ready("half", "1", ctx)
        assert await client.server_ready(ctx)
        request = InferRequest("half", "2", inputs=[Tensor.from_numpy("x", np.array([1.0, 2.0, 5.0]))])
        [out] = (await client.infer(request, ctx)).outputs
        assert (out.name, out.datatype) == ("predictions", "FP64")
        np.testing.assert_array_equal(out.data, [2.5, 3.0, 4.5])
        assert seen[-1] == ("POST", "/v1/models/half/versions/2:predict", b'{"inputs":[1.0,2.0,5.0]}')
    finally:
        await client.close()
        await runner.cleanup()
