"""GraphStorm client -> gateway -> V2 upstreams, over real sockets and peers.

Two gateway processes: the *front* one has the ``graphstorm`` listener; the
*back* one serves the builtin ``gnn`` on V2 REST and gRPC listeners (as any
V2 server would). Routes of the front (picked by SageMaker's target-model
header) reach the gnn directly (the reference answer), through a ``v2-rest``
or a ``v2-grpc`` hop to the back gateway, and MLServer's ``gnn_sums``
(tests/peers/mlserver_models), a model written against the documented graph
tensor contract whose answer this test recomputes from the payload alone.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from graphstorm_payloads import MOVIELENS_SCHEMA, changed, invoke, large_movielens, movielens, uid

from peers.mlserver import MLServerPeer
from support import GatewayProcess, write_config

HOPS = ["rest", "grpc"]
TASKS = ["node_classification", "node_regression"]
GNN_SUMS_TEMPERATURE = 10.0  # as in tests/peers/mlserver_models/gnn_sums.py

BACK = """
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, gnn: {{num_classes: 3}}}}
  - {{name: mls, protocol: v2-rest, endpoints: ["{mls_rest}"]}}
routes:
  - {{match: {{model: gnn_sums}}, upstream: mls}}
  - {{match: {{model: "*"}}, upstream: local}}
"""

FRONT = """
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, gnn: {{num_classes: 3}}}}
  - {{name: back-rest, protocol: v2-rest, endpoints: ["127.0.0.1:{back_rest}"]}}
  - {{name: back-grpc, protocol: v2-grpc, endpoints: ["127.0.0.1:{back_grpc}"]}}
  - {{name: mls-rest, protocol: v2-rest, endpoints: ["{mls_rest}"]}}
  - {{name: mls-grpc, protocol: v2-grpc, endpoints: ["{mls_grpc}"]}}
routes:
  - {{match: {{model: gnn}}, upstream: local, options: {{graphstorm: {{graph_schema: "{schema}"}}}}}}
  - {{match: {{model: gnn-open}}, upstream: local, rewrite: {{model: gnn}}}}
  - match: {{model: gnn-rest}}
    upstream: back-rest
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: gnn-grpc}}
    upstream: back-grpc
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: gnn-edges}}
    upstream: local
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}", edge_tasks: true}}}}
  - match: {{model: gnn-edges-rest}}
    upstream: back-rest
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}", edge_tasks: true}}}}
  - match: {{model: gnn-edges-grpc}}
    upstream: back-grpc
    rewrite: {{model: gnn}}
    options: {{graphstorm: {{graph_schema: "{schema}", edge_tasks: true}}}}
  - {{match: {{model: gnn-open-rest}}, upstream: back-rest, rewrite: {{model: gnn}}}}
  - {{match: {{model: gnn-open-grpc}}, upstream: back-grpc, rewrite: {{model: gnn}}}}
  - match: {{model: sums-rest}}
    upstream: mls-rest
    rewrite: {{model: gnn_sums}}
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - match: {{model: sums-grpc}}
    upstream: mls-grpc
    rewrite: {{model: gnn_sums}}
    options: {{graphstorm: {{graph_schema: "{schema}"}}}}
  - {{match: {{model: sums-open-rest}}, upstream: mls-rest, rewrite: {{model: gnn_sums}}}}
  - {{match: {{model: sums-open-grpc}}, upstream: mls-grpc, rewrite: {{model: gnn_sums}}}}
  - {{match: {{model: sums-two-hops}}, upstream: back-grpc, rewrite: {{model: gnn_sums}}}}
  - {{match: {{model: missing-grpc}}, upstream: mls-grpc, rewrite: {{model: no_such_model}}}}
