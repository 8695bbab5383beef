"""Optional OpenTelemetry tracing, end to end: the gateway (its own process)
exports server spans over OTLP/HTTP to a receiver on loopback.

The receiver is the test's own: no OpenTelemetry collector can be installed
here. It decodes what the real OTLP exporter sends with OpenTelemetry's own
protobuf definitions (opentelemetry-proto).
"""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from support import BUILTIN_REST_CONFIG, SIMPLE_INFER_REQUEST, GatewayProcess, wait_for, write_config

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class OtlpReceiver:
    """Collects the spans POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                export = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for resource_spans in export.resource_spans:
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend((resource_spans.resource, s) for s in scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def span(self, request_id: str) -> tuple[Any, Any]:
        def find() -> tuple[Any, Any] | None:
            with self.lock:
                for resource, span in self.spans:
                    attributes = {a.key: a.value for a in span.attributes}
                    if attributes["gateway.request_id"].string_value == request_id:
                        return resource, span
            return None

        return wait_for(find, 10, f"the span of request {request_id}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture(scope="module")
def traced_gateway(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("traced")
    config = BUILTIN_REST_CONFIG + f"""
observability:
  tracing: {{enabled: true, endpoint: "{receiver.endpoint}", service_name: gw-under-test}}
"""
    process = GatewayProcess(write_config(directory, config), directory / "gateway.log",
                             extra_env={"OTEL_BSP_SCHEDULE_DELAY": "100"})  # export spans every 100 ms
    with process:
        yield process


def attributes(span: Any) -> dict[str, Any]:
    values = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        values[item.key] = getattr(item.value, kind)
    return values


def test_server_span_continues_the_client_trace(traced_gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    reply = requests.post(f"http://{traced_gateway.url()}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST,
                          headers={"traceparent": traceparent, "tracestate": "vendor=x", "x-request-id": "traced-1"},
                          timeout=5)
    assert reply.status_code == 200
    version, trace, span_id, flags = reply.headers["traceparent"].split("-")
    # the same trace; the gateway's own span is what goes upstream and comes back
    assert (version, trace, flags) == ("00", CLIENT_TRACE, "01") and span_id != CLIENT_SPAN
    assert reply.headers["tracestate"] == "vendor=x"
    resource, span = receiver.span("traced-1")
    assert span.trace_id.hex() == CLIENT_TRACE and span.parent_span_id.hex() == CLIENT_SPAN
    assert span.span_id.hex() == span_id
    assert span.name == "v2-rest infer" and span.kind == span.SPAN_KIND_SERVER
    found = attributes(span)
    assert (found["gateway.model"], found["gateway.route"], found["gateway.upstream"]) == ("simple", "route-0", "local")
    assert (found["gateway.status"], found["gateway.outcome"], found["gateway.upstream_attempts"]) == ("200", "ok", 1)
    assert span.status.code != span.status.STATUS_CODE_ERROR
    service = {a.key: a.value.string_value for a in resource.attributes}
    assert service["service.name"] == "gw-under-test"


def test_new_trace_and_error_status(traced_gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    reply = requests.post(f"http://{traced_gateway.url()}/v2/models/nope/infer", json=SIMPLE_INFER_REQUEST,
                          headers={"x-request-id": "traced-2"}, timeout=5)
    assert reply.status_code == 404
    _, trace, span_id, _ = reply.headers["traceparent"].split("-")
    _, span = receiver.span("traced-2")
    assert span.trace_id.hex() == trace and span.span_id.hex() == span_id and not span.parent_span_id
    assert span.status.code == span.status.STATUS_CODE_ERROR
    assert attributes(span)["gateway.outcome"] == "model_not_found"


def test_tracing_config_is_checked(tmp_path: Path) -> None:
    base = {"listeners": [], "upstreams": [], "routes": []}
    with pytest.raises(ConfigError, match="sample_ratio: must be between 0 and 1"):
        parse_config({**base, "observability": {"tracing": {"enabled": True, "sample_ratio": 2}}})
    with pytest.raises(ConfigError, match=r"tracing\.exporter: unknown key"):
        parse_config({**base, "observability": {"tracing": {"exporter": "jaeger"}}})
    assert not parse_config(base).observability.tracing.enabled  # off by default
