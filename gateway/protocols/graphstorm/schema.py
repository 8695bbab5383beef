"""A route's graph schema, read from a GraphStorm GConstruct runtime JSON.

GraphStorm endpoints ship the JSON that GConstruct wrote when the graph was
built (``version: gconstruct-runtime-v0.1``): node types with their features
(``feature_name``, ``feature_dim``, an optional ``transform``) and relations
(``relation: [src, rel, dst]``). The gateway validates payloads against it
the way the endpoint would and declares the tensors a model receives.

Several blocks may describe one node type or relation (GConstruct allows it);
their features are merged, as GraphStorm does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.node import Node

Relation = tuple[str, str, str]

# Transforms whose input is raw text; the model (not the gateway) tokenizes
# or embeds it, so the payload carries strings and feature_dim does not
# describe them.
TEXT_TRANSFORMS = frozenset({"bert_hf", "tokenize_hf"})
# Transforms that keep a numeric feature's width: feature_dim is checked.
SAME_WIDTH_TRANSFORMS = frozenset({"max_min_norm", "rank_gauss"})

# ``graph_schema: builtin:NAME`` names a schema shipped with the gateway.
BUILTIN_SCHEMAS: Mapping[str, str] = {"movielens": "movielens_gconstruct_runtime.json"}
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """One feature of a node type or relation.

    ``kind`` says what the payload carries: ``numeric`` (numbers, width
    checked against ``dim``), ``text`` (strings) or ``raw`` (whatever the
    transform takes: strings or numbers of any width).
    """

    name: str
    kind: str
    dim: tuple[int, ...] | None = None
    transform: str | None = None

    @property
    def width(self) -> int | None:
        return math.prod(self.dim) if self.dim is not None else None


@dataclass(frozen=True, slots=True)
class GraphSchema:
    source: str
    node_features: Mapping[str, tuple[FeatureSpec, ...]]
    edge_features: Mapping[Relation, tuple[FeatureSpec, ...]]
    version: str = ""
    # node type -> task types of its labels ("classification", "regression").
    node_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.node_features)

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.edge_features)


def resolve_schema_path(text: str, base_dir: Path) -> Path:
    if text.startswith(BUILTIN_PREFIX):
        name = text[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_SCHEMAS:
            known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_SCHEMAS)
            raise ValueError(f"unknown builtin graph schema {text!r}; known: {known}")
        return Path(__file__).resolve().parents[1] / "builtin" / "data" / BUILTIN_SCHEMAS[name]
    path = Path(text)
    return path if path.is_absolute() else base_dir / path


def load_schema(node: Node, base_dir: Path) -> GraphSchema | None:
    """Read and validate the schema file named by ``node``; problems are
    recorded on ``node`` with the YAML path and the place inside the JSON."""
    text = node.value
    if not isinstance(text, str) or not text:
        node.error("must be the path of a GConstruct runtime JSON file (or builtin:movielens)")
        return None
    try:
        path = resolve_schema_path(text, base_dir)
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # includes JSONDecodeError and unknown builtin names
        node.error(f"{text}: not a usable graph schema: {exc}")
        return None
    except OSError as exc:
        node.error(f"cannot read graph schema {text}: {exc.strerror or exc}")
        return None
    problems: list[str] = []
    schema = parse_schema(data, str(path), problems)
    for problem in problems:
        node.error(f"{text}: {problem}")
    return schema if not problems else None


def parse_schema(data: Any, source: str, problems: list[str]) -> GraphSchema:
    """Validate a GConstruct (runtime) JSON object; problems name JSON paths."""
    root = Node(data, "", problems)
    if not root.is_mapping:
        root.error("the graph schema must be a JSON object")
        return GraphSchema(source, {}, {})
    version = root.get("version", str, "")
    node_features: dict[str, list[FeatureSpec]] = {}
    node_labels: dict[str, list[str]] = {}
    for item in root.child("nodes").items():
        node_type = item.string("node_type")
        features = _features(item.child("features", []))
        labels = [label.get("task_type", str, "") for label in item.child("labels", []).items()]
        if isinstance(node_type, str):
            _merge(node_features.setdefault(node_type, []), features, item, f"node type {node_type!r}")
            node_labels.setdefault(node_type, []).extend(t for t in labels if t)
    edge_features: dict[Relation, list[FeatureSpec]] = {}
    for item in root.child("edges", []).items():
        relation = item.child("relation").value
        features = _features(item.child("features", []))
        if not (isinstance(relation, list) and len(relation) == 3 and all(isinstance(x, str) for x in relation)):
            item.error("must be a list of three strings [source type, relation, destination type]", "relation")
            continue
        key = (relation[0], relation[1], relation[2])
        _merge(edge_features.setdefault(key, []), features, item, f"relation {list(key)}")
    if not node_features and not problems:
        root.error("lists no node types", "nodes")
    return GraphSchema(
        source,
        {k: tuple(v) for k, v in node_features.items()},
        {k: tuple(v) for k, v in edge_features.items()},
        version,
        {k: tuple(v) for k, v in node_labels.items()},
    )


def _merge(into: list[FeatureSpec], features: list[FeatureSpec], item: Node, owner: str) -> None:
    names = {f.name for f in into}
    for feature in features:
        if feature.name in names:
            item.error(f"feature {feature.name!r} of {owner} is declared twice", "features")
        names.add(feature.name)
        into.append(feature)


def _features(node: Node) -> list[FeatureSpec]:
    specs: list[FeatureSpec] = []
    for item in node.items():
        if not item.is_mapping:
            item.error("must be an object with feature_col and feature_name")
            continue
        column = item.child("feature_col", None).value
        name = item.get("feature_name", str, None)
        if name is None:
            if not isinstance(column, str):
                item.error("needs a feature_name (or a single feature_col naming it)")
                continue
            name = column
        transform_node = item.child("transform", None)
        transform = transform_node.get("name", str, None) if transform_node.is_mapping else None
        if transform_node.value is not None and not transform_node.is_mapping:
            transform_node.error("must be an object with a name")
        dim = _dim(item.child("feature_dim", None))
        if transform in TEXT_TRANSFORMS:
            kind = "text"
        elif transform is None or transform in SAME_WIDTH_TRANSFORMS:
            kind = "numeric"
        else:
            kind = "raw"
        specs.append(FeatureSpec(name, kind, dim if kind == "numeric" else None, transform))
    return specs


def _dim(node: Node) -> tuple[int, ...] | None:
    value = node.value
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not (isinstance(value, list) and value
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)):
        node.error("must be a list of positive integers, e.g. [16]")
        return None
    return tuple(value)
