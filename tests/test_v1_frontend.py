"""V1 clients (TensorFlow Serving REST / KServe V1, plain HTTP) -> gateway
-> V2 models: the builtin ones in the gateway, and a real MLServer over
V2 REST and V2 gRPC upstreams.

The gateway runs as its own process; the clients are ``requests`` and
``urllib`` with TF Serving's documented request forms (KServe's own V1
client needs the ``kserve`` package, which this environment lacks)."""

from __future__ import annotations

import base64
import json
import math
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from peers.mlserver import MLServerPeer
from support import GatewayProcess, write_config

SIMPLE_A = list(range(16))
SIMPLE_B = [1] * 16
SUM = [a + b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]
DIFF = [a - b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]


def config(peer: MLServerPeer) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: mls-rest, protocol: v2-rest, endpoints: ["{peer.rest_address}"]}}
  - {{name: mls-grpc, protocol: v2-grpc, endpoints: ["{peer.grpc_address}"]}}
routes:
  - {{match: {{model: simple_rest}}, upstream: mls-rest, rewrite: {{model: simple}}}}
  - {{match: {{model: simple_grpc}}, upstream: mls-grpc, rewrite: {{model: simple}}}}
  - {{match: {{model: upper_rest}}, upstream: mls-rest, rewrite: {{model: upper_bytes}}}}
  - {{match: {{model: upper_grpc}}, upstream: mls-grpc, rewrite: {{model: upper_bytes}}}}
  - {{match: {{model: trig_rest}}, upstream: mls-rest, rewrite: {{model: trig_fp32}}}}
  - {{match: {{model: trig_grpc}}, upstream: mls-grpc, rewrite: {{model: trig_fp32}}}}
  - {{match: {{model: "*"}}, upstream: local}}
"""


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("v1")
    with GatewayProcess(write_config(directory, config(mlserver)), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def url(gateway: GatewayProcess, path: str) -> str:
    return f"http://{gateway.url('v1')}{path}"


def predict(gateway: GatewayProcess, http: requests.Session, model: str, body: Any,
            version: str = "") -> requests.Response:
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + ":predict"
    return http.post(url(gateway, path), json=body, timeout=30)


def ok(reply: requests.Response) -> Any:
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    return reply.json()


def v1_error(reply: requests.Response, status: int, *words: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    for word in words:
        assert word in body["error"], body
    return str(body["error"])


# --- health, listing, readiness ------------------------------------------------


def test_liveness_listing_and_model_readiness(gateway: GatewayProcess, http: requests.Session) -> None:
    assert ok(http.get(url(gateway, "/"), timeout=10)) == {"status": "alive"}
    assert ok(http.get(url(gateway, "/v1/models/simple"), timeout=10)) == {"name": "simple", "ready": True}
    assert ok(http.get(url(gateway, "/v1/models/simple_rest"), timeout=10)) == {"name": "simple_rest",
                                                                              "ready": True}
    assert ok(http.get(url(gateway, "/v1/models/simple/versions/1"), timeout=10))["ready"] is True
    models = ok(http.get(url(gateway, "/v1/models"), timeout=10))["models"]
    assert {"simple_rest", "simple_grpc", "upper_rest"} <= set(models)
    v1_error(http.get(url(gateway, "/v1/models/simple_rest/versions/7"), timeout=10), 404, "simple")


# --- builtin models ---------------------------------------------------------------


def test_rows_of_named_inputs_give_one_prediction_object_per_instance(gateway: GatewayProcess,
                                                                         http: requests.Session) -> None:
    body = {"instances": [{"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}, {"INPUT0": SIMPLE_B, "INPUT1": SIMPLE_A}]}
    predictions = ok(predict(gateway, http, "simple", body))["predictions"]
    assert predictions == [
        {"OUTPUT0": SUM, "OUTPUT1": DIFF},
        {"OUTPUT0": SUM, "OUTPUT1": [-d for d in DIFF]},
    ]


def test_columnar_inputs_give_columnar_outputs(gateway: GatewayProcess, http: requests.Session) -> None:
    body = {"inputs": {"INPUT0": [SIMPLE_A], "INPUT1": [SIMPLE_B]}}
    outputs = ok(predict(gateway, http, "simple", body, version="1"))["outputs"]
    assert outputs == {"OUTPUT0": [SUM],
                       "OUTPUT1": [DIFF]}


def test_single_unnamed_input_takes_the_models_only_input(gateway: GatewayProcess, http: requests.Session) -> None:
    """identity's one input takes any datatype: the values say which."""
    assert ok(predict(gateway, http, "identity", {"instances": [[1.5, 2.5], [3.0, 4.0]]})) == {
        "predictions": [[1.5, 2.5], [3.0, 4.0]]}
    assert ok(predict(gateway, http, "identity", {"inputs": [[1, 2, 3]]})) == {"outputs": [[1, 2, 3]]}
    assert ok(predict(gateway, http, "identity", {"instances": [True, False]})) == {"predictions": [True, False]}


