"""The gateway in its own process: request ids, access log, /metrics, /config,
checked with promtool and scraped by a real Prometheus server."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from peers.prometheus import PrometheusServer, promtool
from support import (
    BUILTIN_REST_CONFIG,
    JSON_ACCESS_LOG_CONFIG,
    SIMPLE_INFER_REQUEST,
    GatewayProcess,
    wait_for,
    write_config,
)

SECRET = "s3cr3t-value-never-shown"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# The builtin config with a first route whose header matcher holds a secret.
CONFIG = BUILTIN_REST_CONFIG.replace("routes:\n", """routes:
  - match: {model: simple, headers: {x-api-key: "${GW_TEST_SECRET}"}}
    upstream: local
""")
SIMPLE = SIMPLE_INFER_REQUEST


class Gateway:
    def __init__(self, process: GatewayProcess, access_log: Path) -> None:
        self.process = process
        self.access_log = access_log
        self.rest = f"http://{process.url('rest')}"
        self.admin = f"http://{process.url('admin')}"

    def log_lines(self, *request_ids: str) -> list[dict[str, Any]]:
        """All access-log lines, once those of ``request_ids`` are there."""
        def lines() -> list[dict[str, Any]]:
            text = self.access_log.read_text() if self.access_log.exists() else ""
            return [json.loads(line) for line in text.splitlines()]

        def complete() -> list[dict[str, Any]] | None:
            found = lines()
            return found if set(request_ids) <= {line["request_id"] for line in found} else None

        # a line is written once the response has left, a moment after the client saw it
        return wait_for(complete, 5, f"access-log lines of {request_ids}")  # type: ignore[no-any-return]

    def metrics(self) -> str:
        response = requests.get(f"{self.admin}/metrics", timeout=5)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.text


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("obs")
    access_log = directory / "access.jsonl"
    config = write_config(directory, CONFIG + JSON_ACCESS_LOG_CONFIG.format(log=access_log))
    with GatewayProcess(config, directory / "gateway.log", extra_env={"GW_TEST_SECRET": SECRET}) as process:
        yield Gateway(process, access_log)


def counter_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


def mixed_traffic(gateway: Gateway) -> dict[str, int]:
    """Requests of every kind the REST listener serves; returns counts by outcome."""
    rest = gateway.rest
    sent = {"ok": 0, "model_not_found": 0, "malformed_request": 0, "invalid_input": 0}
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/identity", "/v2/models/simple/ready"):
        assert requests.get(rest + path, timeout=5).status_code == 200
        sent["ok"] += 1
    for _ in range(3):
        assert requests.post(f"{rest}/v2/models/simple/infer", json=SIMPLE, timeout=5).status_code == 200
        sent["ok"] += 1
    body = gzip.compress(json.dumps(SIMPLE).encode())
    reply = requests.post(f"{rest}/v2/models/simple/infer", data=body, timeout=5,
                          headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert reply.status_code == 200
    sent["ok"] += 1
    with httpclient.InferenceServerClient(gateway.process.url("rest")) as client:  # binary tensors
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for item in inputs:
            item.set_data_from_numpy(a)
        client.infer("simple", inputs)
        sent["ok"] += 1
    assert requests.post(f"{rest}/v2/models/nope/infer", json=SIMPLE, timeout=5).status_code == 404
    sent["model_not_found"] += 1
    assert requests.post(f"{rest}/v2/models/simple/infer", data=b"{", timeout=5).status_code == 400
    sent["malformed_request"] += 1
    bad_shape = {"inputs": [{**SIMPLE["inputs"][0], "shape": [2, 16]}, SIMPLE["inputs"][1]]}
    assert requests.post(f"{rest}/v2/models/simple/infer", json=bad_shape, timeout=5).status_code == 400
    sent["invalid_input"] += 1
    return sent


def test_request_id_and_trace_context_echoed_on_every_answer(gateway: Gateway) -> None:
    calls = [("GET", "/v2/health/live"), ("GET", "/v2"), ("POST", "/v2/models/simple/infer"),
             ("POST", "/v2/models/nope/infer"), ("GET", "/no/such/path"), ("PUT", "/v2")]
    for i, (method, path) in enumerate(calls):
        headers = {"x-request-id": f"client-id-{i}", "traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}
        reply = requests.request(method, gateway.rest + path, json=SIMPLE, headers=headers, timeout=5)
        assert reply.headers["x-request-id"] == f"client-id-{i}", (method, path, reply.status_code)
        assert reply.headers["traceparent"] == TRACEPARENT
        assert reply.headers["tracestate"] == "vendor=opaque"
    generated = {requests.get(gateway.rest + "/v2/health/live", timeout=5).headers["x-request-id"] for _ in range(3)}
    assert len(generated) == 3 and all(re.fullmatch(r"[0-9a-f]{32}", g) for g in generated)
    hostile = requests.get(gateway.rest + "/v2", headers={"x-request-id": "x" * 500, "traceparent": "junk"},
                           timeout=5)
    assert len(hostile.headers["x-request-id"]) == 32 and "traceparent" not in hostile.headers
    logged = {line["request_id"]: line for line in gateway.log_lines(
        *(f"client-id-{i}" for i in range(len(calls))), *generated)}
    for i, (_method, path) in enumerate(calls):
        line = logged[f"client-id-{i}"]
        assert line["trace_id"] == TRACEPARENT[3:35] and line["path"] == path
    assert logged["client-id-3"]["status"] == "404" and logged["client-id-3"]["outcome"] == "model_not_found"
    assert logged["client-id-4"]["operation"] == "unmatched"
    assert generated <= set(logged)


def test_access_log_line_per_request_without_tensor_data(gateway: Gateway) -> None:
    marker = 987654321
    payload = {"id": "body-id", "inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [3],
                                            "data": [marker, marker + 1, marker + 2]}]}
    body = json.dumps(payload).encode()
    reply = requests.post(f"{gateway.rest}/v2/models/identity/infer", data=body,
                          headers={"x-request-id": "tensor-check", "x-api-key": SECRET}, timeout=5)
    assert reply.status_code == 200 and str(marker) in reply.text
    lines = [line for line in gateway.log_lines("tensor-check") if line["request_id"] == "tensor-check"]
    assert len(lines) == 1
    line = lines[0]
    assert (line["listener"], line["protocol"], line["operation"]) == ("rest", "v2-rest", "infer")
    assert (line["model"], line["route"], line["upstream"], line["attempts"]) == ("identity", "route-1", "local", 1)
    assert (line["status"], line["outcome"], line["method"]) == ("200", "ok", "POST")
    # sizes on the wire (this small answer is sent uncompressed although requests accepts gzip)
    assert "Content-Encoding" not in reply.headers
    assert line["request_bytes"] == len(body) and line["response_bytes"] == int(reply.headers["Content-Length"])
    assert line["duration_ms"] >= line["upstream_ms"] > 0 and line["decode_ms"] > 0 and line["encode_ms"] > 0
    raw = gateway.access_log.read_text()
    assert str(marker) not in raw and SECRET not in raw


def test_promtool_accepts_metrics_after_mixed_traffic(gateway: Gateway) -> None:
    before = gateway.metrics()
    sent = mixed_traffic(gateway)
    wait_for(lambda: sum(counter_values(gateway.metrics(), "gateway_requests_total").values())
             >= sum(counter_values(before, "gateway_requests_total").values()) + sum(sent.values()), 5,
             "the last request to be counted")
    text = gateway.metrics()
    result = promtool("check", "metrics", stdin=text.encode())
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    after, earlier = counter_values(text, "gateway_requests_total"), counter_values(before, "gateway_requests_total")
    for outcome, count in sent.items():
        delta = sum(v - earlier.get(k, 0) for k, v in after.items() if dict(k)["outcome"] == outcome)
        assert delta == count, outcome
    infer_ok = {k: v for k, v in after.items() if dict(k)["operation"] == "infer" and dict(k)["outcome"] == "ok"}
    assert all(dict(k)["upstream"] == "local" for k in infer_ok)
    names = {family.name for family in text_string_to_metric_families(text)}
    for name in ("gateway_request_duration_seconds", "gateway_upstream_request_duration_seconds",
                 "gateway_request_size_bytes", "gateway_response_size_bytes", "gateway_translation_duration_seconds",
                 "gateway_requests_in_flight", "gateway_build_info", "gateway_endpoint_healthy",
                 "gateway_config_last_reload_success_timestamp_seconds", "process_resident_memory_bytes"):
        assert name in names, name


def test_config_endpoint_shows_effective_config_without_secrets(gateway: Gateway) -> None:
    reply = requests.get(f"{gateway.admin}/config", timeout=5)
    assert reply.status_code == 200
    assert SECRET not in reply.text
    shown = reply.json()
    assert shown["routes"][0]["match"]["headers"] == {"x-api-key": "<redacted>"}
    assert shown["observability"]["access_log"]["format"] == "json"
    assert shown["limits"]["max_request_bytes"] == 64 << 20  # defaults filled in
    index = requests.get(f"{gateway.admin}/", timeout=5).json()["endpoints"]
    assert {"/healthz", "/readyz", "/metrics", "/config", "/routes"} <= set(index)
    assert requests.get(f"{gateway.admin}/healthz", timeout=5).json() == {"live": True}
    assert requests.get(f"{gateway.admin}/readyz", timeout=5).json() == {"ready": True}


def test_prometheus_scrapes_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    mixed_traffic(gateway)
    with PrometheusServer(tmp_path, [gateway.process.url("admin")]) as prometheus:
        def scraped() -> Any:
            result = prometheus.query('gateway_requests_total{operation="infer",outcome="ok",model="simple"}')
            return result["status"] == "success" and result["data"]["result"]

        series = wait_for(scraped, 30, "Prometheus to scrape the gateway", interval=0.5)
        labels = series[0]["metric"]
        assert labels["job"] == "gateway" and labels["instance"] == gateway.process.url("admin")
        assert (labels["listener"], labels["protocol"], labels["upstream"], labels["http_code"]) == \
            ("rest", "v2-rest", "local", "200")
        assert "grpc_code" not in labels  # empty in the exposition, so absent in Prometheus
        assert labels["route"] in ("route-0", "route-1") and float(series[0]["value"][1]) >= 5
        up = prometheus.query('up{job="gateway"}')["data"]["result"]
        assert up[0]["value"][1] == "1"
        # every query of the Grafana dashboard is valid PromQL and finds data
        for expr in dashboard_queries():
            result = prometheus.query(expr.replace("$__rate_interval", "30s").replace("$instance", ".*"))
            assert result["status"] == "success", (expr, result)


def dashboard_queries() -> list[str]:
    from support import REPO

    dashboard = json.loads((REPO / "deploy/grafana/inference-gateway-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]

