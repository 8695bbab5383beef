"""The ``v1-rest`` upstream's YAML keys: how V2 tensors travel to a V1
server (TF Serving's REST predict API, KServe V1) and what its models look
like as V2 models, since a V1 server cannot say (docs/v1-rest.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.config.node import Node
from gateway.core.types import DATATYPES, TensorSpec
from gateway.transport.upstream import parse_response_limit

ROW, COLUMNAR = "instances", "inputs"  # the request forms, named by their body's key
DEFAULT_OUTPUT = "predictions"


@dataclass(frozen=True, slots=True)
class V1Model:
    """``models.<name>`` of a V1 upstream: the model as V2 metadata shows it,
    and how its requests are sent."""

    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    request_format: str | None = None  # None: the upstream's


@dataclass(frozen=True, slots=True)
class V1UpstreamOptions:
    request_format: str = ROW  # instances (row) | inputs (columnar)
    # The V2 output an answer's predictions become, unless they are
    # {name: value} objects or the model declares exactly one output.
    output_name: str = DEFAULT_OUTPUT
    models: Mapping[str, V1Model] = field(default_factory=lambda: MappingProxyType({}))
    health_path: str = "/"  # server liveness: KServe answers GET /
    max_connections: int = 64  # per endpoint
    max_response_bytes: int | None = None  # None: 4 x limits.max_request_bytes

    def model(self, name: str) -> V1Model | None:
        return self.models.get(name)

    def format_of(self, name: str) -> str:
        model = self.models.get(name)
        return model.request_format if model is not None and model.request_format else self.request_format


def _specs(node: Node) -> tuple[TensorSpec, ...]:
    specs: list[TensorSpec] = []
    for item in node.items():
        name = item.string("name")
        datatype = item.choice("datatype", tuple(sorted(DATATYPES)), "FP32")
        shape = item.get("shape", list, [-1])
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape):
            item.error("must be a list of integers >= -1 (-1: any size)", "shape")
            shape = [-1]
        item.check_no_unknown_keys()
        if isinstance(name, str):
            if any(spec.name == name for spec in specs):
                item.error(f"names tensor {name!r} twice", "name")
            specs.append(TensorSpec(name, datatype, tuple(shape)))
    return tuple(specs)


def _model(node: Node) -> V1Model:
    if not node.is_mapping:
        node.error("must be a mapping with inputs, outputs or request_format")
        return V1Model()
    model = V1Model(_specs(node.child("inputs", [])), _specs(node.child("outputs", [])),
                    node.choice("request_format", (ROW, COLUMNAR), None))
    node.check_no_unknown_keys()
    return model


def parse_upstream_options(node: Node) -> V1UpstreamOptions:
    models = {name: _model(child) for name, child in node.child("models", {}).entries()}
    health_path = node.string("health_path", "/")
    if isinstance(health_path, str) and not health_path.startswith("/"):
        node.error("must start with '/'", "health_path")
    return V1UpstreamOptions(
        request_format=node.choice("request_format", (ROW, COLUMNAR), ROW),
        output_name=node.string("output_name", DEFAULT_OUTPUT),
        models=MappingProxyType(models),
        health_path=health_path,
        max_connections=node.integer("max_connections", 64, minimum=1),
        max_response_bytes=parse_response_limit(node),
    )
