"""The payload_log filter against a real CloudEvents sink (its own process,
parsing with the `cloudevents` SDK): requests over V2 REST, V2 gRPC
(tritonclient) and V1 REST become request and response events that pair
by ce-id = the request id, with V2 JSON bodies equal to the tensors sent
and answered; big tensors are logged as metadata only; mode and sample pick
what is logged; a dead sink, a sink that never answers and a full queue
leave requests as fast as without the policy, and are counted in
gateway_payload_log_total."""

from __future__ import annotations

import asyncio
import json
import queue
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from peers.echo_upstream import EchoServer
from support import REPO, GatewayProcess, free_port, metric_value, scrape_metrics, stop_process, wait_for, write_config

TESTS = REPO / "tests"
SERVER = "inference-gateway"  # server.name's default: the gateway in ce-source
SLOW_SINK_TIMEOUT = "3s"  # a sender that waited for the hung sink on the request path would add this


class SinkProcess:
    """peers/cloudevents_sink.py in its own process."""

    def __init__(self, directory: Path, hang: bool = False) -> None:
        port_file = directory / ("hung-sink.port" if hang else "sink.port")
        self.proc = subprocess.Popen([sys.executable, "-m", "peers.cloudevents_sink", str(port_file),
                                      *(["--hang"] if hang else [])], cwd=TESTS)
        self.port = int(wait_for(lambda: port_file.exists() and port_file.read_text(), 20, "the sink's port"))

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, what: str) -> list[Any]:
        with urllib.request.urlopen(self.url(f"/{what}"), timeout=10) as reply:
            return list(json.loads(reply.read()))

    def events(self, request_id: str, count: int) -> list[dict[str, Any]]:
        """The events of ``request_id``, once ``count`` have come (bounded wait)."""
        def found() -> list[dict[str, Any]] | None:
            mine = [e for e in self.get("events") if e["attributes"]["id"] == request_id]
            return mine if len(mine) >= count else None
        return list(wait_for(found, 15, f"{count} events of {request_id}"))


@pytest.fixture(scope="module")
def sinks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SinkProcess, SinkProcess]]:
    directory = tmp_path_factory.mktemp("sinks")
    sink = SinkProcess(directory)
    try:
        hung = SinkProcess(directory, hang=True)
        try:
            yield sink, hung
        finally:
            stop_process(hung.proc)
    finally:
        stop_process(sink.proc)


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoServer]:
    with EchoServer.running({"E": EchoServer("E", tmp_path_factory.mktemp("echo"))}) as servers:
        yield servers["E"]


def gateway_config(sink: SinkProcess, hung: SinkProcess, dead_port: int, echo: EchoServer) -> str:
    routes = "".join(
        f"  - {{name: {name}, match: {{model: '*', headers: {{x-log: {name}}}}}, upstream: local, "
        f"policies: [{name}]}}\n" for name in ("requests", "responses", "half", "dead", "hung", "tiny", "wide"))
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: echo, protocol: v2-rest, endpoints: ["{echo.address}"]}}
policies:
  - {{name: audit, payload_log: {{url: "{sink.url('/audit')}", max_tensor_bytes: 1KiB}}}}
  - {{name: requests, payload_log: {{url: "{sink.url('/requests')}", mode: request}}}}
  - {{name: responses, payload_log: {{url: "{sink.url('/responses')}", mode: response}}}}
  - {{name: half, payload_log: {{url: "{sink.url('/half')}", sample: 0.5}}}}
  - {{name: dead, payload_log: {{url: "http://127.0.0.1:{dead_port}/", timeout: 1s}}}}
  - {{name: hung, payload_log: {{url: "{hung.url('/')}", timeout: {SLOW_SINK_TIMEOUT}}}}}
  - {{name: wide, payload_log: {{url: "{sink.url('/wide')}", max_tensor_bytes: 1MiB}}}}
  - {{name: tiny, payload_log: {{url: "{hung.url('/')}", timeout: 60s, max_queue: 2, connections: 1}}}}