"""


@pytest.fixture(scope="module")
def back(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("gs-back")
    text = BACK.format(mls_rest=mlserver.rest_address)
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def front(mlserver: MLServerPeer, back: GatewayProcess,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("gs-front")
    text = FRONT.format(back_rest=back.ports["rest"], back_grpc=back.ports["grpc"], mls_rest=mlserver.rest_address,
                        mls_grpc=mlserver.grpc_address, schema=MOVIELENS_SCHEMA)
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def odd_names() -> dict[str, Any]:
    """Types, relations and features whose names hold '/' and '%' (escaped
    in tensor names), an integer node id, text and scalar features."""
    nodes = [
        {"node_type": "team/a", "node_id": "x1", "features": {"size/raw": [1.0, 2.0], "note": "h\u00e9llo"}},
        {"node_type": "team/a", "node_id": 7, "features": {"size/raw": [0.5, -1.0], "note": "ok"}},
        {"node_type": "50%", "node_id": "p", "features": {"w%2F": 3.0}},
    ]
    edges = [
        {"edge_type": ["team/a", "to/from", "50%"], "src_node_id": "x1", "dest_node_id": "p", "features": {}},
        {"edge_type": ["team/a", "to/from", "50%"], "src_node_id": 7, "dest_node_id": "p", "features": {}},
        {"edge_type": ["50%", "back%", "team/a"], "src_node_id": "p", "dest_node_id": 7, "features": {}},
    ]
    targets = [{"node_type": "50%", "node_id": "p"}, {"node_type": "team/a", "node_id": 7},
               {"node_type": "team/a", "node_id": "x1"}]
    return {"version": "gs-realtime-v0.1", "gml_task": "node_classification",
            "graph": {"nodes": nodes, "edges": edges}, "targets": targets}


def medium_movielens() -> dict[str, Any]:
    """A MovieLens-schema graph of 50 nodes and 160 edges; movie targets
    (some named twice) and user targets."""
    payload = large_movielens(users=20, movies=30, edges=160, targets=12, seed=11)
    payload["targets"] += [{"node_type": "user", "node_id": f"u{i}"} for i in (3, 0, 19)]
    return payload


def with_task(payload: dict[str, Any], task: str) -> dict[str, Any]:
    return changed(payload, lambda p: p.update(gml_task=task))


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["status_code"] == 200, answer
    return answer


# --- (a), (b): the builtin gnn behind a V2 REST or gRPC hop ------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("hop", HOPS)
def test_gnn_behind_a_v2_hop_answers_as_the_direct_route(front: GatewayProcess, http: requests.Session,
                                                         hop: str, task: str) -> None:
    for payload in (with_task(movielens(), task), with_task(medium_movielens(), task)):
        direct, body = invoke(front, http, payload, model="gnn")
        hopped, _ = invoke(front, http, payload, model=f"gnn-{hop}")
        assert ok(hopped) == ok(direct)  # predictions, order, request_uid, message: all equal
        assert hopped["request_uid"] == uid(body)
        width = 3 if task == "node_classification" else 1  # gml_task crossed the hop
        assert {len(r["prediction"]) for r in hopped["data"]["results"]} == {width}


@pytest.mark.parametrize("task", ["edge_classification", "edge_regression"])
@pytest.mark.parametrize("hop", HOPS)
def test_edge_tasks_behind_a_v2_hop(front: GatewayProcess, http: requests.Session, hop: str, task: str) -> None:
    """Edge targets travel as target/{src}/{rel}/{dst} [2, T] and come back as
    prediction/{src}/{rel}/{dst}."""
    payload = changed(movielens(), lambda p: p.update(gml_task=task, targets=[
        {"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m2"},
        {"edge_type": ["movie", "rating-rev", "user"], "src_node_id": "m1", "dest_node_id": "a1"},
        {"edge_type": ["user", "rating", "movie"], "src_node_id": "a1", "dest_node_id": "m1"}]))
    direct, _ = invoke(front, http, payload, model="gnn-edges")
    hopped, _ = invoke(front, http, payload, model=f"gnn-edges-{hop}")
    assert ok(hopped) == ok(direct)
    assert len(hopped["data"]["results"]) == 3


@pytest.mark.parametrize("hop", HOPS)
def test_escaped_names_survive_a_v2_hop(front: GatewayProcess, http: requests.Session, hop: str) -> None:
    """The builtin gnn seeds its weights from type, relation and feature
    names: a name changed on the way would change the answer."""
    direct, _ = invoke(front, http, odd_names(), model="gnn-open")
    hopped, _ = invoke(front, http, odd_names(), model=f"gnn-open-{hop}")
    assert ok(hopped) == ok(direct)
    assert [(r["node_type"], r["node_id"]) for r in hopped["data"]["results"]] == [
        ("team/a", 7), ("team/a", "x1"), ("50%", "p")]


# --- (c): a model on MLServer written against the graph tensor contract --------------------------------


def _feature_total(value: Any) -> float:
    if isinstance(value, str):
        return float(len(value.encode()))
    if isinstance(value, list):
        return float(sum(_feature_total(v) for v in value))
    return float(value)


def gnn_sums_reference(payload: dict[str, Any]) -> list[tuple[str, Any, list[float]]]:
    """What gnn_sums must answer, computed from the GraphStorm payload (not
    from tensors): (node_type, node_id, prediction) in GraphStorm's order —
    grouped by node type in order of first appearance, targets in order."""
    score: dict[tuple[str, str], float] = {}
    type_order: list[str] = []
    for node in payload["graph"]["nodes"]:
        if node["node_type"] not in type_order:
            type_order.append(node["node_type"])
        key = (node["node_type"], str(node["node_id"]))
        score[key] = sum(_feature_total(v) for v in node.get("features", {}).values())
    source_sum: dict[tuple[str, str], float] = defaultdict(float)
    degree: dict[tuple[str, str], int] = defaultdict(int)
    for edge in payload["graph"]["edges"]:
        src_type, _, dst_type = edge["edge_type"]
        dst = (dst_type, str(edge["dest_node_id"]))
        source_sum[dst] += score[(src_type, str(edge["src_node_id"]))]
        degree[dst] += 1
    results = []
    for node_type in type_order:
        for target in payload["targets"]:
            if target["node_type"] != node_type:
                continue
            key = (node_type, str(target["node_id"]))
            mean = source_sum[key] / max(degree[key], 1)
            if payload["gml_task"] == "node_regression":
                prediction = [score[key] + mean]
            else:
                logits = [v / GNN_SUMS_TEMPERATURE for v in (score[key], mean, degree[key])]
                top = max(logits)
                exps = [math.exp(v - top) for v in logits]
                prediction = [e / sum(exps) for e in exps]
            results.append((node_type, target["node_id"], prediction))
    return results


def assert_gnn_sums_answer(answer: dict[str, Any], payload: dict[str, Any]) -> None:
    got = ok(answer)["data"]["results"]
    expected = gnn_sums_reference(payload)
    assert [(r["node_type"], r["node_id"]) for r in got] == [(t, i) for t, i, _ in expected]
    for result, (_, _, prediction) in zip(got, expected, strict=True):
        # The model sums FP32 features; the reference sums the JSON's float64 values.
        np.testing.assert_allclose(result["prediction"], prediction, rtol=1e-5, atol=1e-6)


# The docs' worked example (docs/graphstorm.md), as MLServer received it.
MOVIELENS_TENSORS = [
    ["node/user/ids", "BYTES", [1]], ["node/user/feature/feat", "FP32", [1, 2]],
    ["node/movie/ids", "BYTES", [2]], ["node/movie/feature/feat", "FP32", [2, 2]],
    ["node/movie/feature/title", "BYTES", [2, 1]],
    ["edge/movie/rating-rev/user/index", "INT64", [2, 1]], ["edge/user/rating/movie/index", "INT64", [2, 2]],
    ["target/user", "INT64", [1]], ["target/movie", "INT64", [2]],
]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("hop", HOPS)
def test_mlserver_model_on_the_tensor_contract(front: GatewayProcess, http: requests.Session,
                                               mlserver: MLServerPeer, hop: str, task: str) -> None:
    for payload in (with_task(movielens(), task), with_task(medium_movielens(), task)):
        seen = len(mlserver.calls("gnn_sums"))
        answer, body = invoke(front, http, payload, model=f"sums-{hop}")
        assert_gnn_sums_answer(answer, payload)
        assert answer["request_uid"] == uid(body)
        (call,) = mlserver.calls("gnn_sums")[seen:]
        assert call["id"] == uid(body)  # the V2 request id is the request_uid
        assert call["parameters"] == {"gml_task": task, "graph_contract": "graphstorm-tensors-v1"}
    assert mlserver.calls("gnn_sums")[-2]["inputs"] == MOVIELENS_TENSORS


@pytest.mark.parametrize("hop", HOPS)
def test_mlserver_model_with_escaped_names(front: GatewayProcess, http: requests.Session,
                                           mlserver: MLServerPeer, hop: str) -> None:
    payload = odd_names()
    answer, _ = invoke(front, http, payload, model=f"sums-open-{hop}")
    assert_gnn_sums_answer(answer, payload)
    names = [name for name, _, _ in mlserver.calls("gnn_sums")[-1]["inputs"]]
    assert names == ["node/team%2Fa/ids", "node/team%2Fa/feature/size%2Fraw", "node/team%2Fa/feature/note",
                     "node/50%25/ids", "node/50%25/feature/w%252F", "edge/team%2Fa/to%2Ffrom/50%25/index",
                     "edge/50%25/back%25/team%2Fa/index", "target/team%2Fa", "target/50%25"]


def test_request_uid_is_the_v2_id_across_two_hops(front: GatewayProcess, http: requests.Session,
                                                  mlserver: MLServerPeer) -> None:
    """GraphStorm client -> front -> v2-grpc -> back -> v2-rest -> MLServer."""
    payload = with_task(medium_movielens(), "node_regression")
    answer, body = invoke(front, http, payload, model="sums-two-hops")
    assert_gnn_sums_answer(answer, payload)
    call = mlserver.calls("gnn_sums")[-1]
    assert call["id"] == answer["request_uid"] == uid(body)
    assert call["parameters"]["gml_task"] == "node_regression"


def test_upstream_refusal_is_a_500_envelope(front: GatewayProcess, http: requests.Session) -> None:
    answer, body = invoke(front, http, movielens(), model="missing-grpc")
    assert (answer["status_code"], answer["request_uid"], answer["data"]) == (500, uid(body), {})
    assert "no_such_model" in answer["error"]


def test_gateway_logs_are_clean(front: GatewayProcess, back: GatewayProcess) -> None:
    assert "Traceback" not in front.log() + back.log()
