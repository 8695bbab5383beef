"""The series a model and an upstream cost stay within the bound
docs/observability.md ("Cardinality") gives: one gateway with V2 REST, V2 gRPC
and UM-Bridge listeners, two models routed to two upstreams, a mix of
successes and errors per protocol; then /metrics is counted, series by series.

Per model: SERIES_PER_OPERATION (the latency histogram) for each (listener,
operation) it is used on, plus one counter series per distinct answer (route,
upstream, status, outcome). Per upstream: the upstream histogram for each
operation forwarded, four per-upstream series, and per endpoint its health,
ejections and one counter series per attempt outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

from gateway.observability.metrics import LATENCY_BUCKETS
from support import SIMPLE_INFER_REQUEST, GatewayProcess, wait_for, write_config

# Buckets, +Inf, _sum and _count: the documented cost of one latency histogram.
SERIES_PER_OPERATION = 22
# Per upstream, whatever its traffic: in-flight, retries, timeouts, breaker rejections.
SERIES_PER_UPSTREAM = 4
# Per endpoint: gateway_endpoint_healthy and gateway_outlier_ejections_total.
SERIES_PER_ENDPOINT = 2

CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
  - {name: umbridge, protocol: umbridge, address: "127.0.0.1:0"}
upstreams:
  - {name: first, protocol: builtin}
  - {name: second, protocol: builtin}
routes:
  - {name: simple-route, match: {model: simple}, upstream: first}
  - {name: forward-route, match: {model: forward}, upstream: second}
"""
MODELS = {"simple": ("simple-route", "first"), "forward": ("forward-route", "second")}
UMBRIDGE_INPUT = [[1.0, 2.0], [3.0]]


def traffic(gateway: GatewayProcess) -> int:
    """A mix per protocol: successes, client errors, metadata, an unknown model. Returns the requests sent."""
    rest, umbridge = f"http://{gateway.url('rest')}", f"http://{gateway.url('umbridge')}"
    sent = 0
    with requests.Session() as http:
        def call(method: str, url: str, status: int, **kwargs: object) -> None:
            nonlocal sent
            assert http.request(method, url, timeout=10, **kwargs).status_code == status, url  # type: ignore[arg-type]
            sent += 1

        for _ in range(3):
            call("POST", f"{rest}/v2/models/simple/infer", 200, json=SIMPLE_INFER_REQUEST)
        call("POST", f"{rest}/v2/models/simple/infer", 400, data=b"{")
        call("GET", f"{rest}/v2/models/simple", 200)
        call("GET", f"{rest}/v2/models/simple/ready", 200)
        call("GET", f"{rest}/v2/models/forward", 200)
        call("POST", f"{rest}/v2/models/nope/infer", 404, json=SIMPLE_INFER_REQUEST)
        call("GET", f"{rest}/v2/health/ready", 200)
        for _ in range(3):
            call("POST", f"{umbridge}/Evaluate", 200, json={"name": "forward", "input": UMBRIDGE_INPUT})
        call("POST", f"{umbridge}/Evaluate", 400, json={"name": "forward", "input": [[1.0], [3.0]]})
        call("POST", f"{umbridge}/ModelInfo", 200, json={"name": "forward"})
        call("POST", f"{umbridge}/InputSizes", 200, json={"name": "forward"})
    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
        request = service_pb2.ModelInferRequest(model_name="simple", raw_input_contents=[
            np.arange(16, dtype=np.int32).tobytes(), np.ones(16, dtype=np.int32).tobytes()])
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        for _ in range(2):
            infer(request, timeout=10)
        sent += 2
        request.inputs.pop()
        request.raw_input_contents.pop()
        with pytest.raises(grpc.RpcError) as failed:
            infer(request, timeout=10)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        sent += 1
    return sent


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, dict[str, str]]]]:
    """Every series of /metrics after the traffic, as (sample name, labels)."""
    directory = tmp_path_factory.mktemp("cardinality")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gateway:
        sent = traffic(gateway)

        def scrape() -> list[tuple[str, dict[str, str]]] | None:
            text = requests.get(f"http://{gateway.url('admin')}/metrics", timeout=5).text
            samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
            answered = sum(s.value for s in samples if s.name == "gateway_requests_total")
            # a request is recorded a moment after its answer left
            return [(s.name, s.labels) for s in samples] if answered >= sent else None

        yield wait_for(scrape, 5, "every request to be recorded")


