"""``gnn``: a small deterministic heterogeneous GNN over the graph tensor
contract (see ``gateway/core/graphtensors.py``).

One layer: each node type's features are projected to a hidden vector
(text features through a hash embedding), then every node adds the mean of
its in-neighbours' vectors per relation, each relation with its own weights;
a linear head gives softmax probabilities over ``num_classes`` (classification)
or one value (regression). Weights are drawn from a generator seeded by
``seed`` and the names involved (node type, feature, relation), so any schema
works, answers are reproducible, and nothing is trained: it is a stand-in
for a real GNN, useful to exercise the whole path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from gateway.config.node import Node
from gateway.core.errors import invalid
from gateway.core.graphtensors import (
    CONTRACT,
    CONTRACT_PARAMETER,
    EDGE_TASKS,
    NODE_TASKS,
    TASK_PARAMETER,
    GraphTensors,
    prediction_name,
)
from gateway.core.types import InferRequest, Tensor, TensorSpec
from gateway.protocols.builtin.models import BuiltinModel

TEXT_EMBEDDING = 16  # bytes of sha256 used per string
# Weights are generated per request from the feature width: bound it so a
# payload cannot make the model allocate gigabytes of weights.
MAX_FEATURE_WIDTH = 4096


@dataclass(frozen=True, slots=True)
class GnnSettings:
    num_classes: int = 2
    hidden: int = 16
    seed: int = 0


def parse_gnn_settings(node: Node) -> GnnSettings:
    if node.value is None:
        return GnnSettings()
    settings = GnnSettings(node.integer("num_classes", 2, minimum=2), node.integer("hidden", 16, minimum=1),
                           node.integer("seed", 0, minimum=0))
    for key, most in (("num_classes", 10000), ("hidden", 1024)):
        if isinstance(getattr(settings, key), int) and getattr(settings, key) > most:
            node.error(f"must be at most {most}", key)
    node.check_no_unknown_keys()
    return settings


class GnnModel(BuiltinModel):
    name = "gnn"
    any_datatype = True

    def __init__(self, settings: GnnSettings = GnnSettings()) -> None:
        self.settings = settings
        # Metadata cannot list inputs whose names depend on the graph: these
        # entries show the name patterns; the parameter names the contract.
        self.inputs = (
            TensorSpec("node/{type}/ids", "BYTES", (-1,), {CONTRACT_PARAMETER: CONTRACT}),
            TensorSpec("node/{type}/feature/{name}", "FP32", (-1, -1), {CONTRACT_PARAMETER: CONTRACT}),
            TensorSpec("edge/{src}/{rel}/{dst}/index", "INT64", (2, -1), {CONTRACT_PARAMETER: CONTRACT}),
            TensorSpec("target/{type}", "INT64", (-1,), {CONTRACT_PARAMETER: CONTRACT}),
        )
        self.outputs = (TensorSpec("prediction/{type}", "FP32", (-1, settings.num_classes),
                                   {CONTRACT_PARAMETER: CONTRACT}),)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        return self.predict(list(inputs.values()), NODE_TASKS[0])

    def check_request(self, request: InferRequest) -> None:
        """Its inputs are a graph's, checked by the task (:meth:`predict`)."""

    def infer(self, request: InferRequest) -> list[Tensor]:
        # The task is a request parameter (gml_task); node classification by default.
        return self.predict(request.inputs, request.parameters.get(TASK_PARAMETER, NODE_TASKS[0]))

    def predict(self, inputs: list[Tensor], task: object) -> list[Tensor]:
        if task not in NODE_TASKS + EDGE_TASKS:
            raise invalid(f"parameter '{TASK_PARAMETER}' must be one of {', '.join(NODE_TASKS + EDGE_TASKS)}")
        graph = GraphTensors.from_tensors(inputs)
        edge_task = task in EDGE_TASKS
        if (graph.edge_targets if not edge_task else graph.node_targets):
            raise invalid(f"task {task} takes {'edge' if edge_task else 'node'} targets only")
        width = 1 if str(task).endswith("regression") else self.settings.num_classes
        hidden = self._propagate(graph, {t: self._embed(graph, t) for t in graph.node_ids})
        outputs: list[Tensor] = []
        for node_type, positions in graph.node_targets.items():
            logits = hidden[node_type][positions] @ self._weight(width, "head", node_type)
            outputs.append(self._output(prediction_name(node_type), logits, width))
        for relation, pairs in graph.edge_targets.items():
            joined = np.concatenate([hidden[relation[0]][pairs[0]], hidden[relation[2]][pairs[1]]], axis=1)
            logits = joined @ self._weight(width, "edge-head", *relation, rows=2 * self.settings.hidden)
            outputs.append(self._output(prediction_name(relation), logits, width))
        return outputs

    def _output(self, name: str, logits: np.ndarray, width: int) -> Tensor:
        values = logits.astype(np.float64)
        if width > 1:  # softmax, stable
            values = np.exp(values - values.max(axis=1, keepdims=True))
            values /= values.sum(axis=1, keepdims=True)
        return Tensor.from_numpy(name, values.astype(np.float32), "FP32")

    def _embed(self, graph: GraphTensors, node_type: str) -> np.ndarray:
        count = graph.node_count(node_type)
        hidden = self.settings.hidden
        total = np.broadcast_to(self._weight(hidden, "bias", node_type, rows=1), (count, hidden))
        for name, values in graph.node_features.get(node_type, {}).items():
            matrix = _text_embedding(values) if values.dtype == object else values.reshape(count, -1)
            if matrix.shape[1] > MAX_FEATURE_WIDTH:
                raise invalid(f"feature '{name}' of node type '{node_type}' has {matrix.shape[1]} values per node; "
                              f"the builtin gnn takes at most {MAX_FEATURE_WIDTH}")
            total = total + matrix @ self._weight(self.settings.hidden, "feature", node_type, name,
                                                  rows=matrix.shape[1])
        return np.tanh(total).astype(np.float32)

    def _propagate(self, graph: GraphTensors, h0: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One layer of per-relation mean aggregation, then ReLU."""
        out = {t: h @ self._weight(self.settings.hidden, "self", t) for t, h in h0.items()}
        for relation, index in graph.edge_index.items():
            src_type, _, dst_type = relation
            count = graph.node_count(dst_type)
            messages = h0[src_type][index[0]] @ self._weight(self.settings.hidden, "relation", *relation)
            summed = np.zeros((count, self.settings.hidden), dtype=np.float32)
            np.add.at(summed, index[1], messages)
            degree = np.bincount(index[1], minlength=count).astype(np.float32)
            out[dst_type] = out[dst_type] + summed / np.maximum(degree, 1.0)[:, None]
        return {t: np.maximum(h, 0.0) for t, h in out.items()}

    def _weight(self, columns: int, *names: str, rows: int | None = None) -> np.ndarray:
        """A fixed matrix [rows, columns] for ``names`` (rows default: hidden)."""
        rows = self.settings.hidden if rows is None else rows
        key = "\0".join((str(self.settings.seed), *names, f"{rows}x{columns}")).encode("utf-8", "surrogatepass")
        seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
        matrix = np.random.default_rng(seed).standard_normal((rows, columns))
        return (matrix / np.sqrt(max(rows, 1))).astype(np.float32)


def _text_embedding(values: np.ndarray) -> np.ndarray:
    """Strings as fixed vectors in [-1, 1] from their sha256 (deterministic)."""
    digests = b"".join(hashlib.sha256(bytes(v)).digest()[:TEXT_EMBEDDING] for v in values.reshape(-1))
    raw = np.frombuffer(digests, dtype=np.uint8).reshape(len(values), -1).astype(np.float32)
    return raw / 127.5 - 1.0