routes:
{routes}  - {{name: relayed, match: {{model: '*', headers: {{x-log: relayed}}}}, upstream: echo, policies: [audit]}}
  - {{name: plain, match: {{model: '*', headers: {{x-log: plain}}}}, upstream: local}}
  - {{name: logged, match: {{model: '*'}}, upstream: local, policies: [audit]}}
"""


@pytest.fixture(scope="module")
def gateway(sinks: tuple[SinkProcess, SinkProcess], echo: EchoServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("payload-log")
    sink, hung = sinks
    with GatewayProcess(write_config(directory, gateway_config(sink, hung, free_port(), echo)),
                        directory / "gateway.log") as gw:
        yield gw


def _simple(module: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        item = module.InferInput(name, [1, 16], "INT32")
        item.set_data_from_numpy(data)
        inputs.append(item)
    return inputs, a, b


def _infer(gateway: GatewayProcess, client_kind: str, request_id: str, log: str = "",
           model: str = "simple") -> Any:
    module = httpclient if client_kind == "rest" else grpcclient
    headers = {"x-request-id": request_id, **({"x-log": log} if log else {})}
    with module.InferenceServerClient(gateway.url(client_kind)) as client:
        inputs, _, _ = _simple(module)
        return client.infer(model, inputs, request_id=request_id, headers=headers)


def _by_type(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = {e["attributes"]["type"].rpartition(".")[2]: e for e in events}
    assert len(kinds) == len(events), events
    return kinds


@pytest.mark.parametrize("client_kind", ["rest", "grpc"])
def test_request_and_answer_are_events_paired_by_the_request_id(
        gateway: GatewayProcess, sinks: tuple[SinkProcess, SinkProcess], client_kind: str) -> None:
    sink, _ = sinks
    request_id = f"pair-{client_kind}"
    result = _infer(gateway, client_kind, request_id)
    _, a, b = _simple(httpclient)
    events = _by_type(sink.events(request_id, 2))
    assert set(events) == {"request", "response"}
    for kind, event in events.items():
        attributes = event["attributes"]
        assert attributes["type"] == f"org.kubeflow.serving.inference.{kind}"
        assert attributes["specversion"] == "1.0"
        assert attributes["source"] == f"/{SERVER}/routes/logged"
        assert attributes["modelname"] == "simple"
        assert attributes["protocol"] == f"v2-{client_kind}"
        assert attributes["datacontenttype"] == "application/json"
        assert attributes["time"]
        assert event["path"] == "/audit"
    request = events["request"]["data"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in request["inputs"]] == [
        ("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])]
    assert request["inputs"][0]["data"] == a.reshape(-1).tolist()
    assert request["inputs"][1]["data"] == b.reshape(-1).tolist()
    answer = events["response"]["data"]
    assert answer["model_name"] == "simple"
    outputs = {t["name"]: t for t in answer["outputs"]}
    for name in ("OUTPUT0", "OUTPUT1"):
        assert outputs[name]["datatype"] == "INT32" and outputs[name]["shape"] == [1, 16]
        assert outputs[name]["data"] == result.as_numpy(name).reshape(-1).tolist()
    assert outputs["OUTPUT0"]["data"] == (a + b).reshape(-1).tolist()


def test_a_v1_clients_request_is_logged_as_v2_json(gateway: GatewayProcess,
                                                    sinks: tuple[SinkProcess, SinkProcess]) -> None:
    sink, _ = sinks
    reply = requests.post(f"http://{gateway.url('v1')}/v1/models/identity:predict",
                          json={"instances": [[1.5, 2.5], [3.0, 4.0]]}, headers={"x-request-id": "v1-call"},
                          timeout=10)
    assert reply.status_code == 200, reply.text
    events = _by_type(sink.events("v1-call", 2))
    assert {e["attributes"]["protocol"] for e in events.values()} == {"v1-rest"}
    [sent] = events["request"]["data"]["inputs"]
    [answered] = events["response"]["data"]["outputs"]
    assert sent["shape"] == answered["shape"] == [2, 2]
    assert sent["data"] == answered["data"] == [1.5, 2.5, 3.0, 4.0]
    assert reply.json() == {"predictions": [[1.5, 2.5], [3.0, 4.0]]}


def test_a_tensor_over_max_tensor_bytes_is_logged_as_metadata_only(
        gateway: GatewayProcess, sinks: tuple[SinkProcess, SinkProcess]) -> None:
    sink, _ = sinks
    data = np.arange(1024, dtype=np.float32).reshape(1, 1024)  # 4 KiB, over the policy's 1 KiB
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        item = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
        item.set_data_from_numpy(data, binary_data=True)
        result = client.infer("identity", [item], headers={"x-request-id": "big"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)  # the client's answer is whole
    events = _by_type(sink.events("big", 2))
    [sent] = events["request"]["data"]["inputs"]
    [answered] = events["response"]["data"]["outputs"]
    for tensor in (sent, answered):
        assert "data" not in tensor
        assert tensor["datatype"] == "FP32" and tensor["shape"] == [1, 1024]
        assert tensor["parameters"]["data_omitted"] == "max_tensor_bytes"
        assert tensor["parameters"]["data_bytes"] == 4096


def test_an_answer_relayed_undecoded_is_logged_as_it_came(gateway: GatewayProcess,
                                                           sinks: tuple[SinkProcess, SinkProcess]) -> None:
    """V2 REST client to a V2 REST upstream: the answer's bytes are relayed
    without being decoded, and logged as they came (they are V2 JSON)."""
    sink, _ = sinks
    body: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]}
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/anything/infer", json=body,
                          headers={"x-request-id": "relayed", "x-log": "relayed"}, timeout=10)
    assert reply.status_code == 200, reply.text
    events = _by_type(sink.events("relayed", 2))
    assert events["request"]["data"]["inputs"] == body["inputs"]
    assert events["response"]["data"] == reply.json()
    assert events["response"]["attributes"]["source"] == f"/{SERVER}/routes/relayed"


def test_each_answer_of_a_stream_is_a_numbered_response_event(gateway: GatewayProcess,
                                                               sinks: tuple[SinkProcess, SinkProcess]) -> None:
    sink, _ = sinks
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            inputs, a, b = _simple(grpcclient)
            client.async_stream_infer("simple", inputs, request_id="streamed")
            result, error = answers.get(timeout=10)
        finally:
            client.stop_stream()
    assert error is None
    events = _by_type(sink.events("streamed", 2))
    assert events["response"]["attributes"]["streamindex"] == "0"
    assert "streamindex" not in events["request"]["attributes"]
    outputs = {t["name"]: t["data"] for t in events["response"]["data"]["outputs"]}
    assert outputs["OUTPUT0"] == result.as_numpy("OUTPUT0").reshape(-1).tolist() == (a + b).reshape(-1).tolist()
    assert {e["attributes"]["protocol"] for e in events.values()} == {"v2-grpc"}


@pytest.mark.parametrize(("datatype", "count"), [("INT32", 50_000), ("BYTES", 20_000)])
def test_long_tensor_data_is_logged_whole(gateway: GatewayProcess, sinks: tuple[SinkProcess, SinkProcess],
                                          datatype: str, count: int) -> None:
    """Data longer than one writing step (16384 elements) is written in
    steps; the event holds all of it, in order."""
    sink, _ = sinks
    data = (np.arange(count, dtype=np.int32) if datatype == "INT32"
            else np.array([str(n).encode() for n in range(count)], dtype=object)).reshape(1, count)
    request_id = f"long-{datatype}"
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        item = httpclient.InferInput("INPUT0", [1, count], datatype)
        item.set_data_from_numpy(data, binary_data=True)
        client.infer("identity", [item], headers={"x-request-id": request_id, "x-log": "wide"})
    events = _by_type(sink.events(request_id, 2))
    expected = [v.decode() for v in data.reshape(-1)] if datatype == "BYTES" else data.reshape(-1).tolist()
    [sent] = events["request"]["data"]["inputs"]
    [answered] = events["response"]["data"]["outputs"]
    assert sent["data"] == answered["data"] == expected
    assert sent["shape"] == [1, count] and "parameters" not in sent


@pytest.mark.parametrize(("mode", "kind"), [("requests", "request"), ("responses", "response")])
def test_mode_logs_one_side(gateway: GatewayProcess, sinks: tuple[SinkProcess, SinkProcess],
                            mode: str, kind: str) -> None:
    sink, _ = sinks
    _infer(gateway, "rest", f"mode-{mode}", log=mode)
    _infer(gateway, "grpc", f"mode-{mode}-after", log=mode)  # sent after it on the same sink: the wait's end
    sink.events(f"mode-{mode}-after", 1)
    mine = sink.events(f"mode-{mode}", 1)
    assert [e["attributes"]["type"] for e in mine] == [f"org.kubeflow.serving.inference.{kind}"]
    assert mine[0]["path"] == f"/{mode}"


def test_sampling_keeps_or_skips_a_request_with_its_answer(gateway: GatewayProcess,
                                                            sinks: tuple[SinkProcess, SinkProcess]) -> None:
    sink, _ = sinks
    ids = [f"sample-{n}" for n in range(40)]
    for request_id in ids:
        _infer(gateway, "rest", request_id, log="half")
    # The documented rule: a request is logged when the CRC-32 of its id is below sample * 2**32.
    chosen = {i for i in ids if zlib.crc32(i.encode()) < (1 << 31)}
    assert 0 < len(chosen) < len(ids)  # the ids exercise both sides of the rule

    def arrived() -> list[dict[str, Any]] | None:
        logged = [e for e in sink.get("events") if e["path"] == "/half"]
        return logged if len(logged) >= 2 * len(chosen) else None

    logged = wait_for(arrived, 15, "the sampled events")
    assert sorted(e["attributes"]["id"] for e in logged) == sorted([*chosen, *chosen])
    assert {(e["attributes"]["id"], e["attributes"]["type"].rpartition(".")[2]) for e in logged} == {
        (i, kind) for i in chosen for kind in ("request", "response")}


def _latencies(call: Callable[[], Any], count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


@pytest.mark.parametrize("sink_kind", ["dead", "hung"])
def test_a_dead_or_hung_sink_leaves_requests_as_fast_and_counts_failures(
        gateway: GatewayProcess, sink_kind: str) -> None:
    before = metric_value(scrape_metrics(gateway), "gateway_payload_log_total", result="failed")
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        inputs, a, b = _simple(httpclient)

        def call(log: str) -> Callable[[], Any]:
            def one() -> None:
                result = client.infer("simple", inputs, headers={"x-log": log})
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            return one

        _latencies(call("plain"), 3)  # warm up the connection and the route
        plain = _latencies(call("plain"), 15)
        logged = _latencies(call(sink_kind), 15)
    # A sender on the request path would add the sink's timeout (1 s dead... 3 s hung) or a
    # connect attempt per request; off it, the medians stay close (generous: shared CPUs).
    assert statistics.median(logged) < statistics.median(plain) + 0.1, (plain, logged)
    assert max(logged) < 1.0, logged
    wait_for(lambda: metric_value(scrape_metrics(gateway), "gateway_payload_log_total", result="failed") > before,
             15, "a failed event counted")


def test_a_full_queue_drops_and_counts(gateway: GatewayProcess) -> None:
    """The tiny policy's sink never answers and its one sender waits 60 s on
    the first event: its queue of 2 fills, the rest is dropped."""
    before = metric_value(scrape_metrics(gateway), "gateway_payload_log_total", result="dropped")
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        inputs, a, b = _simple(httpclient)
        for _ in range(10):  # 20 events: one sending, two queued
            result = client.infer("simple", inputs, headers={"x-log": "tiny"})
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    dropped = metric_value(scrape_metrics(gateway), "gateway_payload_log_total", result="dropped") - before
    assert dropped >= 17, dropped


# --- the config ------------------------------------------------------------------


def _config(options: str) -> dict[str, Any]:
    import yaml

    text = f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
policies: [{{name: audit, payload_log: {options}}}]
routes: [{{match: {{model: "*"}}, upstream: local, policies: [audit]}}]
"""
    return dict(yaml.safe_load(text))


