"""GraphStorm codec, schema and graph tensor contract: pure tests, no sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from graphstorm_payloads import DATA, MOVIELENS_SCHEMA, changed, large_movielens, load, movielens, uid

from gateway.app.configure import load_config, parse_config
from gateway.config.node import ConfigError
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.graphtensors import (
    EDGE_TASKS,
    NODE_TASKS,
    GraphTensors,
)
from gateway.core.types import InferRequest, Tensor
from gateway.protocols.builtin.gnn import GnnModel, GnnSettings
from gateway.protocols.graphstorm import codec, errors
from gateway.protocols.graphstorm.frontend import RouteOptions, route_options
from gateway.protocols.graphstorm.payload import Invocation
from gateway.protocols.graphstorm.schema import GraphSchema, parse_schema

SCHEMA = parse_schema(json.loads(MOVIELENS_SCHEMA.read_text()), str(MOVIELENS_SCHEMA), [])
ALL_TASKS = NODE_TASKS + EDGE_TASKS


def decode(payload: Any, schema: GraphSchema | None = SCHEMA, tasks: tuple[str, ...] = NODE_TASKS) -> Invocation:
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return codec.decode_invocation(codec.parse_json(body), schema, tasks)


def failure(payload: Any, schema: GraphSchema | None = SCHEMA, tasks: tuple[str, ...] = NODE_TASKS) -> tuple[int, str]:
    with pytest.raises(GatewayError) as caught:
        decode(payload, schema, tasks)
    return errors.status_code_of(caught.value), caught.value.message


def node(payload: dict[str, Any], node_id: str) -> dict[str, Any]:
    return next(n for n in payload["graph"]["nodes"] if n["node_id"] == node_id)


def set_in(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(payload: dict[str, Any]) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def drop(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(payload: dict[str, Any]) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return change


# --- the real payload --------------------------------------------------------------------


def test_movielens_payload_becomes_the_documented_tensors() -> None:
    invocation = decode(movielens())
    tensors = {t.name: t for t in invocation.graph.to_tensors()}
    assert list(tensors) == [
        "node/user/ids", "node/user/feature/feat",
        "node/movie/ids", "node/movie/feature/feat", "node/movie/feature/title",
        "edge/movie/rating-rev/user/index", "edge/user/rating/movie/index",
        "target/user", "target/movie"]
    assert tensors["node/movie/ids"].data.tolist() == [b"m1", b"m2"]
    assert (tensors["node/movie/feature/feat"].datatype, tensors["node/movie/feature/feat"].shape) == ("FP32", (2, 2))
    np.testing.assert_allclose(tensors["node/movie/feature/feat"].data, [[0.011269339360296726, 0.1],
                                                                         [0.0235343543, 0.1]], rtol=1e-6)
    assert tensors["node/movie/feature/title"].datatype == "BYTES"
    assert tensors["node/movie/feature/title"].data.tolist() == [[b"sample text 1"], [b"sample text 2"]]
    assert tensors["edge/user/rating/movie/index"].data.tolist() == [[0, 0], [0, 1]]
    assert tensors["edge/movie/rating-rev/user/index"].data.tolist() == [[0], [0]]
    assert tensors["edge/user/rating/movie/index"].datatype == "INT64"
    # Targets grouped by node type in graph order (user first), in target order within a type.
    assert tensors["target/user"].data.tolist() == [0]
    assert tensors["target/movie"].data.tolist() == [1, 0]
    assert invocation.node_targets == {"user": ["a1"], "movie": ["m2", "m1"]}
    # The edges' "rate" features are not in the schema: GraphStorm ignores them, so do we.
    assert not invocation.graph.edge_features


def test_without_a_schema_every_feature_travels() -> None:
    invocation = decode(movielens(), schema=None)
    features = invocation.graph.edge_features[("user", "rating", "movie")]
    np.testing.assert_allclose(features["rate"], [[0.1235435765, 0.1], [0.23143243, 0.1]], rtol=1e-6)


@pytest.mark.parametrize("name", ["docs_learnable_embedding_payload.json", "docs_raw_text_payload.json"])
def test_documentation_payloads_decode_without_a_schema(name: str) -> None:
    invocation = decode(load(name), schema=None)
    graph = invocation.graph
    if name.startswith("docs_learnable"):
        assert graph.node_features["user"]["gs_learnable_embedding"].shape == (1, 8)
        assert graph.node_features["user"]["age"].shape == (1, 1)
        assert graph.node_features["user"]["category"].tolist() == [[b"premium"]]
        assert invocation.node_targets == {"user": ["u1234"]}
    else:
        assert graph.node_features["paper"]["numerical_feat"].shape == (1, 3)
        assert graph.node_features["author"]["bio"].dtype == object
        assert invocation.node_targets == {"paper": ["p1234"]}


def test_gconstruct_config_without_runtime_dims_is_a_schema_too() -> None:
    problems: list[str] = []
    schema = parse_schema(load("movielens_gconstruct_config.json"), "config", problems)
    assert problems == []
    # Two blocks describe "user"; GraphStorm merges them.
    assert [f.name for f in schema.node_features["user"]] == ["feat"]
    assert schema.node_features["user"][0].dim is None
    assert schema.node_features["movie"][0].kind == "text"
    assert schema.node_labels["user"] == ("regression",)


# --- every status code, in GraphStorm's order -----------------------------------------------------

BASE = movielens()
CASES: list[tuple[str, Any, int, str]] = [
    # 421: the task
    ("no gml_task", drop(["gml_task"]), 421, "Task Mismatch"),
    ("link prediction", set_in(["gml_task"], "link_prediction"), 421, "link_prediction"),
    ("edge task not enabled", set_in(["gml_task"], "edge_classification"), 421, "node_classification"),
    ("task is a list", set_in(["gml_task"], ["node_classification"]), 421, "Task Mismatch"),
    # 421 before 401
    ("bad task and no targets", lambda p: (p.pop("targets"), p.update(gml_task="x")), 421, "Task"),
    # 401: targets
    ("no targets", drop(["targets"]), 401, "'targets'"),
    ("null targets", set_in(["targets"], None), 401, "'targets'"),
    ("empty targets", set_in(["targets"], []), 401, "'targets'"),
    ("empty object targets", set_in(["targets"], {}), 401, "'targets'"),
    # 400: malformed targets, before any graph check
    ("targets not a list", set_in(["targets"], "m1"), 400, "list"),
    ("target not an object", set_in(["targets"], [1]), 400, "targets[0]"),
    ("target without node_id", set_in(["targets"], [{"node_type": "movie"}]), 400, "node_id"),
    ("edge target in a node task",
     set_in(["targets"], [{"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m1"}]),
     400, "node_type"),
    ("malformed target before graph error", lambda p: (p.pop("graph"), p.update(targets=[{}])), 400, "targets"),
    # 411: graph construction
    ("no graph", drop(["graph"]), 411, "'graph'"),
    ("graph not an object", set_in(["graph"], []), 411, "'graph'"),
    ("no nodes", drop(["graph", "nodes"]), 411, "'nodes'"),
    ("no edges", drop(["graph", "edges"]), 411, "'edges'"),
    ("nodes not a list", set_in(["graph", "nodes"], {"a": 1}), 411, "graph.nodes"),
    ("node not an object", set_in(["graph", "nodes", 0], "a1"), 411, "graph.nodes[0]"),
    ("node without type", drop(["graph", "nodes", 0, "node_type"]), 411, "node_type"),
    ("unknown node type", set_in(["graph", "nodes", 0, "node_type"], "director"), 411, "'director'"),
    ("node without id", drop(["graph", "nodes", 1, "node_id"]), 411, "node_id"),
    ("node id a list", set_in(["graph", "nodes", 1, "node_id"], ["m1"]), 411, "strings or integers"),
    ("duplicate node id", set_in(["graph", "nodes", 2, "node_id"], "m1"), 411, "'m1' appears more than once"),
    ("features not an object", set_in(["graph", "nodes", 0, "features"], [1, 2]), 411, "must be objects"),
    ("differing feature names", drop(["graph", "nodes", 2, "features", "title"]), 411, "same feature names"),
    ("a node without features", drop(["graph", "nodes", 2, "features"]), 411, "others do not"),
    ("a type without features", drop(["graph", "nodes", 0, "features"]), 411, "have no 'features'"),
    ("non-numeric feature", set_in(["graph", "nodes", 0, "features", "feat"], ["a", "b"]), 411, "got strings"),
    ("a string among numbers", set_in(["graph", "nodes", 1, "features", "feat"], ["0.5", 0.1]), 411, "got strings"),
    ("boolean feature", set_in(["graph", "nodes", 0, "features", "feat"], [True, False]), 411, "booleans"),
    ("null in a feature", set_in(["graph", "nodes", 0, "features", "feat"], [None, 1.0]), 411, "numbers"),
    ("ragged feature", set_in(["graph", "nodes", 1, "features", "feat"], [0.5]), 411, "differ in length"),
    ("feature dims not matching", lambda p: [n["features"].update(feat=[1.0, 2.0, 3.0])
                                             for n in p["graph"]["nodes"] if n["node_type"] == "movie"],
     411, "feature_dim [2]"),
    ("scalar for a 2-wide feature", set_in(["graph", "nodes", 0, "features", "feat"], 0.5), 411, "feature_dim"),
    ("number for a text feature", set_in(["graph", "nodes", 1, "features", "title"], 5), 411, "text"),
    ("edge not an object", set_in(["graph", "edges", 0], None), 411, "graph.edges[0]"),
    ("edge without type", drop(["graph", "edges", 0, "edge_type"]), 411, "edge_type"),
    ("edge_type a string", set_in(["graph", "edges", 0, "edge_type"], "rating"), 411, "three strings"),
    ("edge_type of two", set_in(["graph", "edges", 0, "edge_type"], ["movie", "rating-rev"]), 411, "three strings"),
    ("edge_type of four", set_in(["graph", "edges", 0, "edge_type"], ["movie", "rating-rev", "user", "x"]),
     411, "three strings"),
    ("edge_type with a number", set_in(["graph", "edges", 0, "edge_type"], ["movie", 1, "user"]), 411,
     "three strings"),
    ("edge type not in schema", set_in(["graph", "edges", 0, "edge_type"], ["movie", "rating", "user"]), 411,
     "not in the model's graph schema"),
    ("edge to an unknown node", set_in(["graph", "edges", 1, "dest_node_id"], "m9"), 411, "'m9'"),
    ("edge without a source", drop(["graph", "edges", 1, "src_node_id"]), 411, "src_node_id"),
    ("edge id unhashable", set_in(["graph", "edges", 1, "src_node_id"], ["a1"]), 411, "['a1']"),
    ("edge to a type with no nodes", lambda p: p["graph"].update(
        nodes=[n for n in p["graph"]["nodes"] if n["node_type"] != "user"]), 411, "no nodes"),
    # 404: a feature the model needs; only once the graph is built
    ("model feature absent", lambda p: [n["features"].pop("title") for n in p["graph"]["nodes"]
                                        if n["node_type"] == "movie"], 404, "'title'"),
    ("empty features", lambda p: [n.update(features={}) for n in p["graph"]["nodes"] if n["node_type"] == "user"],
     404, "'feat'"),
    ("construction failure wins over an absent feature",
     lambda p: ([n["features"].pop("title") for n in p["graph"]["nodes"] if n["node_type"] == "movie"],
                p["graph"]["edges"][2].update(dest_node_id="m9")), 411, "'m9'"),
    # 403 / 404: targets, in target order
    ("target type absent", set_in(["targets"], [{"node_type": "director", "node_id": "d1"}]), 403, "'director'"),
    ("target type known but absent", lambda p: (
        p["graph"].update(nodes=[n for n in p["graph"]["nodes"] if n["node_type"] != "user"], edges=[]),
        p.update(targets=[{"node_type": "user", "node_id": "a1"}])), 403, "'user'"),
    ("target id absent", set_in(["targets"], [{"node_type": "movie", "node_id": "m3"}]), 404, "'m3'"),
    ("target id of another type", set_in(["targets"], [{"node_type": "user", "node_id": "m1"}]), 404, "'m1'"),
    ("first failing target wins", set_in(["targets"], [{"node_type": "movie", "node_id": "m3"},
                                                       {"node_type": "director", "node_id": "d"}]), 404, "'m3'"),
    ("target id as a number", set_in(["targets"], [{"node_type": "movie", "node_id": 1}]), 404, "1"),
]


@pytest.mark.parametrize(("change", "code", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_status_codes(change: Any, code: int, fragment: str) -> None:
    got, message = failure(changed(BASE, change))
    assert got == code, message
    assert fragment in message


def test_body_level_failures_are_400() -> None:
    for body in (b"{", b"", b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"[1, 2]", b"null", b'"text"'):
        with pytest.raises(GatewayError) as caught:
            decode(body)
        assert errors.status_code_of(caught.value) == 400, body


@pytest.mark.parametrize("content_type", [None, "", "application/json; charset=utf-8", "text/json",
                                          "Application/JSON", "application/x-json"])
def test_content_type_must_be_exactly_application_json(content_type: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        codec.check_content_type(content_type)
    assert errors.status_code_of(caught.value) == 400
    codec.check_content_type("application/json")


def test_python_json_extensions_are_accepted_like_graphstorm() -> None:
    # GraphStorm parses with Python's json, which takes NaN and Infinity.
    body = orjson.dumps(movielens()).replace(b"-0.1", b"NaN", 1)
    invocation = decode(body)
    assert np.isnan(invocation.graph.node_features["user"]["feat"][0, 1])


def test_integer_ids_and_duplicate_targets() -> None:
    payload = movielens()
    for item in payload["graph"]["nodes"]:
        item["node_id"] = {"a1": 1, "m1": 10, "m2": 20}[item["node_id"]]
    for edge in payload["graph"]["edges"]:
        edge["src_node_id"] = {"a1": 1, "m1": 10}[edge["src_node_id"]]
        edge["dest_node_id"] = {"a1": 1, "m1": 10, "m2": 20}[edge["dest_node_id"]]
    payload["targets"] = [{"node_type": "movie", "node_id": 20}, {"node_type": "movie", "node_id": 20}]
    invocation = decode(payload)
    assert invocation.node_targets == {"movie": [20, 20]}
    assert invocation.graph.node_targets["movie"].tolist() == [1, 1]
    assert invocation.graph.node_ids["movie"].tolist() == [b"10", b"20"]
    # "20" (a string) is not 20 (an integer).
    assert failure(changed(payload, set_in(["targets"], [{"node_type": "movie", "node_id": "20"}])))[0] == 404


def test_edge_tasks_when_enabled() -> None:
    payload = changed(movielens(), lambda p: p.update(gml_task="edge_classification", targets=[
        {"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m2"},
        {"edge_type": ["movie", "rating-rev", "user"], "src_node_id": "m1", "dest_node_id": "a1"}]))
    invocation = decode(payload, tasks=ALL_TASKS)
    assert invocation.graph.edge_targets[("user", "rating", "movie")].tolist() == [[0], [1]]
    assert list(invocation.edge_targets) == [("movie", "rating-rev", "user"), ("user", "rating", "movie")]
    names = [t.name for t in invocation.graph.to_tensors() if t.name.startswith("target/")]
    assert names == ["target/movie/rating-rev/user", "target/user/rating/movie"]
    bad_type = changed(payload, set_in(["targets", 0, "edge_type"], ["user", "likes", "movie"]))
    assert failure(bad_type, tasks=ALL_TASKS)[0] == 403
    bad_id = changed(payload, set_in(["targets", 0, "dest_node_id"], "m7"))
    assert failure(bad_id, tasks=ALL_TASKS)[0] == 404
    malformed = changed(payload, set_in(["targets", 0, "edge_type"], "rating"))
    assert failure(malformed, tasks=ALL_TASKS)[0] == 400
    node_target = changed(payload, set_in(["targets"], [{"node_type": "movie", "node_id": "m1"}]))
    assert failure(node_target, tasks=ALL_TASKS)[0] == 400


# --- answers ---------------------------------------------------------------------------------------


def test_results_are_grouped_like_graphstorm_and_the_envelope_matches_real_answers() -> None:
    invocation = decode(movielens())
    outputs = GnnModel(GnnSettings(num_classes=14)).infer(
        InferRequest("gnn", inputs=invocation.graph.to_tensors(), parameters={"gml_task": "node_classification"}))
    answer = orjson.loads(codec.encode_results(invocation, outputs, "0123456789abcdef"))
    real = load("docs_success_response_nc_14class.json")
    assert list(answer) == list(real) == ["status_code", "request_uid", "message", "error", "data"]
    assert (answer["status_code"], answer["message"], answer["error"]) == (200, real["message"], "")
    results = answer["data"]["results"]
    assert list(results[0]) == list(real["data"]["results"][0]) == ["node_type", "node_id", "prediction"]
    assert [(r["node_type"], r["node_id"]) for r in results] == [("user", "a1"), ("movie", "m2"), ("movie", "m1")]
    for result in results:
        assert len(result["prediction"]) == 14
        assert sum(result["prediction"]) == pytest.approx(1.0, abs=1e-6)


def test_error_envelope() -> None:
    answer = orjson.loads(codec.encode_error(errors.target_id_absent("m3"), "abc"))
    assert answer == {"status_code": 404, "request_uid": "abc", "message": "",
                      "error": answer["error"], "data": {}}
    assert "m3" in answer["error"]


def test_every_error_kind_has_a_status_code() -> None:
    assert set(errors.STATUS_OF_KIND) == set(ErrorKind)
    assert all(code in (400, 401, 403, 404, 411, 421, 500) for code in errors.STATUS_OF_KIND.values())


def test_wrong_model_outputs_are_reported() -> None:
    invocation = decode(movielens())
    short = [Tensor.from_numpy("prediction/user", np.ones((1, 2), np.float32))]
    with pytest.raises(GatewayError, match="prediction/movie"):
        codec.encode_results(invocation, short, "x")
    wrong_rows = [*short, Tensor.from_numpy("prediction/movie", np.ones((3, 2), np.float32))]
    with pytest.raises(GatewayError, match="2 targets"):
        codec.encode_results(invocation, wrong_rows, "x")


def test_upstream_envelopes() -> None:
    real = (DATA / "success_response_fraud_2class.json").read_bytes()
    envelope = codec.decode_envelope(real, "up")
    graph = GraphTensors(node_ids={"Transaction": np.array([b"2991260"], dtype=object)},
                         node_targets={"Transaction": np.array([0])})
    [output] = codec.decode_predictions(envelope, graph, "up")
    assert output.name == "prediction/Transaction"
    np.testing.assert_allclose(output.data, [[0.995966911315918, 0.004033133387565613]], rtol=1e-6)
    with pytest.raises(GatewayError) as caught:
        codec.decode_envelope(b"<html>", "up")
    assert caught.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    error = codec.upstream_error({"status_code": 411, "error": "no"}, "up")
    assert (error.status_code, error.kind) == (411, ErrorKind.INVALID_INPUT)
    other = GraphTensors(node_ids={"Transaction": np.array([b"1"], dtype=object)},
                         node_targets={"Transaction": np.array([0])})
    with pytest.raises(GatewayError, match="not asked about"):
        codec.decode_predictions(envelope, other, "up")


# --- the tensor contract ----------------------------------------------------------------------------


def test_tensor_names_escape_separators() -> None:
    graph = GraphTensors(node_ids={"a/b%": np.array([b"x", b"y"], dtype=object)},
                         node_features={"a/b%": {"f/1": np.ones((2, 3), np.float32)}},
                         edge_index={("a/b%", "r/", "a/b%"): np.array([[0, 1], [1, 0]])},
                         node_targets={"a/b%": np.array([1])})
    tensors = graph.to_tensors()
    assert [t.name for t in tensors] == ["node/a%2Fb%25/ids", "node/a%2Fb%25/feature/f%2F1",
                                         "edge/a%2Fb%25/r%2F/a%2Fb%25/index", "target/a%2Fb%25"]
    back = GraphTensors.from_tensors(tensors)
    assert list(back.node_features["a/b%"]) == ["f/1"]
    assert list(back.edge_index) == [("a/b%", "r/", "a/b%")]


def test_payload_round_trips_through_tensors() -> None:
    invocation = decode(movielens())
    again = decode(changed(codec.parse_json(codec.encode_request(
        GraphTensors.from_tensors(invocation.graph.to_tensors()), "node_classification")), lambda p: None))
    assert again.node_targets == invocation.node_targets
    for before, after in zip(invocation.graph.to_tensors(), again.graph.to_tensors(), strict=True):
        assert before.name == after.name
        np.testing.assert_array_equal(before.data, after.data)


@pytest.mark.parametrize(("tensors", "fragment"), [
    ([Tensor.from_numpy("node/u/ids", np.array([b"a"], dtype=object), "BYTES"),
      Tensor.from_numpy("target/u", np.array([1]))], "outside 0..0"),
    ([Tensor.from_numpy("node/u/ids", np.array([b"a"], dtype=object), "BYTES"),
      Tensor.from_numpy("node/u/feature/f", np.ones((2, 2), np.float32)),
      Tensor.from_numpy("target/u", np.array([0]))], "1 rows"),
    ([Tensor.from_numpy("node/u/ids", np.array([b"a"], dtype=object), "BYTES"),
      Tensor.from_numpy("edge/u/r/v/index", np.array([[0], [0]])),
      Tensor.from_numpy("target/u", np.array([0]))], "node type 'v'"),
    ([Tensor.from_numpy("node/u/ids", np.array([b"a"], dtype=object), "BYTES")], "no targets"),
    ([Tensor.from_numpy("nodes", np.array([1]))], "unexpected input"),
    ([Tensor.from_numpy("node/u/ids", np.array([b"a"], dtype=object), "BYTES"),
      Tensor.from_numpy("target/u", np.array([0.0]))], "integer"),
])
def test_contract_violations_are_invalid_input(tensors: list[Tensor], fragment: str) -> None:
    with pytest.raises(GatewayError, match=fragment) as caught:
        GraphTensors.from_tensors(tensors)
    assert caught.value.kind is ErrorKind.INVALID_INPUT


# --- the builtin GNN ---------------------------------------------------------------------------------


def gnn_outputs(payload: dict[str, Any], settings: GnnSettings | None = None, task: str = "node_classification",
                tasks: tuple[str, ...] = NODE_TASKS) -> dict[str, np.ndarray]:
    invocation = decode(payload, tasks=tasks)
    request = InferRequest("gnn", inputs=invocation.graph.to_tensors(), parameters={"gml_task": task})
    return {t.name: t.data for t in GnnModel(settings or GnnSettings()).infer(request)}


def test_gnn_is_deterministic_and_uses_neighbours() -> None:
    first = gnn_outputs(movielens())
    assert set(first) == {"prediction/user", "prediction/movie"}
    np.testing.assert_array_equal(first["prediction/movie"], gnn_outputs(movielens())["prediction/movie"])
    np.testing.assert_allclose(first["prediction/movie"].sum(axis=1), 1.0, rtol=1e-6)
    # m2's only neighbour is a1: changing a1's features changes m2's prediction.
    moved = changed(movielens(), lambda p: node(p, "a1")["features"].update(feat=[5.0, -5.0]))
    assert not np.allclose(gnn_outputs(moved)["prediction/movie"], first["prediction/movie"])
    other_seed = gnn_outputs(movielens(), GnnSettings(seed=1))
    assert not np.allclose(other_seed["prediction/movie"], first["prediction/movie"])


def test_gnn_refuses_features_too_wide_for_its_weights() -> None:
    wide = changed(movielens(), lambda p: node(p, "a1")["features"].update(feat=[0.0] * 5000))
    with pytest.raises(GatewayError, match="at most 4096") as caught:
        GnnModel(GnnSettings()).infer(InferRequest("gnn", inputs=decode(wide, schema=None).graph.to_tensors()))
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    with pytest.raises(ConfigError, match="hidden: must be at most 1024"):
        parse_config({**config_with({}), "upstreams": [{"name": "local", "protocol": "builtin",
                                                        "gnn": {"hidden": 100000}}]})


def test_gnn_classes_regression_and_edges() -> None:
    assert gnn_outputs(movielens(), GnnSettings(num_classes=5))["prediction/movie"].shape == (2, 5)
    regression = gnn_outputs(movielens(), task="node_regression")
    assert regression["prediction/movie"].shape == (2, 1)
    edges = changed(movielens(), lambda p: p.update(gml_task="edge_regression", targets=[
        {"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m2"}]))
    out = gnn_outputs(edges, task="edge_regression", tasks=ALL_TASKS)
    assert out["prediction/user/rating/movie"].shape == (1, 1)


# --- configuration -----------------------------------------------------------------------------------


def config_with(options: Any) -> dict[str, Any]:
    return {"listeners": [{"name": "gs", "protocol": "graphstorm", "address": "127.0.0.1:0"}],
            "upstreams": [{"name": "local", "protocol": "builtin", "gnn": {"num_classes": 3}}],
            "routes": [{"match": {"listener": "gs"}, "upstream": "local", "options": options}]}


def test_route_options_load_the_schema(tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text(MOVIELENS_SCHEMA.read_text())
    config = parse_config(config_with({"graphstorm": {"graph_schema": "schema.json", "edge_tasks": True},
                                       "note": "kept"}), base_dir=tmp_path)
    options = route_options(config.routes[0].options)
    assert options.schema is not None and options.schema.node_types == ("user", "movie")
    assert options.tasks == ALL_TASKS
    assert config.routes[0].options["note"] == "kept"
    shipped = route_options(parse_config(config_with({"graphstorm": {"graph_schema": "builtin:movielens"}}))
                            .routes[0].options).schema
    assert shipped is not None
    assert (shipped.node_features, shipped.edge_features) == (SCHEMA.node_features, SCHEMA.edge_features)
    assert route_options({}) == RouteOptions()


@pytest.mark.parametrize(("schema", "fragment"), [
    ("missing.json", "routes[0].options.graphstorm.graph_schema: cannot read graph schema missing.json"),
    ("builtin:nope", "unknown builtin graph schema"),
    ({"nodes": [{"node_type": "a", "features": [{"feature_name": "f", "feature_dim": "x"}]}]},
     "nodes[0].features[0].feature_dim: must be a list of positive integers"),
    ({"nodes": [{"features": []}]}, "nodes[0].node_type: is required"),
    ({"nodes": [{"node_type": "a"}], "edges": [{"relation": ["a", "r"]}]}, "edges[0].relation: must be a list"),
    ({"nodes": [{"node_type": "a", "features": [{"feature_col": ["x", "y"]}]}]}, "needs a feature_name"),
    ({"nodes": [{"node_type": "a", "features": [{"feature_name": "f"}]},
                {"node_type": "a", "features": [{"feature_name": "f"}]}]}, "declared twice"),
    ("not json", "not a usable graph schema"),
])
def test_bad_schemas_are_config_errors(tmp_path: Path, schema: Any, fragment: str) -> None:
    path = "missing.json"
    if isinstance(schema, dict):
        (tmp_path / "s.json").write_text(json.dumps(schema))
        path = "s.json"
    elif schema == "not json":
        (tmp_path / "s.json").write_text("{nope")
        path = "s.json"
    elif schema.startswith("builtin:"):
        path = schema
    with pytest.raises(ConfigError) as caught:
        parse_config(config_with({"graphstorm": {"graph_schema": path}}), base_dir=tmp_path)
    assert any(fragment in problem for problem in caught.value.problems), caught.value.problems
    assert all(problem.startswith("routes[0].options.graphstorm") for problem in caught.value.problems)


def test_the_default_config_serves_graphstorm_on_8080_with_the_movielens_schema() -> None:
    config = load_config(None)
    listener = next(x for x in config.listeners if x.protocol == "graphstorm")
    assert listener.address.port == 8080
    route = next(r for r in config.routes if r.match.listener == listener.name)
    schema = route_options(route.options).schema
    assert schema is not None and schema.node_types == ("user", "movie")


def test_unknown_route_option_keys_are_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config_with({"graphstorm": {"graph_shema": "x"}}))
    assert caught.value.problems == ["routes[0].options.graphstorm.graph_shema: unknown key"]


# --- a large payload (its speed: bench/graphstorm_payload.py) ----------------------------------------


def test_large_payload_decodes_whole() -> None:
    body = orjson.dumps(large_movielens())
    invocation = decode(body)
    tensors = invocation.graph.to_tensors()
    sizes = {t.name: t.shape for t in tensors}
    assert sizes["node/user/ids"] == (5000,) and sizes["node/movie/feature/title"] == (5000, 1)
    assert sizes["edge/user/rating/movie/index"] == (2, 25000)
    assert uid(body) == codec.request_uid(body)
