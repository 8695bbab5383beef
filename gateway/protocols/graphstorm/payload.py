"""GraphStorm payloads <-> :class:`GraphTensors`, with GraphStorm's checks.

Decoding follows the endpoint's order (first failure wins): the task (421),
``targets`` present (401) and well-formed (400), the graph (411), features
the model needs (404), then each target's type (403) and id (404). The work
per node and edge is a few dict operations; arrays are built in bulk, so
payloads of tens of thousands of edges decode in tens of milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.core.errors import ErrorKind, invalid
from gateway.core.graphtensors import EDGE_TASKS, GraphTensors, Relation
from gateway.core.types import MAX_DIMS
from gateway.protocols.graphstorm import errors
from gateway.protocols.graphstorm.errors import GraphStormError, construction, shown
from gateway.protocols.graphstorm.schema import FeatureSpec, GraphSchema

PAYLOAD_VERSION = "gs-realtime-v0.1"
_MISSING: Any = object()
_ID_TYPES = (str, int)
# Kind of a feature on a route without a schema: decided by its values.
_AUTO = "auto"


@dataclass(slots=True)
class Invocation:
    """A validated payload: its graph as tensors and the targets as the
    client named them (grouped by type in graph order, as GraphStorm answers)."""

    task: str
    graph: GraphTensors
    node_targets: dict[str, list[Any]] = field(default_factory=dict)
    edge_targets: dict[Relation, list[tuple[Any, Any]]] = field(default_factory=dict)


def decode_payload(payload: dict[str, Any], schema: GraphSchema | None, tasks: tuple[str, ...]) -> Invocation:
    task = payload.get("gml_task")
    if not isinstance(task, str) or task not in tasks:
        raise errors.task_mismatch(task, tasks)
    edge_task = task in EDGE_TASKS
    targets = _target_list(payload.get("targets"), edge_task)
    reader = _GraphReader(schema)
    graph = reader.read(payload.get("graph", _MISSING))
    if reader.absent_feature is not None:
        raise reader.absent_feature
    invocation = Invocation(task, graph)
    if edge_task:
        _edge_targets(invocation, targets, reader.index)
    else:
        _node_targets(invocation, targets, reader.index)
    return invocation


# --- targets -------------------------------------------------------------------


def _target_list(targets: Any, edge_task: bool) -> list[dict[str, Any]]:
    if targets is None or (isinstance(targets, (list, dict, str)) and len(targets) == 0):
        raise errors.missing_field("targets")
    if not isinstance(targets, list):
        raise errors.json_format("the 'targets' field must be a list of target objects")
    keys = ("edge_type", "src_node_id", "dest_node_id") if edge_task else ("node_type", "node_id")
    for position, target in enumerate(targets):
        if not isinstance(target, dict):
            raise errors.json_format(f"targets[{position}] must be an object, got {type(target).__name__}")
        if any(key not in target for key in keys):
            raise errors.json_format(f"targets[{position}] must be an object with the keys {', '.join(keys)}")
        if edge_task and _relation(target["edge_type"]) is None:
            raise errors.json_format(f"targets[{position}].edge_type must be a list of three strings")
    return targets


def _node_targets(invocation: Invocation, targets: list[dict[str, Any]], index: dict[Any, dict[Any, int]]) -> None:
    found: dict[str, tuple[list[Any], list[int]]] = {}
    for target in targets:
        node_type, node_id = target["node_type"], target["node_id"]
        position = _lookup(index.get(node_type) if isinstance(node_type, str) else None, node_id)
        if position is None:
            if not isinstance(node_type, str) or node_type not in index:
                raise errors.target_type_absent(node_type)
            raise errors.target_id_absent(node_id)
        ids, positions = found.setdefault(node_type, ([], []))
        ids.append(node_id)
        positions.append(position)
    for node_type in invocation.graph.node_ids:  # GraphStorm groups by graph node-type order
        if node_type in found:
            ids, positions = found[node_type]
            invocation.node_targets[node_type] = ids
            invocation.graph.node_targets[node_type] = np.array(positions, dtype=np.int64)


def _edge_targets(invocation: Invocation, targets: list[dict[str, Any]], index: dict[Any, dict[Any, int]]) -> None:
    found: dict[Relation, tuple[list[tuple[Any, Any]], list[int], list[int]]] = {}
    for target in targets:
        relation = _relation(target["edge_type"])
        assert relation is not None  # checked by _target_list
        if relation not in invocation.graph.edge_index:
            raise GraphStormError(errors.TARGET_TYPE, ErrorKind.INVALID_INPUT,
                                  f"Mismatched target edge type: the target edge type {list(relation)} does not "
                                  "exist in the payload graph.")
        src_id, dst_id = target["src_node_id"], target["dest_node_id"]
        src = _lookup(index.get(relation[0]), src_id)
        dst = _lookup(index.get(relation[2]), dst_id)
        if src is None or dst is None:
            raise errors.target_id_absent(src_id if src is None else dst_id)
        pairs, sources, destinations = found.setdefault(relation, ([], [], []))
        pairs.append((src_id, dst_id))
        sources.append(src)
        destinations.append(dst)
    for relation in invocation.graph.edge_index:
        if relation in found:
            pairs, sources, destinations = found[relation]
            invocation.edge_targets[relation] = pairs
            invocation.graph.edge_targets[relation] = np.array([sources, destinations], dtype=np.int64)


def _lookup(index: dict[Any, int] | None, node_id: Any) -> int | None:
    if index is None or not isinstance(node_id, _ID_TYPES) or isinstance(node_id, bool):
        return None
    return index.get(node_id)


def _relation(value: Any) -> Relation | None:
    if type(value) is list and len(value) == 3 and all(type(part) is str for part in value):
        return (value[0], value[1], value[2])
    return None


# --- the graph -------------------------------------------------------------------


class _GraphReader:
    """Reads ``graph.nodes`` and ``graph.edges`` into :class:`GraphTensors`."""

    def __init__(self, schema: GraphSchema | None) -> None:
        self.schema = schema
        self.graph = GraphTensors()
        self.index: dict[Any, dict[Any, int]] = {}  # node type -> node id -> position
        # GraphStorm builds the whole graph before it checks model features:
        # the first absent feature is reported only if construction succeeds.
        self.absent_feature: GraphStormError | None = None

    def read(self, graph: Any) -> GraphTensors:
        if graph is _MISSING:
            raise construction("the payload has no 'graph' field")
        if not isinstance(graph, dict):
            raise construction("'graph' must be an object with 'nodes' and 'edges'")
        nodes, edges = graph.get("nodes", _MISSING), graph.get("edges", _MISSING)
        for name, items in (("nodes", nodes), ("edges", edges)):
            if items is _MISSING:
                raise construction(f"the graph has no '{name}' field")
            if not isinstance(items, list):
                raise construction(f"graph.{name} must be a list")
        for node_type, members in self._group_nodes(nodes).items():
            self._read_nodes(node_type, members)
        for relation, members in self._group_edges(edges).items():
            self._read_edges(relation, members)
        return self.graph

    def _group_nodes(self, nodes: list[Any]) -> dict[str, list[dict[str, Any]]]:
        groups: dict[str, list[dict[str, Any]]] = {}
        known = self.schema.node_features if self.schema is not None else None
        for position, node in enumerate(nodes):
            if type(node) is not dict:
                raise construction(f"graph.nodes[{position}] must be an object")
            node_type = node.get("node_type", _MISSING)
            if type(node_type) is not str:
                what = "has no 'node_type'" if node_type is _MISSING else "has a 'node_type' that is not a string"
                raise construction(f"graph.nodes[{position}] {what}")
            members = groups.get(node_type)
            if members is None:
                if known is not None and node_type not in known:
                    raise construction(f"node type {shown(node_type)} is not in the model's graph schema "
                                       f"(known: {', '.join(known)})")
                members = groups[node_type] = []
            members.append(node)
        return groups

    def _group_edges(self, edges: list[Any]) -> dict[Relation, list[dict[str, Any]]]:
        groups: dict[Relation, list[dict[str, Any]]] = {}
        known = self.schema.edge_features if self.schema is not None else None
        for position, edge in enumerate(edges):
            if type(edge) is not dict:
                raise construction(f"graph.edges[{position}] must be an object")
            edge_type = edge.get("edge_type", _MISSING)
            try:
                # A tuple equal to a known key is a valid relation: check new keys only.
                members = groups.get(tuple(edge_type)) if type(edge_type) is list else None
            except TypeError:  # unhashable parts
                members = None
            if members is None:
                relation = _relation(edge_type)
                if relation is None:
                    if edge_type is _MISSING:
                        raise construction(f"graph.edges[{position}] has no 'edge_type'")
                    raise construction(f"graph.edges[{position}].edge_type must be a list of three strings "
                                       "[source node type, relation, destination node type]")
                if known is not None and relation not in known:
                    raise construction(f"edge type {list(relation)} is not in the model's graph schema")
                members = groups[relation] = []
            members.append(edge)
        return groups

    def _read_nodes(self, node_type: str, members: list[dict[str, Any]]) -> None:
        ids = [node.get("node_id", _MISSING) for node in members]
        if not set(map(type, ids)) <= {str, int}:
            bad = next(i for i in ids if type(i) not in (str, int))
            raise construction(f"a node of type {shown(node_type)} has no 'node_id'" if bad is _MISSING else
                               f"node ids must be strings or integers, got {shown(bad)}")
        index = dict(zip(ids, range(len(ids)), strict=True))
        if len(index) != len(ids):
            raise construction(f"node id {shown(_first_duplicate(ids))} appears more than once among nodes of "
                               f"type {shown(node_type)}")
        self.index[node_type] = index
        self.graph.node_ids[node_type] = _bytes_column(ids)
        specs = self.schema.node_features[node_type] if self.schema is not None else None
        features = self._features("node", node_type, members, specs)
        if features:
            self.graph.node_features[node_type] = features

    def _read_edges(self, relation: Relation, members: list[dict[str, Any]]) -> None:
        src = self._endpoints(relation, members, 0, "src_node_id")
        dst = self._endpoints(relation, members, 2, "dest_node_id")
        self.graph.edge_index[relation] = np.stack([src, dst])
        specs = self.schema.edge_features[relation] if self.schema is not None else None
        features = self._features("edge", relation, members, specs)
        if features:
            self.graph.edge_features[relation] = features

    def _endpoints(self, relation: Relation, members: list[dict[str, Any]], end: int, key: str) -> np.ndarray:
        index = self.index.get(relation[end])
        if index is None:
            raise construction(f"edges of type {list(relation)} refer to node type {shown(relation[end])}, "
                               "which has no nodes in the graph")
        ids = [edge.get(key, _MISSING) for edge in members]
        try:
            positions = np.array(list(map(index.get, ids, itertools.repeat(-1, len(ids)))), dtype=np.int64)
        except TypeError:  # an unhashable id (a list or an object)
            positions = np.array([index.get(i, -1) if isinstance(i, _ID_TYPES) else -1 for i in ids], np.int64)
        bad = np.flatnonzero(positions < 0)
        if bad.size:
            value = ids[int(bad[0])]
            if value is _MISSING:
                raise construction(f"an edge of type {list(relation)} has no '{key}'")
            raise construction(f"an edge of type {list(relation)} refers to node id {shown(value)}, which is not "
                               f"among the nodes of type {shown(relation[end])}")
        return positions

    def _features(self, entity: str, owner: str | Relation, members: list[dict[str, Any]],
                  specs: tuple[FeatureSpec, ...] | None) -> dict[str, np.ndarray]:
        """One array per feature the model uses (all given ones without a schema)."""
        label = f"{entity}s of type {shown(owner if isinstance(owner, str) else list(owner))}"
        given = [item["features"] for item in members if "features" in item]
        if not given:
            if specs:
                raise construction(f"{label} have no 'features', but the graph schema lists "
                                   f"{', '.join(s.name for s in specs)}")
            return {}
        if len(given) != len(members):
            raise construction(f"some {label} have 'features' and others do not")
        if set(map(type, given)) != {dict}:
            raise construction(f"the 'features' of {label} must be objects")
        names = given[0].keys()
        if not all(map(names.__eq__, map(dict.keys, given))):
            raise construction(f"{label} do not all have the same feature names")
        if specs is None:
            specs = tuple(FeatureSpec(name, _AUTO) for name in names)
        columns: dict[str, np.ndarray] = {}
        for spec in specs:
            if spec.name not in names:
                if self.absent_feature is None:
                    self.absent_feature = errors.feature_absent(entity, owner if isinstance(owner, str)
                                                                else list(owner), spec.name)
                continue
            values = [features[spec.name] for features in given]
            columns[spec.name] = _column(values, spec, f"feature {shown(spec.name)} of {label}")
        return columns


def _first_duplicate(ids: list[Any]) -> Any:
    seen: set[Any] = set()
    for node_id in ids:
        if node_id in seen:
            return node_id
        seen.add(node_id)
    return None


def _bytes_column(values: Iterable[Any]) -> np.ndarray:
    items = [v.encode("utf-8", "surrogatepass") if type(v) is str else str(v).encode() for v in values]
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _column(values: list[Any], spec: FeatureSpec, where: str) -> np.ndarray:
    """Feature values of all nodes (or edges) of one type as one array."""
    texts = sum(type(v) is str for v in values)
    if spec.kind == "text" or (spec.kind in (_AUTO, "raw") and texts == len(values)):
        if texts != len(values):
            raise construction(f"{where} must be text (a string per item)")
        return _bytes_column(values).reshape(-1, 1)
    if texts:
        raise construction(f"{where} must be numeric, but some values are strings")
    try:
        array = np.array(values)
    except (ValueError, TypeError, OverflowError):
        raise construction(f"{where} is not a regular list of numbers (items differ in length)") from None
    if array.dtype.kind not in "fiu":
        raise construction(f"{where} must be numbers (or lists of numbers), got {_kind_name(array)}")
    if array.ndim > MAX_DIMS:  # a tensor of the nodes' (or edges') rows of values
        raise construction(f"{where} nests {array.ndim - 1} levels of lists; a feature may have at most "
                           f"{MAX_DIMS - 1} dimensions")
    rows = len(values)
    width = array.size // rows
    expected = spec.width
    if expected is not None and width != expected:
        raise construction(f"{where} has {width} values per item, but the graph schema says "
                           f"feature_dim {list(spec.dim or ())}")
    shape = (rows, *spec.dim) if spec.dim is not None else (array.shape if array.ndim > 1 else (rows, 1))
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf, as a cast in the model would
        return array.astype(np.float32).reshape(shape)


def _kind_name(array: np.ndarray) -> str:
    return {"b": "booleans", "O": "mixed or nested values", "U": "strings"}.get(array.dtype.kind, str(array.dtype))


# --- the reverse: tensors -> a payload, results -> tensors ---------------------------


def encode_payload(graph: GraphTensors, task: str) -> dict[str, Any]:
    """The GraphStorm payload for a graph given as tensors (a V2 client
    calling a GraphStorm endpoint through the gateway)."""
    names = {t: _texts(ids, f"node ids of type '{t}'") for t, ids in graph.node_ids.items()}
    nodes: list[dict[str, Any]] = []
    for node_type, ids in names.items():
        columns = {n: _json_column(v, n) for n, v in graph.node_features.get(node_type, {}).items()}
        for row, node_id in enumerate(ids):
            node: dict[str, Any] = {"node_type": node_type, "node_id": node_id}
            if columns:
                node["features"] = {name: column[row] for name, column in columns.items()}
            nodes.append(node)
    edges: list[dict[str, Any]] = []
    for relation, index in graph.edge_index.items():
        src_ids, dst_ids = names[relation[0]], names[relation[2]]
        columns = {n: _json_column(v, n) for n, v in graph.edge_features.get(relation, {}).items()}
        edge_type = list(relation)
        for row, (src, dst) in enumerate(zip(index[0].tolist(), index[1].tolist(), strict=True)):
            edges.append({"edge_type": edge_type, "src_node_id": src_ids[src], "dest_node_id": dst_ids[dst],
                          "features": {name: column[row] for name, column in columns.items()}})
    targets: list[dict[str, Any]] = []
    for node_type, positions in graph.node_targets.items():
        targets += [{"node_type": node_type, "node_id": names[node_type][p]} for p in positions.tolist()]
    for relation, pairs in graph.edge_targets.items():
        targets += [{"edge_type": list(relation), "src_node_id": names[relation[0]][s],
                     "dest_node_id": names[relation[2]][d]} for s, d in zip(*pairs.tolist(), strict=True)]
    return {"version": PAYLOAD_VERSION, "gml_task": task, "graph": {"nodes": nodes, "edges": edges},
            "targets": targets}


def _texts(values: np.ndarray, what: str) -> list[str]:
    try:
        return [bytes(v).decode("utf-8") for v in values.reshape(-1)]
    except UnicodeDecodeError:
        raise invalid(f"{what} must be UTF-8 text to travel in a GraphStorm payload") from None


def _json_column(values: np.ndarray, name: str) -> list[Any]:
    if values.dtype == object:
        if values.shape[1:] not in ((), (1,)):
            raise invalid(f"text feature '{name}' must have one string per item")
        return _texts(values, f"feature '{name}'")
    return values.reshape(len(values), -1).tolist()
