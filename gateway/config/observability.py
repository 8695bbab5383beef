"""The `observability:` section: access log, metrics, tracing (and whether
the tracing extra is installed).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from gateway.config.node import Node

DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"


@dataclass(frozen=True, slots=True)
class AccessLogConfig:
    enabled: bool = True
    format: str = "plain"  # "plain" (key=value) | "json"
    destination: str = "stdout"  # "stdout" | "stderr" | a file path (appended)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # Distinct model names used as label values; later names collapse to
    # gateway.observability.metrics.OTHER_MODEL so a client cannot explode cardinality.
    max_model_labels: int = 100


@dataclass(frozen=True, slots=True)
class TracingConfig:
    enabled: bool = False  # needs the `tracing` extra (OpenTelemetry SDK)
    endpoint: str = DEFAULT_OTLP_ENDPOINT  # OTLP/HTTP (protobuf)
    service_name: str = "inference-gateway"
    sample_ratio: float = 1.0  # of new traces; a client's sampled flag is honoured


TRACING_EXTRA_HINT = "install the tracing extra: pip install 'inference-gateway[tracing]'"


def tracing_sdk_available() -> bool:
    """Whether the tracing extra is installed (found, not imported: the
    config is checked before anything starts)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in (
            "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"))
    except ModuleNotFoundError:  # a parent package is missing
        return False


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    access_log: AccessLogConfig = AccessLogConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()


def parse_observability(node: Node) -> ObservabilityConfig:
    log_node = node.child("access_log", {})
    access_log = AccessLogConfig(
        enabled=log_node.flag("enabled", True),
        format=log_node.choice("format", ("plain", "json"), "plain"),
        destination=log_node.string("destination", "stdout"),
    )
    log_node.check_no_unknown_keys()
    metrics_node = node.child("metrics", {})
    metrics = MetricsConfig(max_model_labels=metrics_node.integer("max_model_labels", 100, minimum=0))
    metrics_node.check_no_unknown_keys()
    tracing_node = node.child("tracing", {})
    tracing = TracingConfig(
        enabled=tracing_node.flag("enabled", False),
        endpoint=tracing_node.string("endpoint", DEFAULT_OTLP_ENDPOINT),
        service_name=tracing_node.string("service_name", "inference-gateway"),
        sample_ratio=tracing_node.get("sample_ratio", float, 1.0),
    )
    if not 0.0 <= tracing.sample_ratio <= 1.0:
        tracing_node.error("must be between 0 and 1", "sample_ratio")
    if tracing.enabled and not tracing_sdk_available():
        tracing_node.error(f"needs the OpenTelemetry SDK; {TRACING_EXTRA_HINT}", "enabled")
    tracing_node.check_no_unknown_keys()
    node.check_no_unknown_keys()
    return ObservabilityConfig(access_log, metrics, tracing)
