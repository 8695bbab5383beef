"""Docs that name a metric name one the gateway exports (docs and
code disagree where nobody checks). Every `gateway_*` name in the docs
(and the deploy files: alerts, dashboards) must be a family the metrics
module registers, or one of its sample names."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from gateway.observability.metrics import GatewayMetrics
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


# Labels Prometheus adds (target labels) or histograms carry.
_TARGET_LABELS = {"namespace", "job", "instance", "pod", "le"}
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([a-z_][a-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_SELECTOR = re.compile(r"\{([^}]*)\}")


def label_names() -> dict[str, set[str]]:
    """Every family the gateway registers, with the labels it declares."""
    from prometheus_client.metrics import MetricWrapperBase

    metrics = GatewayMetrics(CollectorRegistry(), version="test")
    return {metric._name: set(metric._labelnames) for metric in vars(metrics).values()
            if isinstance(metric, MetricWrapperBase)}


def queries() -> dict[str, list[str]]:
    """The PromQL of the alerts, the dashboard and the docs' query block, by file."""
    import json

    import yaml

    found: dict[str, list[str]] = {}
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yaml").read_text())
    found["alerts.yaml"] = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((REPO / "deploy/grafana/inference-gateway-dashboard.json").read_text())
    found["dashboard"] = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    docs = (REPO / "docs/observability.md").read_text()
    found["observability.md"] = [line for block in re.findall(r"```promql\n(.*?)```", docs, re.S)
                                 for line in block.splitlines() if not line.startswith("#")]
    return found


def test_every_label_the_queries_use_is_on_their_metrics() -> None:
    """A query grouping or filtering by a label its metric does not carry
    silently finds nothing (as when labels are dropped from histograms)."""
    declared = label_names()
    wrong: list[str] = []
    for source, exprs in queries().items():
        assert exprs, source
        for expr in exprs:
            used = {name.strip() for group in _GROUPING.findall(expr) for name in group.split(",") if name.strip()}
            used |= {name for selector in _SELECTOR.findall(expr) for name in _MATCHER.findall(selector)}
            used -= _TARGET_LABELS
            for name in {family(n) for n in _NAME.findall(expr)}:
                missing = used - declared[name]
                if missing:
                    wrong.append(f"{source}: {name} has no {sorted(missing)} in {expr!r}")
    assert not wrong, "\n".join(wrong)


def test_the_label_check_catches_a_dropped_label() -> None:
    declared = label_names()
    assert "route" not in declared["gateway_request_duration_seconds"]
    assert {"http_code", "grpc_code", "route"} <= declared["gateway_requests"]
