"""The GraphStorm listener and upstream over real sockets.

The gateway runs as its own process; a GraphStorm client is plain HTTP
(what ``invoke_endpoint`` sends). No real GraphStorm endpoint can run here
(it needs DGL, PyTorch and SageMaker): the ``graphstorm`` upstream is tested
against the stand-in of ``tests/peers/graphstorm_standin.py``, a separate
process written from the documented contract.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import requests
import tritonclient.http as httpclient
from graphstorm_payloads import (
    JSON,
    MOVIELENS_SCHEMA,
    TARGET_MODEL,
    changed,
    invoke,
    large_movielens,
    load,
    movielens,
    uid,
)
from prometheus_client.parser import text_string_to_metric_families

from peers.graphstorm_standin import StandIn, probabilities
from support import GatewayProcess, free_port, wait_for, write_config

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
limits: {{max_request_bytes: 16MiB}}
listeners:
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, gnn: {{num_classes: 3}}}}
  - {{name: standin, protocol: graphstorm, endpoints: ["127.0.0.1:{standin}"], timeout: 10s}}
  - {{name: dead, protocol: graphstorm, endpoints: ["127.0.0.1:{dead}"], timeout: 5s}}
  - {{name: standin-translated, protocol: graphstorm, endpoints: ["127.0.0.1:{standin}"], timeout: 10s,
      passthrough: false}}
routes:
  - match: {{model: gnn, listener: gs}}
    upstream: local
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: gnn-edges, listener: gs}}
    upstream: local
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}", edge_tasks: true}}}}
  - match: {{model: gnn-open, listener: gs}}
    upstream: local
    rewrite: {{model: gnn}}
  - match: {{model: remote, listener: gs}}
    upstream: standin
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: remote-translated, listener: gs}}
    upstream: standin-translated
    rewrite: {{model: remote}}
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: remote-open}}
    upstream: standin
    rewrite: {{model: remote}}
  - match: {{model: down}}
    upstream: dead
  - match: {{model: "*", listener: rest}}
    upstream: local
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    server = StandIn(tmp_path_factory.mktemp("standin"), "--require", "movie:title")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, standin: StandIn) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("gw")
    text = CONFIG.format(standin=standin.port, dead=free_port(), schema=MOVIELENS_SCHEMA)
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def test_ping_and_paths_outside_the_contract(gateway: GatewayProcess, http: requests.Session) -> None:
    ping = http.get(f"http://{gateway.url('gs')}/ping", timeout=10)
    assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"})
    for method, path, code in (("GET", "/nope", 404), ("GET", "/invocations", 405), ("POST", "/ping", 405)):
        reply = http.request(method, f"http://{gateway.url('gs')}{path}", timeout=10)
        assert reply.status_code == code
        assert reply.json()["status_code"] == code and reply.json()["data"] == {}


def test_movielens_through_the_builtin_gnn(gateway: GatewayProcess, http: requests.Session) -> None:
    answer, body = invoke(gateway, http, movielens())
    assert answer["status_code"] == 200, answer
    assert answer["request_uid"] == hashlib.sha256(body).hexdigest()[-16:]
    assert (answer["message"], answer["error"]) == ("Request processed successfully.", "")
    results = answer["data"]["results"]
    assert [(r["node_type"], r["node_id"]) for r in results] == [("user", "a1"), ("movie", "m2"), ("movie", "m1")]
    for result in results:
        assert len(result["prediction"]) == 3  # num_classes from the upstream's gnn settings
        assert sum(result["prediction"]) == pytest.approx(1.0, abs=1e-6)
    again, _ = invoke(gateway, http, movielens())
    assert again == answer  # deterministic
    regression, _ = invoke(gateway, http, changed(movielens(), lambda p: p.update(gml_task="node_regression")))
    assert [len(r["prediction"]) for r in regression["data"]["results"]] == [1, 1, 1]
    versionless, _ = invoke(gateway, http, changed(movielens(), lambda p: p.pop("version")))
    assert versionless["status_code"] == 200  # version is not checked


@pytest.mark.parametrize("name", ["docs_learnable_embedding_payload.json", "docs_raw_text_payload.json"])
def test_documentation_payloads_on_a_route_without_schema(gateway: GatewayProcess, http: requests.Session,
                                                          name: str) -> None:
    answer, body = invoke(gateway, http, load(name), model="gnn-open")
    assert answer["status_code"] == 200, answer
    assert answer["request_uid"] == uid(body)
    [result] = answer["data"]["results"]
    assert sum(result["prediction"]) == pytest.approx(1.0, abs=1e-6)
    # With the MovieLens schema, their node types are unknown: 411.
    assert invoke(gateway, http, load(name), model="gnn")[0]["status_code"] == 411


def test_edge_tasks_on_a_route_that_enables_them(gateway: GatewayProcess, http: requests.Session) -> None:
    payload = changed(movielens(), lambda p: p.update(gml_task="edge_classification", targets=[
        {"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m2"}]))
    answer, _ = invoke(gateway, http, payload, model="gnn-edges")
    assert answer["status_code"] == 200, answer
    [result] = answer["data"]["results"]
    assert list(result) == ["edge_type", "src_node_id", "dest_node_id", "prediction"]
    assert (result["edge_type"], result["src_node_id"], result["dest_node_id"]) == (
        ["user", "rating", "movie"], "a1", "m2")
    assert sum(result["prediction"]) == pytest.approx(1.0, abs=1e-6)
    assert invoke(gateway, http, payload)[0]["status_code"] == 421  # the default route serves node tasks only


BASE = movielens()
# MovieLens without the movie "title" feature the stand-in's model needs.
NO_TITLE = changed(BASE, lambda p: [n["features"].pop("title") for n in p["graph"]["nodes"]
                                    if n["node_type"] == "movie"])
ERRORS: list[tuple[str, Any, dict[str, str], int, bool]] = [
    # (case, body, headers, status_code, request_uid expected)
    ("charset suffix", BASE, {"Content-Type": "application/json; charset=utf-8"}, 400, False),
    ("no content type", BASE, {"Content-Type": ""}, 400, False),
    ("text/plain", BASE, {"Content-Type": "text/plain"}, 400, False),
    ("invalid JSON", b'{"gml_task": ', {}, 400, False),
    ("not UTF-8", b'{"gml_task": "\xff"}', {}, 400, False),
    ("UTF-16", json.dumps(BASE).encode("utf-16"), {}, 400, False),
    ("a JSON list", b"[]", {}, 400, True),
    ("no targets", changed(BASE, lambda p: p.pop("targets")), {}, 401, True),
    ("malformed target", changed(BASE, lambda p: p.update(targets=[{"node_id": "m1"}])), {}, 400, True),
    ("target type absent", changed(BASE, lambda p: p.update(targets=[{"node_type": "genre", "node_id": "g"}])),
     {}, 403, True),
    ("target id absent", changed(BASE, lambda p: p.update(targets=[{"node_type": "movie", "node_id": "m9"}])),
     {}, 404, True),
    ("model feature absent", changed(BASE, lambda p: [n["features"].pop("title") for n in p["graph"]["nodes"]
                                                      if n["node_type"] == "movie"]), {}, 404, True),
    ("duplicate node ids", changed(BASE, lambda p: p["graph"]["nodes"][2].update(node_id="m1")), {}, 411, True),
    ("malformed edge_type", changed(BASE, lambda p: p["graph"]["edges"][0].update(edge_type="rating")),
     {}, 411, True),
    ("non-numeric feature", changed(BASE, lambda p: p["graph"]["nodes"][0]["features"].update(feat="x")),
     {}, 411, True),
    ("feature dims", changed(BASE, lambda p: p["graph"]["nodes"][0]["features"].update(feat=[1, 2, 3])),
     {}, 411, True),
    ("task", changed(BASE, lambda p: p.update(gml_task="link_prediction")), {}, 421, True),
    ("no route", BASE, {TARGET_MODEL: "nowhere"}, 500, True),
    ("upstream down", BASE, {TARGET_MODEL: "down"}, 500, True),
]


@pytest.mark.parametrize(("body", "headers", "code", "has_uid"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_error_status_codes(gateway: GatewayProcess, http: requests.Session, body: Any, headers: dict[str, str],
                            code: int, has_uid: bool) -> None:
    answer, sent = invoke(gateway, http, body, headers={**JSON, **headers})
    assert answer["status_code"] == code, answer
    assert answer["request_uid"] == (uid(sent) if has_uid else "")
    assert (answer["message"], answer["data"]) == ("", {})
    assert answer["error"] and len(answer["error"]) <= 1024


def test_payload_over_the_size_limit(gateway: GatewayProcess, http: requests.Session) -> None:
    filler = "x" * (17 << 20)
    answer, _ = invoke(gateway, http, changed(BASE, lambda p: p.update(padding=filler)))
    assert (answer["status_code"], answer["request_uid"]) == (400, "")
    assert "limit" in answer["error"]
    assert http.get(f"http://{gateway.url('gs')}/ping", timeout=10).status_code == 200


def test_large_payload_end_to_end(gateway: GatewayProcess, http: requests.Session) -> None:
    payload = large_movielens()
    body = orjson.dumps(payload)
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        answer, _ = invoke(gateway, http, body)
        timings.append(time.perf_counter() - started)
        assert answer["status_code"] == 200, answer["error"]
    assert len(answer["data"]["results"]) == 100
    assert answer["request_uid"] == uid(body)
    # Printed for bench/graphstorm_payload.py's readers (pytest -s); speed is not asserted here.
    print(f"\n10k nodes / 50k edges ({len(body) / 1e6:.1f} MB): end to end {min(timings):.3f}s best of 3")


# --- the graphstorm upstream (stand-in endpoint) ------------------------------------------------------


def standin_last(standin: StandIn) -> dict[str, Any]:
    result: dict[str, Any] = requests.get(f"http://127.0.0.1:{standin.port}/last", timeout=10).json()
    return result


def test_raw_body_is_forwarded_byte_for_byte(gateway: GatewayProcess, http: requests.Session,
                                             standin: StandIn) -> None:
    # Unusual but valid JSON: indentation, key order, escapes. A re-encoding would change it.
    text = json.dumps(movielens(), indent=3, sort_keys=True, ensure_ascii=True)
    body = text.encode().replace(b"a1", b"\\u0061\\u0031")
    answer, _ = invoke(gateway, http, body, model="remote")
    assert answer["status_code"] == 200, answer
    last = standin_last(standin)
    assert (last["sha256"], last["length"], last["content_type"]) == (
        hashlib.sha256(body).hexdigest(), len(body), "application/json")
    assert answer["request_uid"] == uid(body)  # computed by the endpoint from the same bytes
    results = answer["data"]["results"]
    assert [(r["node_type"], r["node_id"]) for r in results] == [("user", "a1"), ("movie", "m2"), ("movie", "m1")]
    assert results[1]["prediction"] == probabilities("movie/m2", 2)


def test_passthrough_off_re_encodes(gateway: GatewayProcess, http: requests.Session, standin: StandIn) -> None:
    """`passthrough: false`: the endpoint gets the gateway's own encoding of
    the same graph, and the client the same predictions under its own uid."""
    text = json.dumps(movielens(), indent=3, sort_keys=True)
    body = text.encode()
    answer, _ = invoke(gateway, http, body, model="remote-translated")
    assert answer["status_code"] == 200, answer
    assert standin_last(standin)["sha256"] != hashlib.sha256(body).hexdigest()
    assert answer["request_uid"] == uid(body)
    results = answer["data"]["results"]
    assert [(r["node_type"], r["node_id"]) for r in results] == [("user", "a1"), ("movie", "m2"), ("movie", "m1")]
    # decoded into FP32 tensors on the way back, unlike the relayed answer
    np.testing.assert_allclose(results[1]["prediction"], probabilities("movie/m2", 2), rtol=1e-6)


def test_upstream_answers_pass_through_unchanged(gateway: GatewayProcess, http: requests.Session,
                                                 standin: StandIn) -> None:
    # The stand-in's model needs movie "title"; without a schema the gateway lets it decide.
    answer, body = invoke(gateway, http, NO_TITLE, model="remote-open")
    assert (answer["status_code"], answer["request_uid"]) == (404, uid(body))
    assert answer["error"] == "Missing node feature title of movie"  # the endpoint's own words
    failing, body = invoke(gateway, http, changed(BASE, lambda p: p.update(standin_fail=True)), model="remote")
    assert (failing["status_code"], failing["request_uid"]) == (500, uid(body))
    assert "stand-in asked to fail" in failing["error"]
    # Local validation still answers first, with GraphStorm's codes.
    assert invoke(gateway, http, NO_TITLE, model="remote")[0]["status_code"] == 404
    assert invoke(gateway, http, changed(BASE, lambda p: p.pop("targets")), model="remote")[0]["status_code"] == 401


def _outcomes(gateway: GatewayProcess) -> dict[tuple[str, str, str], float]:
    text = requests.get(f"http://{gateway.url('admin')}/metrics", timeout=5).text
    return {(s.labels["model"], s.labels["http_code"], s.labels["outcome"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "gateway_requests_total" and s.labels["listener"] == "gs"}


def test_endpoint_status_codes_passed_through_are_counted(gateway: GatewayProcess, http: requests.Session,
                                                          standin: StandIn) -> None:
    """An endpoint's own answer, relayed unchanged, is counted with its status_code and the kind it means."""
    before = _outcomes(gateway)
    failing = changed(BASE, lambda p: p.update(standin_fail=True))
    sent = [(NO_TITLE, "remote-open", ("remote-open", "404", "invalid_input")),
            (failing, "remote", ("remote", "500", "upstream_bad_response")),
            (BASE, "remote", ("remote", "200", "ok"))]
    for payload, model, _ in sent:
        invoke(gateway, http, payload, model=model)
    expected = {key: before.get(key, 0) + 1 for _, _, key in sent}
    wait_for(lambda: all(_outcomes(gateway).get(key) == count for key, count in expected.items()), 5,
             "the relayed answers to be counted")


