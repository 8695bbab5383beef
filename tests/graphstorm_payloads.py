"""GraphStorm test payloads: the real MovieLens one (with targets added) and
large synthetic ones of the same schema; and ``invoke``, what a GraphStorm
client sends (plain HTTP, as ``invoke_endpoint`` does)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import orjson
import requests

from support import GatewayProcess

JSON = {"Content-Type": "application/json"}
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
DATA = Path(__file__).resolve().parent / "data" / "graphstorm"
MOVIELENS_SCHEMA = DATA / "movielens_gconstruct_runtime.json"


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def movielens(targets: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """The real MovieLens payload; the targets default to m2, a1, m1."""
    payload = load("movielens_realtime_payload.json")
    chosen = targets if targets is not None else [("movie", "m2"), ("user", "a1"), ("movie", "m1")]
    payload["targets"] = [{"node_type": t, "node_id": i} for t, i in chosen]
    return payload


def changed(payload: dict[str, Any], change: Any) -> dict[str, Any]:
    """A deep copy of ``payload`` after ``change(copy)``."""
    result = copy.deepcopy(payload)
    change(result)
    return result


def uid(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[-16:]


def large_movielens(users: int = 5000, movies: int = 5000, edges: int = 50000, targets: int = 100,
                    seed: int = 7) -> dict[str, Any]:
    """A MovieLens-schema payload of ``users + movies`` nodes and ``edges``
    edges (half rating, half rating-rev), reproducible from ``seed``."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = [
        {"node_type": "user", "node_id": f"u{i}", "features": {"feat": [rng.random(), rng.random()]}}
        for i in range(users)]
    nodes += [{"node_type": "movie", "node_id": f"m{i}",
               "features": {"feat": [rng.random(), rng.random()], "title": f"movie title {i}"}}
              for i in range(movies)]
    links: list[dict[str, Any]] = []
    for k in range(edges):
        user, movie = f"u{rng.randrange(users)}", f"m{rng.randrange(movies)}"
        if k % 2:
            links.append({"edge_type": ["movie", "rating-rev", "user"], "src_node_id": movie, "dest_node_id": user,
                          "features": {}})
        else:
            links.append({"edge_type": ["user", "rating", "movie"], "src_node_id": user, "dest_node_id": movie,
                          "features": {}})
    chosen = [{"node_type": "movie", "node_id": f"m{rng.randrange(movies)}"} for _ in range(targets)]
    return {"version": "gs-realtime-v0.1", "gml_task": "node_classification",
            "graph": {"nodes": nodes, "edges": links}, "targets": chosen}


def invoke(gateway: GatewayProcess, http: requests.Session, body: bytes | dict[str, Any], model: str | None = None,
           headers: dict[str, str] | None = None) -> tuple[dict[str, Any], bytes]:
    """POST /invocations to the gateway's ``gs`` listener, routed to ``model``
    by SageMaker's target-model header; the envelope and the bytes sent."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    sent = {**JSON, **({TARGET_MODEL: model} if model else {}), **(headers if headers is not None else {})}
    reply = http.post(f"http://{gateway.url('gs')}/invocations", data=data, headers=sent, timeout=60)
    assert reply.status_code == 200, reply.text  # GraphStorm's answer is always HTTP 200
    assert reply.headers["Content-Type"].startswith("application/json")
    answer = reply.json()
    assert list(answer) == ["status_code", "request_uid", "message", "error", "data"]
    return answer, data