@pytest.mark.parametrize(("options", "problem"), [
    ("{}", "policies[0].payload_log.url: is required"),
    ('{url: "ftp://sink/"}', "policies[0].payload_log.url: must be an http:// or https:// URL"),
    ('{url: "http://u:p@sink/"}', "policies[0].payload_log.url: must not hold credentials"),
    ('{url: "http://sink/", mode: both}', "policies[0].payload_log.mode: must be one of all, request, response"),
    ('{url: "http://sink/", sample: 1.5}', "policies[0].payload_log.sample: must be between 0 and 1"),
    ('{url: "http://sink/", max_queue: 0}', "policies[0].payload_log.max_queue: must be at least 1"),
    ('{url: "http://sink/", timeout: 0}', "policies[0].payload_log.timeout: must be more than 0"),
    ('{url: "http://sink/", headers: {ce-id: x}}', "policies[0].payload_log.headers.ce-id: must be a header name"),
    ('{url: "http://sink/", colour: red}', "policies[0].payload_log.colour: unknown key"),
])
def test_bad_options_are_config_errors(options: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(_config(options))
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems


def test_options_and_their_defaults() -> None:
    config = parse_config(_config('{url: "http://sink:8080/log", headers: {Authorization: "Bearer s3cret"}}'))
    options = config.policies[0].options
    assert (options.url, options.mode, options.sample, options.max_queue) == ("http://sink:8080/log", "all", 1.0,
                                                                              10000)
    assert options.headers.pairs == (("Authorization", "Bearer s3cret"),)
    assert "s3cret" not in repr(options)
    assert options == parse_config(_config('{url: "http://sink:8080/log", headers: {Authorization: "Bearer s3cret"}}'
                                           )).policies[0].options  # equal by value: kept across a reload


# --- the queue's memory ------------------------------------------------------------


def test_queued_events_are_charged_to_the_memory_budget_and_given_back() -> None:
    """Events held for a sink that refuses connections (a real closed port)
    hold the budget while queued; past it they are dropped; every charge is
    given back once they failed or the sink closed."""
    from gateway.dataplane.filters.eventsink import DROPPED, FAILED, Event, EventSink, SinkAddress
    from gateway.runtime.budget import InflightBudget

    async def run() -> None:
        size = Event("", b"x" * 1000, 0.0).size
        budget = InflightBudget(4 * size)
        counts = {DROPPED: 0, FAILED: 0}

        def count(result: str, n: int) -> None:
            counts[result] += n

        sink = EventSink(SinkAddress.parse(f"http://127.0.0.1:{free_port()}/"), (), 1.0, 1, 100, 1 << 20,
                         budget, count)
        for _ in range(10):
            sink.offer(Event("", b"x" * 1000, 0.0))
        assert counts[DROPPED] == 6  # four fit the budget
        assert budget.used == sink.queued_bytes == 4 * size  # nothing sent yet: the senders run at the next await
        for _ in range(200):  # the sender takes them one by one: refused, counted as failed
            if counts[FAILED] >= 1:
                break
            await asyncio.sleep(0.01)
        assert counts[FAILED] >= 1
        await sink.close()
        assert budget.used == 0
        assert counts[DROPPED] + counts[FAILED] == 10

    asyncio.run(run())
