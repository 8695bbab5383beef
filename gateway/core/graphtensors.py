"""The canonical tensor form of a GraphStorm graph payload.

This is the public contract between the gateway and GNN models served on
Open Inference Protocol (V2) servers and the builtin ``gnn`` model, so it
lives beside the canonical types, not in one protocol; docs/graphstorm.md
describes it for model authors. Tensor names are ``/``-separated paths
whose components are node types, relation names and feature names with
``%`` and ``/`` escaped as ``%25`` and ``%2F``:

=====================================  ======  =========  =========================
name                                   type    shape      meaning
=====================================  ======  =========  =========================
``node/{type}/ids``                    BYTES   [N]        node ids, numbered per type
                                                          by first appearance
``node/{type}/feature/{name}``         FP32    [N, *dim]  numeric feature
                                       BYTES   [N, 1]     text feature (UTF-8)
``edge/{src}/{rel}/{dst}/index``       INT64   [2, E]     row 0 indexes ``src`` nodes,
                                                          row 1 ``dst`` nodes
``edge/{src}/{rel}/{dst}/feature/{n}`` FP32    [E, *dim]  edge feature (or BYTES [E, 1])
``target/{type}``                      INT64   [T]        node targets (node tasks)
``target/{src}/{rel}/{dst}``           INT64   [2, T]     edge targets (edge tasks)
=====================================  ======  =========  =========================

The request parameter ``gml_task`` names the task. The model answers one
output per target tensor, ``prediction/{...}`` with the same suffix, FP32
``[T, K]``: class probabilities (K classes) or one regression value (K=1),
rows in target order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gateway.core.errors import invalid
from gateway.core.types import Tensor

Relation = tuple[str, str, str]

CONTRACT = "graphstorm-tensors-v1"  # request parameter ``graph_contract``
TASK_PARAMETER = "gml_task"
CONTRACT_PARAMETER = "graph_contract"
NODE_TASKS = ("node_classification", "node_regression")
EDGE_TASKS = ("edge_classification", "edge_regression")


def escape(component: str) -> str:
    return component.replace("%", "%25").replace("/", "%2F")


_ESCAPED = re.compile(r"%(?:25|2[Ff])")


def unescape(component: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(0) == "%25" else "/", component)


def join(*components: str) -> str:
    return "/".join(escape(c) for c in components)


def node_ids_name(node_type: str) -> str:
    return "node/" + escape(node_type) + "/ids"


def node_feature_name(node_type: str, feature: str) -> str:
    return "node/" + escape(node_type) + "/feature/" + escape(feature)


def edge_index_name(relation: Relation) -> str:
    return "edge/" + join(*relation) + "/index"


def edge_feature_name(relation: Relation, feature: str) -> str:
    return "edge/" + join(*relation) + "/feature/" + escape(feature)


def target_name(key: str | Relation) -> str:
    return "target/" + (escape(key) if isinstance(key, str) else join(*key))


def prediction_name(key: str | Relation) -> str:
    return "prediction/" + (escape(key) if isinstance(key, str) else join(*key))


@dataclass(slots=True)
class GraphTensors:
    """One graph with its targets, as numpy arrays (see the module doc)."""

    node_ids: dict[str, np.ndarray] = field(default_factory=dict)  # object array of bytes [N]
    node_features: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    edge_index: dict[Relation, np.ndarray] = field(default_factory=dict)  # int64 [2, E]
    edge_features: dict[Relation, dict[str, np.ndarray]] = field(default_factory=dict)
    node_targets: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [T]
    edge_targets: dict[Relation, np.ndarray] = field(default_factory=dict)  # int64 [2, T]

    def node_count(self, node_type: str) -> int:
        ids = self.node_ids.get(node_type)
        return 0 if ids is None else len(ids)

    def to_tensors(self) -> list[Tensor]:
        """Tensors in a stable order: nodes, edges, then targets."""
        out: list[Tensor] = []
        for node_type, ids in self.node_ids.items():
            out.append(_tensor(node_ids_name(node_type), ids))
            for name, values in self.node_features.get(node_type, {}).items():
                out.append(_tensor(node_feature_name(node_type, name), values))
        for relation, index in self.edge_index.items():
            out.append(_tensor(edge_index_name(relation), index))
            for name, values in self.edge_features.get(relation, {}).items():
                out.append(_tensor(edge_feature_name(relation, name), values))
        for node_type, targets in self.node_targets.items():
            out.append(_tensor(target_name(node_type), targets))
        for relation, pairs in self.edge_targets.items():
            out.append(_tensor(target_name(relation), pairs))
        return out

    @classmethod
    def from_tensors(cls, tensors: Iterable[Tensor]) -> GraphTensors:
        """Parse and check tensors named per the contract (INVALID_INPUT on
        unknown names, inconsistent sizes or indices out of range)."""
        graph = cls()
        features: list[tuple[str | Relation, str, Tensor]] = []
        indexes: list[tuple[Relation, Tensor]] = []
        targets: list[tuple[str | Relation, Tensor]] = []
        for tensor in tensors:
            parts = [unescape(p) for p in tensor.name.split("/")]
            head, count = parts[0], len(parts)
            if head == "node" and count == 3 and parts[2] == "ids":
                if parts[1] in graph.node_ids:
                    raise invalid(f"input '{tensor.name}' is given twice")
                graph.node_ids[parts[1]] = _ids(tensor)
            elif head == "node" and count == 4 and parts[2] == "feature":
                features.append((parts[1], parts[3], tensor))
            elif head == "edge" and count == 5 and parts[4] == "index":
                indexes.append(((parts[1], parts[2], parts[3]), tensor))
            elif head == "edge" and count == 6 and parts[4] == "feature":
                features.append(((parts[1], parts[2], parts[3]), parts[5], tensor))
            elif head == "target" and count == 2:
                targets.append((parts[1], tensor))
            elif head == "target" and count == 4:
                targets.append(((parts[1], parts[2], parts[3]), tensor))
            else:
                raise invalid(f"unexpected input '{tensor.name[:200]}': graph inputs are named node/<type>/ids, "
                              "node/<type>/feature/<name>, edge/<src>/<rel>/<dst>/index, "
                              "edge/<src>/<rel>/<dst>/feature/<name> or target/...")
        for relation, tensor in indexes:
            if relation in graph.edge_index:
                raise invalid(f"input '{tensor.name}' is given twice")
            graph.edge_index[relation] = graph._pairs(tensor, relation, "edge index")
        for owner, name, tensor in features:
            if isinstance(owner, str):
                graph.node_features.setdefault(owner, {})[name] = _feature(tensor, graph._count(owner, tensor))
            else:
                graph.edge_features.setdefault(owner, {})[name] = _feature(tensor, _edge_count(graph, owner, tensor))
        for key, tensor in targets:
            if isinstance(key, str):
                graph.node_targets[key] = graph._indices(tensor, key)
            else:
                graph.edge_targets[key] = graph._pairs(tensor, key, "edge target")
        if not graph.node_targets and not graph.edge_targets:
            raise invalid("the graph inputs name no targets (target/<type> or target/<src>/<rel>/<dst>)")
        return graph

    def _indices(self, tensor: Tensor, node_type: str) -> np.ndarray:
        if tensor.data.dtype.kind not in "iu" or len(tensor.shape) != 1:
            raise invalid(f"input '{tensor.name}' must be a 1-D integer tensor of node indices")
        return _checked_index(tensor.data.astype(np.int64, copy=False), self._count(node_type, tensor), tensor.name)

    def _pairs(self, tensor: Tensor, relation: Relation, what: str) -> np.ndarray:
        if tensor.data.dtype.kind not in "iu" or len(tensor.shape) != 2 or tensor.shape[0] != 2:
            raise invalid(f"input '{tensor.name}' must be an integer {what} of shape [2, E]")
        data = tensor.data.astype(np.int64, copy=False)
        _checked_index(data[0], self._count(relation[0], tensor), tensor.name)
        _checked_index(data[1], self._count(relation[2], tensor), tensor.name)
        return data

    def _count(self, node_type: str, tensor: Tensor) -> int:
        if node_type not in self.node_ids:
            raise invalid(f"input '{tensor.name}' refers to node type '{node_type}' that has no "
                          "node/<type>/ids input")
        return self.node_count(node_type)


def _tensor(name: str, array: np.ndarray) -> Tensor:
    datatype = "BYTES" if array.dtype == object else ("INT64" if array.dtype.kind in "iu" else "FP32")
    return Tensor(name, datatype, tuple(int(d) for d in array.shape), array)


def _ids(tensor: Tensor) -> np.ndarray:
    if tensor.datatype != "BYTES" or len(tensor.shape) not in (1, 2) or (
            len(tensor.shape) == 2 and tensor.shape[1] != 1):
        raise invalid(f"input '{tensor.name}' must be BYTES of shape [N] (node ids)")
    return tensor.data.reshape(-1)


def _edge_count(graph: GraphTensors, relation: Relation, tensor: Tensor) -> int:
    index = graph.edge_index.get(relation)
    if index is None:
        raise invalid(f"input '{tensor.name}': relation {list(relation)} has no edge index input")
    return int(index.shape[1])


def _feature(tensor: Tensor, rows: int) -> np.ndarray:
    if not tensor.shape or tensor.shape[0] != rows:
        raise invalid(f"input '{tensor.name}' must have {rows} rows (one per node or edge), "
                      f"got shape {list(tensor.shape)}")
    if tensor.datatype == "BYTES":
        return tensor.data.reshape(rows, -1)
    if tensor.data.dtype.kind not in "fiu":
        raise invalid(f"input '{tensor.name}' must be numeric or BYTES, got {tensor.datatype}")
    return tensor.data.astype(np.float32, copy=False)


def _checked_index(index: np.ndarray, bound: int, name: str) -> np.ndarray:
    if index.size and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise invalid(f"input '{name}' has an index outside 0..{bound - 1}")
    return index


def output_rows(outputs: Mapping[str, Tensor], key: str | Relation, count: int) -> np.ndarray:
    """The prediction output for one target tensor as a [count, K] float64
    array; INVALID_INPUT when missing or of the wrong size."""
    name = prediction_name(key)
    tensor = outputs.get(name)
    if tensor is None:
        raise invalid(f"the model returned no output '{name}'")
    data = tensor.data
    if tensor.datatype == "BYTES" or data.dtype.kind not in "fiu":
        raise invalid(f"output '{name}' must be numeric, got {tensor.datatype}")
    if data.ndim == 0 or data.shape[0] != count:
        raise invalid(f"output '{name}' has shape {list(data.shape)} but there are {count} targets")
    return data.reshape(count, -1).astype(np.float64)
