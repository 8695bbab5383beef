"""Where the time goes for one large GraphStorm payload, in-process.

    .venv/bin/python bench/graphstorm_payload.py [--users 5000 --movies 5000 --edges 50000 --repeat 5]

Prints the best time of each stage: JSON parsing (with the collector paused,
as the listener does), validation into graph tensors, the builtin gnn, and
encoding the answer. The end-to-end time over a socket is printed by
``pytest -s tests/test_graphstorm_gateway.py -k large``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from graphstorm_payloads import MOVIELENS_SCHEMA, large_movielens  # noqa: E402

from gateway.core.graphtensors import NODE_TASKS  # noqa: E402
from gateway.core.types import InferRequest  # noqa: E402
from gateway.protocols.builtin.gnn import GnnModel, GnnSettings  # noqa: E402
from gateway.protocols.graphstorm import codec  # noqa: E402
from gateway.protocols.graphstorm.frontend import gc_paused  # noqa: E402
from gateway.protocols.graphstorm.schema import parse_schema  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--movies", type=int, default=5000)
    parser.add_argument("--edges", type=int, default=50000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    schema = parse_schema(json.loads(MOVIELENS_SCHEMA.read_text()), "movielens", [])
    body = orjson.dumps(large_movielens(args.users, args.movies, args.edges))
    model = GnnModel(GnnSettings(num_classes=2))
    best: dict[str, float] = {}

    def timed(stage: str, started: float) -> float:
        now = time.perf_counter()
        best[stage] = min(best.get(stage, float("inf")), now - started)
        return now

    for _ in range(args.repeat):
        started = time.perf_counter()
        with gc_paused():
            payload = codec.parse_json(body)
        started = timed("parse JSON", started)
        with gc_paused():
            invocation = codec.decode_invocation(payload, schema, NODE_TASKS)
            tensors = invocation.graph.to_tensors()
        started = timed("validate -> tensors", started)
        outputs = model.infer(InferRequest("gnn", inputs=tensors, parameters={"gml_task": "node_classification"}))
        started = timed("builtin gnn", started)
        codec.encode_results(invocation, outputs, codec.request_uid(body))
        timed("encode answer (incl. sha256)", started)
    print(f"payload: {args.users + args.movies} nodes, {args.edges} edges, {len(body) / 1e6:.1f} MB; "
          f"best of {args.repeat}")
    for stage, seconds in best.items():
        print(f"  {stage:30s} {seconds * 1000:7.1f} ms")
    print(f"  {'total':30s} {sum(best.values()) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