def test_the_documented_figure_per_histogram() -> None:
    assert SERIES_PER_OPERATION == len(LATENCY_BUCKETS) + 3


@pytest.mark.parametrize("model", sorted(MODELS))
def test_series_per_model_within_the_bound(series: list[tuple[str, dict[str, str]]], model: str) -> None:
    mine = [(name, labels) for name, labels in series if labels.get("model") == model]
    answers = [labels for name, labels in mine if name == "gateway_requests_total"]
    operations = {(labels["listener"], labels["operation"]) for labels in answers}
    bound = SERIES_PER_OPERATION * len(operations) + len(answers)
    assert len(mine) <= bound, Counter(name for name, _ in mine)
    # the traffic used the model on several operations, through its own route and upstream only
    assert len(operations) >= 3
    assert {(labels["route"], labels["upstream"]) for labels in answers} <= {MODELS[model], (MODELS[model][0], "")}
    # only the end-to-end latency histogram carries the model
    assert {name for name, _ in mine} == {"gateway_requests_total", "gateway_request_duration_seconds_bucket",
                                          "gateway_request_duration_seconds_sum",
                                          "gateway_request_duration_seconds_count"}


@pytest.mark.parametrize("upstream", ["first", "second"])
def test_series_per_upstream_within_the_bound(series: list[tuple[str, dict[str, str]]], upstream: str) -> None:
    mine = [(name, labels) for name, labels in series if labels.get("upstream") == upstream and "model" not in labels]
    operations = {labels["operation"] for name, labels in mine
                  if name == "gateway_upstream_request_duration_seconds_count"}
    endpoints = {labels["endpoint"] for name, labels in mine if "endpoint" in labels}
    attempts = [labels for name, labels in mine if name == "gateway_upstream_requests_total"]
    passthrough = [labels for name, labels in mine if name == "gateway_passthrough_requests_total"]
    assert len(operations) >= 2 and endpoints == {"in-process"}  # the builtin upstream's one endpoint
    bound = (SERIES_PER_OPERATION * len(operations) + SERIES_PER_UPSTREAM + SERIES_PER_ENDPOINT * len(endpoints)
             + len(attempts) + len(passthrough))
    assert len(mine) <= bound, Counter(name for name, _ in mine)


def test_codes_are_split_by_protocol(series: list[tuple[str, dict[str, str]]]) -> None:
    answers = [labels for name, labels in series if name == "gateway_requests_total"]
    assert answers and all("code" not in labels for labels in answers)
    for labels in answers:
        if labels["protocol"] == "v2-grpc":
            assert labels["http_code"] == "" and labels["grpc_code"] in ("OK", "INVALID_ARGUMENT"), labels
        else:
            assert labels["grpc_code"] == "" and labels["http_code"].isdigit(), labels


def test_bucket_series_per_family(series: list[tuple[str, dict[str, str]]]) -> None:
    """Histograms whose labels do not grow with models: their children are bounded by the config."""
    children: Counter[str] = Counter(name.removesuffix("_count") for name, _ in series if name.endswith("_count"))
    assert children["gateway_request_size_bytes"] == children["gateway_response_size_bytes"]
    # one per (listener, operation) seen: 3 + 1 + 3 + 1 (REST, gRPC, UM-Bridge; ready)
    sizes = {(labels["listener"], labels["operation"]) for name, labels in series
             if name == "gateway_request_size_bytes_count"}
    answered = {(labels["listener"], labels["operation"]) for name, labels in series
                if name == "gateway_requests_total"}
    assert sizes == answered
