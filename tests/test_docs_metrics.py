"""Docs that name a metric name one the gateway exports (issue 19: docs and
code disagreed where nobody checked). Every `gateway_*` name in the docs
(and the deploy files: alerts, dashboards) must be a family the metrics
module registers, or one of its sample names."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from support import REPO

# Sample suffixes a family's series carry in the exposition format.
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")
_NAME = re.compile(r"\bgateway_[a-z][a-z0-9_]*[a-z0-9]\b")


def exported() -> set[str]:
    registry = CollectorRegistry()
    GatewayMetrics(registry, version="test")
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and suffix != "_info":
            return name[: -len(suffix)]
    return name


def test_every_metric_the_docs_name_is_exported() -> None:
    names = exported()
    families = {family(n) for n in names}
    sources = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md",
               *sorted((REPO / "deploy").rglob("*.yaml")), *sorted((REPO / "deploy").rglob("*.json"))]
    unknown: dict[str, set[str]] = {}
    for path in sources:
        for name in _NAME.findall(path.read_text()):
            if name not in names and family(name) not in families:
                unknown.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert not unknown, f"metric names in docs that the gateway does not export: {unknown}"


def test_the_check_catches_a_wrong_name() -> None:
    """The family rule is not so loose that any name passes."""
    families = {family(n) for n in exported()}
    assert family("gateway_requests_total") in families
    assert family("gateway_request_totals") not in families
