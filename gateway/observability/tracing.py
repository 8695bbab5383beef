"""Optional OpenTelemetry tracing: one server span per downstream request.

Off by default; needs the ``tracing`` extra (``pip install
'inference-gateway[tracing]'``: the OpenTelemetry SDK and its OTLP/HTTP
exporter). The gateway builds its own ``TracerProvider`` and propagator and
never touches OpenTelemetry's global ones.

With tracing on, the span continues the client's W3C trace context and the
gateway's span becomes the parent the upstream sees (``ctx.traceparent`` is
replaced by the span's context before any upstream call) and the one echoed
on the response. With tracing off, trace context passes through unchanged.
"""

from __future__ import annotations

from typing import Any

from gateway.config.observability import TracingConfig
from gateway.core.record import OUTCOME_OK, TRACEPARENT_HEADER, TRACESTATE_HEADER
from gateway.core.types import RequestContext


class Tracing:
    def __init__(self, config: TracingConfig, service_version: str, worker: int | None = None,
                 exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes: dict[str, Any] = {"service.name": config.service_name, "service.version": service_version}
        if worker is not None:
            attributes["service.instance.worker"] = worker
        self.provider = TracerProvider(resource=Resource.create(attributes),
                                       sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
        # Spans leave in batches on the SDK's thread, never on the event loop.
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=config.endpoint)))
        self.tracer = self.provider.get_tracer("inference-gateway", service_version)
        self.propagator = TraceContextTextMapPropagator()
        self._trace = trace

    def start(self, ctx: RequestContext) -> None:
        """Open the request's server span and make it the trace context that
        goes upstream and back to the client."""
        carrier = {TRACEPARENT_HEADER: ctx.traceparent, TRACESTATE_HEADER: ctx.tracestate} if ctx.traceparent else {}
        parent = self.propagator.extract(carrier)
        span = self.tracer.start_span(f"{ctx.protocol} {ctx.record.operation}", context=parent,
                                      kind=self._trace.SpanKind.SERVER)
        ctx.record.span = span
        out: dict[str, str] = {}
        self.propagator.inject(out, context=self._trace.set_span_in_context(span))
        ctx.traceparent = out.get(TRACEPARENT_HEADER, "")
        ctx.tracestate = out.get(TRACESTATE_HEADER, "")

    def finish(self, ctx: RequestContext) -> None:
        span = ctx.record.span
        if span is None:
            return
        r = ctx.record
        span.set_attributes({
            "gateway.request_id": ctx.request_id, "gateway.listener": ctx.listener,
            "gateway.protocol": ctx.protocol, "gateway.operation": r.operation, "gateway.model": r.model,
            "gateway.route": r.route, "gateway.upstream": r.upstream, "gateway.endpoint": r.endpoint,
            "gateway.upstream_attempts": r.upstream_attempts, "gateway.upstream_seconds": r.upstream_seconds,
            "gateway.status": r.status, "gateway.outcome": r.outcome,
            "gateway.request_bytes": r.request_bytes, "gateway.response_bytes": r.response_bytes,
            "http.request.method": r.method, "url.path": r.path,
        })
        if r.outcome != OUTCOME_OK:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, r.outcome))
        span.end()
        r.span = None

    def close(self) -> None:
        self.provider.shutdown()  # flushes the spans still queued