def graph_inputs() -> list[dict[str, Any]]:
    """The MovieLens graph as contract tensors, in V2 JSON."""
    return [
        {"name": "node/user/ids", "datatype": "BYTES", "shape": [1], "data": ["a1"]},
        {"name": "node/user/feature/feat", "datatype": "FP32", "shape": [1, 2], "data": [-0.0032965524587780237, -0.1]},
        {"name": "node/movie/ids", "datatype": "BYTES", "shape": [2], "data": ["m1", "m2"]},
        {"name": "node/movie/feature/feat", "datatype": "FP32", "shape": [2, 2],
         "data": [0.011269339360296726, 0.1, 0.0235343543, 0.1]},
        {"name": "node/movie/feature/title", "datatype": "BYTES", "shape": [2, 1],
         "data": ["sample text 1", "sample text 2"]},
        {"name": "edge/movie/rating-rev/user/index", "datatype": "INT64", "shape": [2, 1], "data": [0, 0]},
        {"name": "edge/user/rating/movie/index", "datatype": "INT64", "shape": [2, 2], "data": [0, 0, 0, 1]},
        {"name": "target/user", "datatype": "INT64", "shape": [1], "data": [0]},
        {"name": "target/movie", "datatype": "INT64", "shape": [2], "data": [1, 0]},
    ]


