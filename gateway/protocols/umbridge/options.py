"""The UM-Bridge YAML keys: listener, upstream and per-route options."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.node import Node
from gateway.protocols.umbridge.codec import NONFINITE_POLICIES

DEFAULT_METADATA_TTL = 10.0


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    nonfinite: str = "null"  # how NaN/inf leave: null | literal | error
    metadata_ttl: float = DEFAULT_METADATA_TTL  # seconds a model's sizes are reused; 0: ask every call


@dataclass(frozen=True, slots=True)
class UpstreamOptions:
    # New TCP connection per call (the reference clients' way), or reuse
    # (keep-alive); see docs/umbridge.md for the measurements behind the default.
    keepalive: bool = False
    nonfinite: str = "literal"  # how NaN/inf inputs are sent: literal | null
    metadata_ttl: float = DEFAULT_METADATA_TTL


@dataclass(frozen=True, slots=True)
class FiniteDifferences:
    """Derivatives of V2 models by central differences, per route."""

    step: float | None = None  # relative step for first derivatives; None: cbrt(eps) of the input type
    hessian_step: float | None = None  # relative step for ApplyHessian; None: eps ** (1/4)
    max_batch: int = 0  # rows per batched request; 0: all perturbations in one request


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """``options.umbridge`` of a route: how UM-Bridge vectors map to a V2 model."""

    inputs: tuple[str, ...] | None = None  # V2 input names in UM-Bridge order; None: metadata order
    outputs: tuple[str, ...] | None = None
    finite_differences: FiniteDifferences | None = None  # None: no derivatives for V2 models


def _ttl(node: Node) -> float:
    value = node.duration("metadata_ttl", DEFAULT_METADATA_TTL)
    return float(value) if value is not None else DEFAULT_METADATA_TTL


def parse_listener_options(node: Node) -> ListenerOptions:
    return ListenerOptions(node.choice("nonfinite", NONFINITE_POLICIES, "null"), _ttl(node))


def parse_upstream_options(node: Node) -> UpstreamOptions:
    return UpstreamOptions(node.flag("keepalive", False), node.choice("nonfinite", ("literal", "null"), "literal"),
                           _ttl(node))


def _names(node: Node, key: str) -> tuple[str, ...] | None:
    names = node.get(key, list, None)
    if names is None:
        return None
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        node.error("must be a non-empty list of distinct tensor names", key)
        return None
    return tuple(names)


def _positive(node: Node, key: str) -> float | None:
    raw = node.value.get(key) if node.is_mapping else None
    if isinstance(raw, str):  # PyYAML reads 1e-4 (no dot) as a string
        try:
            node.value[key] = float(raw)
        except ValueError:
            pass
    value = node.get(key, float, None)
    if value is not None and not 0 < value < 1:
        node.error(f"must be between 0 and 1 (a relative step), got {value}", key)
        return None
    return value


def _finite_differences(node: Node) -> FiniteDifferences | None:
    if node.value is None or node.value is False:
        return None
    if node.value is True:
        return FiniteDifferences()
    if not node.is_mapping:
        node.error("must be true, false or a mapping with step, hessian_step, max_batch")
        return None
    enabled = node.flag("enabled", True)
    options = FiniteDifferences(_positive(node, "step"), _positive(node, "hessian_step"),
                                node.integer("max_batch", 0, minimum=0))
    node.check_no_unknown_keys()
    return options if enabled else None


def parse_route_options(node: Node) -> RouteOptions:
    if not node.is_mapping:
        node.error("must be a mapping with inputs, outputs or finite_differences")
        return RouteOptions()
    options = RouteOptions(_names(node, "inputs"), _names(node, "outputs"),
                           _finite_differences(node.child("finite_differences", None)))
    node.check_no_unknown_keys()
    return options