def test_b64_and_strings_are_bytes(gateway: GatewayProcess, http: requests.Session) -> None:
    raw = b"\x00\xff binary"
    body = {"instances": [{"b64": base64.b64encode(raw).decode()}, "text", {"b64": base64.b64encode(b"ok").decode()}]}
    predictions = ok(predict(gateway, http, "identity", body))["predictions"]
    assert predictions == [{"b64": base64.b64encode(raw).decode()}, "text", "ok"]


def test_urllib_client(gateway: GatewayProcess) -> None:
    """The standard library's client, as TF Serving's docs use curl."""
    body = json.dumps({"instances": [[1.0, 2.0]]}).encode()
    request = urllib.request.Request(url(gateway, "/v1/models/identity:predict"), data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert json.loads(reply.read()) == {"predictions": [[1.0, 2.0]]}


# --- errors in V1 form ------------------------------------------------------------


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"instances": [{"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}, {"INPUT0": SIMPLE_A[:3], "INPUT1": SIMPLE_B}]}, 400,
     ("ragged", "INPUT0")),
    ({"inputs": {"INPUT0": [SIMPLE_A, [SIMPLE_A]], "INPUT1": [SIMPLE_B]}}, 400, ("ragged",)),
    ({"instances": [{"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}, {"INPUT0": SIMPLE_A}]}, 400, ("same inputs",)),
    ({"instances": [SIMPLE_A]}, 400, ("takes 2 inputs", "INPUT0")),
    ({"instances": [{"NOPE": SIMPLE_A}]}, 400, ("no input 'NOPE'",)),
    ({"instances": [{"INPUT0": ["a"] * 16, "INPUT1": SIMPLE_B}]}, 400, ("INT32",)),
    ({"instances": [], "inputs": {}}, 400, ("exactly one of",)),
    ({"signature_name": "serving_default"}, 400, ("exactly one of",)),
    ({"instances": []}, 400, ("non-empty",)),
    ({"instances": [1], "parameters": [1]}, 400, ("parameters",)),
    ([1, 2], 400, ("JSON object",)),
])
def test_bad_requests_answer_v1_errors(gateway: GatewayProcess, http: requests.Session, body: Any, status: int,
                                       words: tuple[str, ...]) -> None:
    v1_error(predict(gateway, http, "simple", body), status, *words)


def test_malformed_json_unknown_model_and_paths(gateway: GatewayProcess, http: requests.Session) -> None:
    v1_error(http.post(url(gateway, "/v1/models/simple:predict"), data=b"{nope", timeout=10), 400, "JSON")
    bad_b64 = {"instances": [{"b64": "!!!"}]}
    v1_error(predict(gateway, http, "identity", bad_b64), 400, "base64")
    v1_error(predict(gateway, http, "no_such_model", {"instances": [1]}), 404, "no_such_model")
    v1_error(http.get(url(gateway, "/v1/models/no_such_model"), timeout=10), 404)
    v1_error(http.get(url(gateway, "/v2/models/simple"), timeout=10), 404, "no such endpoint")
    v1_error(http.post(url(gateway, "/v1/models/simple:explain"), json={"instances": [1]}, timeout=10), 501,
             "explain")


# --- MLServer over V2 REST and V2 gRPC ------------------------------------------------


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_mlserver_named_rows_and_columns(gateway: GatewayProcess, http: requests.Session, hop: str) -> None:
    body = {"instances": [{"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}]}
    (prediction,) = ok(predict(gateway, http, f"simple_{hop}", body))["predictions"]
    assert prediction["OUTPUT0"] == SUM
    columns = ok(predict(gateway, http, f"simple_{hop}", {"inputs": {"INPUT0": [SIMPLE_A], "INPUT1": [SIMPLE_B]}},
                         version="1"))["outputs"]
    assert columns["OUTPUT1"] == [DIFF]


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_mlserver_float_rows_from_metadata(gateway: GatewayProcess, http: requests.Session, hop: str) -> None:
    """trig_fp32's metadata names x [-1, 2] and y [-1, 1] as FP32: integer
    values are sent as floats."""
    body = {"instances": [{"x": [0, 1], "y": [2]}, {"x": [0.5, 0.25], "y": [1.0]}]}
    predictions = ok(predict(gateway, http, f"trig_{hop}", body))["predictions"]
    assert predictions == [  # f = [sin(x0) * y0, x0 * x1 ** 2], g = [exp(x1 / 2) + y0 ** 2], each row its own
        {"f": [0.0, 0.0], "g": pytest.approx([math.exp(0.5) + 4], rel=1e-6)},
        {"f": pytest.approx([math.sin(0.5), 0.03125], rel=1e-6), "g": pytest.approx([math.exp(0.125) + 1], rel=1e-6)}]


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_mlserver_strings_without_metadata(gateway: GatewayProcess, http: requests.Session, hop: str) -> None:
    """upper_bytes declares no inputs: strings default to BYTES."""
    predictions = ok(predict(gateway, http, f"upper_{hop}", {"instances": ["abc", "Zé"]}))["predictions"]
    assert predictions == [{"UPPER": "ABC", "LENGTH": 3}, {"UPPER": "Zé", "LENGTH": 3}]


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_mlserver_errors_reach_v1_clients(gateway: GatewayProcess, http: requests.Session, hop: str) -> None:
    v1_error(predict(gateway, http, f"simple_{hop}", {"instances": [{"INPUT0": [1, 2], "INPUT1": [1, 2]}]}), 400)
    v1_error(predict(gateway, http, f"simple_{hop}", {"instances": [1]}, version="9"), 404)


# --- a listener with auth ----------------------------------------------------------------


def test_auth_refuses_in_v1_form_and_liveness_needs_no_token(tmp_path: Any) -> None:
    text = """
admin: {address: null}
listeners:
  - {name: v1, protocol: v1-rest, address: "127.0.0.1:0", fast_path: false, auth: {token: {env: GW_TEST_V1_TOKEN}}}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - {match: {model: "*"}, upstream: local}
"""
    with GatewayProcess(write_config(tmp_path, text), tmp_path / "gateway.log",
                        extra_env={"GW_TEST_V1_TOKEN": "t0ken"}) as gw, requests.Session() as http:
        base = f"http://{gw.url('v1')}"
        assert http.get(f"{base}/", timeout=10).status_code == 200  # a probe path
        refused = http.post(f"{base}/v1/models/identity:predict", json={"instances": [1]}, timeout=10)
        v1_error(refused, 401, "credentials are required")
        answered = http.post(f"{base}/v1/models/identity:predict", json={"instances": [1]}, timeout=10,
                             headers={"Authorization": "Bearer t0ken"})
        assert ok(answered) == {"predictions": [1]}
        assert "t0ken" not in gw.log()
