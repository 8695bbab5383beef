"""One gateway process with all four listeners — V2 REST, V2 gRPC, UM-Bridge,
GraphStorm — under mixed traffic from real clients (requests, tritonclient.grpc
and grpcio, umbridge.HTTPModel, GraphStorm payloads): the request counter
equals what was sent, label for label; promtool accepts /metrics; a real
Prometheus server sees every protocol; the access log has one line per
request with the client's request id; gRPC echoes the ids in its trailing
metadata.

The traffic is sent once (module fixture) and every test reads its results,
so the counts are exact."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import requests
import tritonclient.grpc as grpcclient
import umbridge
from graphstorm_payloads import JSON, changed, movielens
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from peers.prometheus import PrometheusServer, promtool
from support import JSON_ACCESS_LOG_CONFIG, REPO, SIMPLE_INFER_REQUEST, GatewayProcess, wait_for, write_config

# The embedded default configuration (all four listeners, builtin models),
# every address on loopback port 0.
CONFIG = re.sub(r'address: "[0-9.]+:[0-9]+"', 'address: "127.0.0.1:0"',
                (REPO / "gateway/config/default.yaml").read_text())
PROTOCOLS = {"rest": "v2-rest", "grpc": "v2-grpc", "umbridge": "umbridge", "graphstorm": "graphstorm"}
TRACEPARENT = "00-5bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b8-01"
TRACESTATE = "vendor=listeners"
# Labels of gateway_requests_total that the test predicts exactly (route and
# upstream also depend on metadata caching; they are checked on successes).
KEY_LABELS = ("listener", "protocol", "operation", "model", "http_code", "grpc_code", "outcome")
# docs/observability.md, "Cardinality": every series of /metrics after this
# traffic (1,467 measured, 288 of them gateway_overhead_seconds; 1,709 before
# the histograms were trimmed).
MAX_SERIES = 1550


@dataclass
class Ledger:
    """What the clients sent and saw."""

    expected: Counter[tuple[str, ...]] = field(default_factory=Counter)
    # request id -> (listener, operation, status, outcome) as the access log should show it
    by_id: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)
    anonymous: Counter[str] = field(default_factory=Counter)  # requests whose client sends no id, by listener
    trailing: dict[str, dict[str, str]] = field(default_factory=dict)  # gRPC request id -> trailing metadata

    def sent(self, listener: str, operation: str, model: str, code: int | str, outcome: str,
             request_id: str | None = None) -> None:
        codes = ("", str(code)) if listener == "grpc" else (str(code), "")  # http_code, grpc_code
        self.expected[(listener, PROTOCOLS[listener], operation, model, *codes, outcome)] += 1
        if request_id is None:
            self.anonymous[listener] += 1
        else:
            assert request_id not in self.by_id
            self.by_id[request_id] = (listener, operation, str(code), outcome)

    def new_id(self, listener: str) -> str:
        return f"{listener}-{len(self.by_id)}"


def ids(request_id: str) -> dict[str, str]:
    return {"x-request-id": request_id, "traceparent": TRACEPARENT, "tracestate": TRACESTATE}


class Http:
    """An HTTP listener's client: every request carries a fresh id and the
    trace context, and must come back with them."""

    def __init__(self, ledger: Ledger, listener: str, base: str, session: requests.Session) -> None:
        self.ledger, self.listener, self.base, self.session = ledger, listener, base, session

    def call(self, method: str, path: str, status: int, operation: str, model: str, outcome: str,
             code: int | None = None, **kwargs: Any) -> requests.Response:
        request_id = self.ledger.new_id(self.listener)
        reply = self.session.request(method, self.base + path, headers={**kwargs.pop("headers", {}), **ids(request_id)},
                                     timeout=30, **kwargs)
        assert reply.status_code == status, (path, reply.text)
        assert (reply.headers["x-request-id"], reply.headers["traceparent"]) == (request_id, TRACEPARENT)
        self.ledger.sent(self.listener, operation, model, code or status, outcome, request_id)
        return reply


def rest_traffic(ledger: Ledger, http: Http) -> None:
    http.call("GET", "/v2/health/ready", 200, "ready", "", "ok")
    for _ in range(2):
        http.call("POST", "/v2/models/simple/infer", 200, "infer", "simple", "ok", json=SIMPLE_INFER_REQUEST)
    http.call("POST", "/v2/models/nope/infer", 404, "infer", "__unknown__", "model_not_found",
              json=SIMPLE_INFER_REQUEST)
    # a body that does not parse: counted under the model the path names (routed first)
    http.call("POST", "/v2/models/simple/infer", 400, "infer", "simple", "malformed_request", data=b"{")


def umbridge_traffic(ledger: Ledger, http: Http) -> None:
    # The reference client: GET /Info and POST /ModelInfo when made, then its calls.
    # It sends no request id, so the gateway generates them.
    model = umbridge.HTTPModel(http.base, "forward")
    ledger.sent("umbridge", "info", "", 200, "ok")
    ledger.sent("umbridge", "model_info", "forward", 200, "ok")
    assert model([[1.0, 2.0], [3.0]]) == [[3.0, 3.0, 4.0]]
    ledger.sent("umbridge", "evaluate", "forward", 200, "ok")
    assert model.gradient(0, 0, [[1.0, 2.0], [3.0]], [1.0, 1.0, 1.0]) == [4.0, 5.0]
    ledger.sent("umbridge", "gradient", "forward", 200, "ok")
    assert len(model.apply_hessian(0, 0, 1, [[1.0, 2.0], [3.0]], [1.0, 1.0, 1.0], [1.0])) == 2
    ledger.sent("umbridge", "apply_hessian", "forward", 200, "ok")
    with pytest.raises(Exception, match="InvalidInput"):
        model([[1.0, 2.0, 3.0], [3.0]])
    ledger.sent("umbridge", "evaluate", "forward", 400, "invalid_input")
    # Error kinds the reference client cannot provoke (it checks names and features itself).
    http.call("POST", "/Evaluate", 400, "evaluate", "__unknown__", "model_not_found",
              json={"name": "nope", "input": [[1.0, 2.0], [3.0]]})
    http.call("POST", "/Gradient", 400, "gradient", "simple", "unsupported",
              json={"name": "simple", "inWrt": 0, "outWrt": 0, "sens": [1.0], "input": [[1.0]]})
    http.call("POST", "/Evaluate", 400, "evaluate", "", "malformed_request", data=b"{")
    http.call("GET", "/NoSuchPath", 404, "unmatched", "", "unsupported")


def graphstorm_traffic(ledger: Ledger, http: Http) -> None:
    def invoke(payload: Any, code: int, model: str, outcome: str, content_type: str = "application/json") -> None:
        reply = http.call("POST", "/invocations", 200, "invocations", model, outcome, code=code,
                          data=orjson.dumps(payload), headers={"Content-Type": content_type})
        assert reply.json()["status_code"] == code  # GraphStorm: HTTP 200, the code in the body

    http.call("GET", "/ping", 200, "ping", "", "ok")
    for _ in range(2):
        invoke(movielens(), 200, "gnn", "ok")
    invoke(changed(movielens(), lambda p: p.update(gml_task="link_prediction")), 421, "gnn", "unsupported")
    invoke(changed(movielens(), lambda p: p["graph"]["nodes"][0].update(node_type="alien")), 411, "gnn",
           "invalid_input")
    invoke(changed(movielens(), lambda p: p.pop("targets")), 401, "gnn", "malformed_request")
    invoke(movielens([("movie", "m999")]), 404, "gnn", "invalid_input")
    invoke(movielens(), 400, "gnn", "malformed_request", content_type="text/plain")  # routed first
    http.call("GET", "/nope", 404, "unmatched", "", "unsupported", headers=JSON)


def infer_inputs(*names: str) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in names]
    for item in inputs:
        item.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    return inputs


def grpc_traffic(ledger: Ledger, address: str) -> None:
    def raw_call(method: str, message: Any, code: grpc.StatusCode, operation: str, model: str,
                 outcome: str) -> None:
        """One call through grpcio, keeping the trailing metadata."""
        request_id = ledger.new_id("grpc")
        rpc = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # bytes in, bytes out
        data = message if isinstance(message, bytes) else message.SerializeToString()
        try:
            _, call = rpc.with_call(data, metadata=tuple(ids(request_id).items()), timeout=10)
            trailing, seen = call.trailing_metadata(), grpc.StatusCode.OK
        except grpc.RpcError as error:
            trailing, seen = error.trailing_metadata(), error.code()
        assert seen == code, (method, seen)
        ledger.trailing[request_id] = dict(trailing or ())
        ledger.sent("grpc", operation, model, code.name, outcome, request_id)

    def triton_call(model: str, names: tuple[str, ...], code: str, outcome: str, label: str) -> None:
        request_id = ledger.new_id("grpc")
        try:
            client.infer(model, infer_inputs(*names), headers=ids(request_id))
            seen = "OK"
        except InferenceServerException as error:
            seen = str(error.status()).removeprefix("StatusCode.")
        assert seen == code, (model, seen)
        ledger.sent("grpc", "infer", label, code, outcome, request_id)

    with grpc.insecure_channel(address) as channel, grpcclient.InferenceServerClient(address) as client:
        both = ("INPUT0", "INPUT1")
        raw_call("ServerLive", service_pb2.ServerLiveRequest(), grpc.StatusCode.OK, "live", "", "ok")
        infer = service_pb2.ModelInferRequest(model_name="simple", raw_input_contents=[
            np.arange(16, dtype=np.int32).tobytes(), np.ones(16, dtype=np.int32).tobytes()])
        for name in both:
            infer.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        raw_call("ModelInfer", infer, grpc.StatusCode.OK, "infer", "simple", "ok")
        raw_call("ModelMetadata", service_pb2.ModelMetadataRequest(name="nope"), grpc.StatusCode.NOT_FOUND,
                 "model_metadata", "__unknown__", "model_not_found")
        raw_call("ModelMetadata", b"\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "model_metadata", "",
                 "malformed_request")
        for _ in range(2):
            triton_call("simple", both, "OK", "ok", "simple")
        triton_call("nope", both, "NOT_FOUND", "model_not_found", "__unknown__")
        triton_call("simple", ("INPUT0",), "INVALID_ARGUMENT", "invalid_input", "simple")
        request_id = ledger.new_id("grpc")
        with pytest.raises(InferenceServerException, match="UNIMPLEMENTED"):
            client.load_model("simple", headers=ids(request_id))
        ledger.sent("grpc", "repository_model_load", "", "UNIMPLEMENTED", "unsupported", request_id)


@dataclass
class Run:
    process: GatewayProcess
    access_log: Path
    ledger: Ledger

    def metrics(self) -> str:
        reply = requests.get(f"http://{self.process.url('admin')}/metrics", timeout=5)
        assert reply.status_code == 200
        return reply.text

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.access_log.read_text().splitlines()]


def requests_total(text: str) -> list[Any]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "gateway_requests_total"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    directory = tmp_path_factory.mktemp("listeners")
    access_log = directory / "access.jsonl"
    assert set(re.findall(r'address: "([^"]*)"', CONFIG)) == {"127.0.0.1:0"}  # loopback only
    config = write_config(directory, CONFIG + JSON_ACCESS_LOG_CONFIG.format(log=access_log))
    with GatewayProcess(config, directory / "gateway.log") as process, requests.Session() as session:
        ledger = Ledger()
        url = process.url
        rest_traffic(ledger, Http(ledger, "rest", f"http://{url('rest')}", session))
        umbridge_traffic(ledger, Http(ledger, "umbridge", f"http://{url('umbridge')}", session))
        graphstorm_traffic(ledger, Http(ledger, "graphstorm", f"http://{url('graphstorm')}", session))
        grpc_traffic(ledger, url("grpc"))
        result = Run(process, access_log, ledger)
        total = sum(ledger.expected.values())
        # a request is recorded once its answer has left, a moment after the client saw it
        wait_for(lambda: sum(s.value for s in requests_total(result.metrics())) >= total
                 and len(result.log_lines()) >= total, 5, "every request to be recorded")
        yield result


def test_request_counter_matches_the_traffic_label_for_label(run: Run) -> None:
    counted: Counter[tuple[str, ...]] = Counter()
    for sample in requests_total(run.metrics()):
        counted[tuple(sample.labels[label] for label in KEY_LABELS)] += int(sample.value)
    assert counted == run.ledger.expected
    # Each protocol's successful inference names its route and upstream.
    successes = {(s.labels["listener"], s.labels["operation"]): (s.labels["route"], s.labels["upstream"])
                 for s in requests_total(run.metrics()) if s.labels["outcome"] == "ok"}
    assert successes[("rest", "infer")] == successes[("grpc", "infer")] == ("route-2", "local")
    assert successes[("umbridge", "evaluate")] == ("route-2", "local")
    assert successes[("graphstorm", "invocations")] == ("route-0", "local")
    assert successes[("umbridge", "info")][0] == ""  # a listing names no route


def test_promtool_accepts_the_metrics(run: Run) -> None:
    text = run.metrics()
    result = promtool("check", "metrics", stdin=text.encode())
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    translated = {(s.labels["protocol"], s.labels["stage"]) for family in text_string_to_metric_families(text)
                  for s in family.samples
                  if s.name == "gateway_translation_duration_seconds_count" and s.labels["side"] == "frontend"}
    assert translated == {(protocol, stage) for protocol in PROTOCOLS.values() for stage in ("decode", "encode")}


def test_series_count_within_the_documented_figure(run: Run) -> None:
    text = run.metrics()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert len(samples) <= MAX_SERIES, len(samples)
    # only the end-to-end latency histogram is per model; sizes are per operation
    for sample in samples:
        if sample.name.startswith(("gateway_request_size_bytes", "gateway_response_size_bytes")):
            assert set(sample.labels) <= {"listener", "protocol", "operation", "le"}, sample


def test_access_log_has_one_line_per_request_with_the_clients_id(run: Run) -> None:
    lines = run.log_lines()
    ledger = run.ledger
    assert Counter(line["listener"] for line in lines) == Counter(key[0] for key in ledger.expected.elements())
    by_id = {line["request_id"]: line for line in lines}
    assert len(by_id) == len(lines)  # ids are unique: no request logged twice
    for request_id, (listener, operation, status, outcome) in ledger.by_id.items():
        line = by_id[request_id]
        assert (line["listener"], line["protocol"], line["operation"], line["status"], line["outcome"]) == \
            (listener, PROTOCOLS[listener], operation, status, outcome), request_id
        assert line["trace_id"] == TRACEPARENT[3:35]
        assert ("error" in line) == (outcome != "ok")
    anonymous = Counter(line["listener"] for line in lines if line["request_id"] not in ledger.by_id)
    assert anonymous == ledger.anonymous  # the reference UM-Bridge client's calls, with generated ids


def test_grpc_echoes_request_id_and_trace_context_in_trailing_metadata(run: Run) -> None:
    assert len(run.ledger.trailing) == 4  # a success, an inference, a lookup failure, a malformed message
    for request_id, trailing in run.ledger.trailing.items():
        assert trailing.get("x-request-id") == request_id
        assert (trailing.get("traceparent"), trailing.get("tracestate")) == (TRACEPARENT, TRACESTATE)


def test_prometheus_scrapes_every_protocol(run: Run, tmp_path: Path) -> None:
    sent: Counter[str] = Counter()
    for key, count in run.ledger.expected.items():
        sent[key[1]] += count
    with PrometheusServer(tmp_path, [run.process.url("admin")]) as prometheus:
        def scraped() -> dict[str, float] | None:
            result = prometheus.query("sum by (protocol) (gateway_requests_total)")
            found = {r["metric"]["protocol"]: float(r["value"][1]) for r in result["data"]["result"]}
            return found if set(found) == set(PROTOCOLS.values()) else None

        assert wait_for(scraped, 20, "Prometheus to scrape every protocol", interval=0.5) == sent
        series = prometheus.query('gateway_requests_total{protocol="graphstorm",http_code="421"}')["data"]["result"]
        assert len(series) == 1
        labels = series[0]["metric"]
        assert (labels["job"], labels["listener"], labels["operation"], labels["model"], labels["outcome"]) == \
            ("gateway", "graphstorm", "invocations", "gnn", "unsupported")
        grpc_series = prometheus.query('gateway_requests_total{protocol="v2-grpc",operation="infer",outcome="ok"}')
        assert float(grpc_series["data"]["result"][0]["value"][1]) == 3