def v2_infer(gateway: GatewayProcess, http: requests.Session, model: str) -> dict[str, Any]:
    request = {"id": "v2-1", "parameters": {"gml_task": "node_classification"}, "inputs": graph_inputs()}
    reply = http.post(f"http://{gateway.url('rest')}/v2/models/{model}/infer", json=request, timeout=30)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def test_v2_client_and_graphstorm_client_get_the_same_gnn_answer(gateway: GatewayProcess,
                                                                  http: requests.Session) -> None:
    outputs = {o["name"]: o for o in v2_infer(gateway, http, "gnn")["outputs"]}
    assert (outputs["prediction/movie"]["datatype"], outputs["prediction/movie"]["shape"]) == ("FP32", [2, 3])
    answer, _ = invoke(gateway, http, movielens())
    by_id = {r["node_id"]: r["prediction"] for r in answer["data"]["results"]}
    np.testing.assert_allclose(np.array(outputs["prediction/movie"]["data"]).reshape(2, 3),
                               [by_id["m2"], by_id["m1"]], rtol=1e-6)
    np.testing.assert_allclose(outputs["prediction/user"]["data"], by_id["a1"], rtol=1e-6)


def test_v2_client_to_a_graphstorm_endpoint(gateway: GatewayProcess, http: requests.Session,
                                            standin: StandIn) -> None:
    response = v2_infer(gateway, http, "remote-open")
    assert response["id"] == "v2-1"
    outputs = {o["name"]: o for o in response["outputs"]}
    assert outputs["prediction/movie"]["shape"] == [2, 2]
    np.testing.assert_allclose(np.array(outputs["prediction/movie"]["data"]).reshape(2, 2),
                               [probabilities("movie/m2", 2), probabilities("movie/m1", 2)], rtol=1e-6)
    assert standin_last(standin)["content_type"] == "application/json"
    # The endpoint's own refusal reaches the V2 client as a 400 naming its upstream (never its address).
    request = {"inputs": [i for i in graph_inputs() if i["name"] != "node/movie/feature/title"]}
    reply = http.post(f"http://{gateway.url('rest')}/v2/models/remote-open/infer", json=request, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"] == "upstream 'standin' answered status_code 404: Missing node feature title of movie"


def test_tritonclient_to_a_graphstorm_endpoint(gateway: GatewayProcess, standin: StandIn) -> None:
    """Unmodified tritonclient (binary tensors) -> gateway -> GraphStorm endpoint."""
    arrays = {
        "node/user/ids": np.array([b"a1"], dtype=object),
        "node/movie/ids": np.array([b"m1", b"m2"], dtype=object),
        "node/movie/feature/title": np.array([[b"t1"], [b"t2"]], dtype=object),
        "edge/user/rating/movie/index": np.array([[0, 0], [0, 1]], dtype=np.int64),
        "target/movie": np.array([1], dtype=np.int64),
    }
    inputs = []
    for name, array in arrays.items():
        item = httpclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT64")
        item.set_data_from_numpy(array)
        inputs.append(item)
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        result = client.infer("remote-open", inputs, parameters={"gml_task": "node_regression"})
    np.testing.assert_allclose(result.as_numpy("prediction/movie"), [[probabilities("movie/m2", 2)[0]]], rtol=1e-6)
    bad = httpclient.InferInput("target/movie", [1], "INT64")
    bad.set_data_from_numpy(np.array([5], dtype=np.int64))
    with httpclient.InferenceServerClient(gateway.url("rest")) as client, pytest.raises(Exception, match="outside"):
        client.infer("remote-open", [*inputs[:-1], bad])
