"""Triton's extensions against the gateway in its own process, called with
unmodified tritonclient (HTTP and gRPC): statistics whose counts match the
requests sent, model configuration, the repository index, classification,
server identity, and the calls the gateway refuses with a reason."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from gateway.config.extensions import DEFAULT_EXTENSIONS
from support import GatewayProcess, free_port, wait_for, write_config

LABELS = [f"class-{i}" for i in range(16)]

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: gone, protocol: v2-rest, endpoints: ["127.0.0.1:{closed}"], timeout: 2s}}
routes:
  - match: {{model: offline}}
    upstream: gone
  - match: {{model: "*"}}
    upstream: local
classification:
  labels: {{simple: labels.txt}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("triton-ext")
    (directory / "labels.txt").write_text("\n".join(LABELS) + "\n")
    with GatewayProcess(write_config(directory, CONFIG.format(closed=free_port())), directory / "gw.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(gateway: GatewayProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        yield client


def _inputs(module: Any, arrays: dict[str, np.ndarray], **kwargs: Any) -> list[Any]:
    inputs = []
    for name, array in arrays.items():
        item = module.InferInput(name, list(array.shape), "INT32")
        item.set_data_from_numpy(array, **kwargs)
        inputs.append(item)
    return inputs


def _simple(batch: int) -> dict[str, np.ndarray]:
    return {"INPUT0": np.arange(16 * batch, dtype=np.int32).reshape(batch, 16),
            "INPUT1": np.ones((batch, 16), dtype=np.int32)}


def _stats(http: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    (stats,) = http.get_inference_statistics(model)["model_stats"]
    return stats


# --- Triton's example clients, unchanged in what they check ------------------------------


def test_triton_http_example_flow(http: httpclient.InferenceServerClient) -> None:
    """simple_http_infer_client.py: infer, statistics (exactly one entry),
    infer without outputs, then a wrong model name."""
    input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1 = np.full((1, 16), -1, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(input0, binary_data=False)
    inputs[1].set_data_from_numpy(input1, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    results = http.infer("simple", inputs, outputs=outputs, query_params={"test_1": 1, "test_2": 2})
    statistics = http.get_inference_statistics(model_name="simple")
    assert len(statistics["model_stats"]) == 1
    np.testing.assert_array_equal(results.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(results.as_numpy("OUTPUT1"), input0 - input1)
    results = http.infer("simple", inputs, outputs=None)
    np.testing.assert_array_equal(results.as_numpy("OUTPUT0"), input0 + input1)
    with pytest.raises(InferenceServerException) as info:
        http.infer("wrong_model_name", inputs, outputs=outputs)
    assert info.value.message().startswith("Request for unknown model")


def test_triton_grpc_example_flow(grpc_client: grpcclient.InferenceServerClient) -> None:
    """simple_grpc_infer_client.py: infer, then statistics with one entry."""
    arrays = _simple(1)
    results = grpc_client.infer("simple", _inputs(grpcclient, arrays),
                                outputs=[grpcclient.InferRequestedOutput("OUTPUT0"),
                                         grpcclient.InferRequestedOutput("OUTPUT1")])
    statistics = grpc_client.get_inference_statistics(model_name="simple")
    assert len(statistics.model_stats) == 1
    np.testing.assert_array_equal(results.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])


# --- statistics --------------------------------------------------------------------------


def _counters(admin: str, model: str) -> float:
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "gateway_requests_total" and sample.labels["model"] == model
               and sample.labels["operation"] == "infer" and sample.labels["outcome"] == "ok")


def test_statistics_count_the_requests_sent(gateway: GatewayProcess, http: httpclient.InferenceServerClient,
                                            grpc_client: grpcclient.InferenceServerClient) -> None:
    """Successes with their batch sizes, failures, from both listeners into
    one accumulator; REST and gRPC report the same numbers, which agree
    with the Prometheus request counter."""
    model = "simple_string"
    before = _stats(http, model)
    base_fail = before["inference_stats"]["fail"]["count"]
    base_batches = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}

    def strings(batch: int) -> dict[str, np.ndarray]:
        return {name: array.astype(np.bytes_).astype(object) for name, array in _simple(batch).items()}

    def bytes_inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
        inputs = []
        for name, array in arrays.items():
            item = module.InferInput(name, list(array.shape), "BYTES")
            item.set_data_from_numpy(array)
            inputs.append(item)
        return inputs

    for _ in range(3):
        http.infer(model, bytes_inputs(httpclient, strings(2)))
    for _ in range(2):
        grpc_client.infer(model, bytes_inputs(grpcclient, strings(1)))
    bad = {"INPUT0": np.array([[b"x"] * 16], dtype=object), "INPUT1": np.array([[b"1"] * 16], dtype=object)}
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException):
            client.infer(model, bytes_inputs(httpclient if client is http else grpcclient, bad))

    def settled() -> dict[str, Any] | None:  # a REST request is counted once its answer has left
        stats = _stats(http, model)
        return stats if stats["inference_stats"]["fail"]["count"] == base_fail + 2 else None

    stats = wait_for(settled, 5, "the last request to be counted")
    assert stats["execution_count"] - before["execution_count"] == 5
    assert stats["inference_count"] - before["inference_count"] == 3 * 2 + 2 * 1
    inference = stats["inference_stats"]
    assert inference["success"]["count"] - before["inference_stats"]["success"]["count"] == 5
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[stage]["count"] == inference["success"]["count"], stage
    assert inference["success"]["ns"] >= inference["compute_infer"]["ns"] > 0
    assert inference["success"]["ns"] > inference["queue"]["ns"]  # waiting is part of the request's time
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert {size: batches[size] - base_batches.get(size, 0) for size in (1, 2)} == {2: 3, 1: 2}
    assert stats["last_inference"] > 1.6e12  # milliseconds since the epoch

    (over_grpc,) = grpc_client.get_inference_statistics(model, as_json=True)["model_stats"]
    assert int(over_grpc["execution_count"]) == stats["execution_count"]
    assert int(over_grpc["inference_count"]) == stats["inference_count"]
    assert int(over_grpc["inference_stats"]["fail"]["count"]) == base_fail + 2
    assert _counters(gateway.url("admin"), model) == inference["success"]["count"]


def test_statistics_of_all_models_and_unknown_ones(http: httpclient.InferenceServerClient,
                                                   grpc_client: grpcclient.InferenceServerClient) -> None:
    http.infer("simple", _inputs(httpclient, _simple(1)))
    names = {s["name"] for s in http.get_inference_statistics()["model_stats"]}
    assert "simple" in names
    assert {s.name for s in grpc_client.get_inference_statistics().model_stats} == names
    assert _stats(http, "trig")["execution_count"] == 0  # known, never used: zeros
    with pytest.raises(InferenceServerException) as info:
        http.get_inference_statistics("nope")
    assert info.value.status() == "404" and "nope" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


# --- model configuration -------------------------------------------------------------------


def test_model_config_is_synthesized_from_metadata(http: httpclient.InferenceServerClient,
                                                   grpc_client: grpcclient.InferenceServerClient) -> None:
    config = http.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] > 0
    assert config["input"] == [{"name": f"INPUT{i}", "data_type": "TYPE_INT32", "dims": [16]} for i in range(2)]
    assert [o["label_filename"] for o in config["output"]] == ["labels.txt", "labels.txt"]
    assert config["parameters"]["synthesized"]["string_value"].startswith("true")
    identity = http.get_model_config("identity", "1")
    assert identity["max_batch_size"] == 0
    assert identity["input"] == [{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [-1]}]
    over_grpc = grpc_client.get_model_config("simple").config
    assert (over_grpc.name, over_grpc.max_batch_size) == ("simple", config["max_batch_size"])
    assert [list(i.dims) for i in over_grpc.input] == [[16], [16]]
    assert "synthesized" in over_grpc.parameters
    for client, status in ((http, "404"), (grpc_client, "StatusCode.NOT_FOUND")):
        with pytest.raises(InferenceServerException) as info:
            client.get_model_config("nope")
        assert info.value.status() == status


# --- repository index ----------------------------------------------------------------------


def _post_index(gateway: GatewayProcess, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{gateway.url('rest')}/v2/repository/index", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_repository_index_lists_routed_models_with_their_state(
        gateway: GatewayProcess, http: httpclient.InferenceServerClient,
        grpc_client: grpcclient.InferenceServerClient) -> None:
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    assert {"simple", "simple_string", "identity", "forward", "trig", "gnn", "simple_sequence",
            "simple_dyna_sequence", "simple_string_dyna_sequence", "repeat_int32", "text_generator", "text_embedder",
            "offline"} == set(index)
    assert index["simple"]["state"] == "READY"
    assert index["offline"]["state"] == "UNAVAILABLE" and "gone" in index["offline"]["reason"]
    over_grpc = {m.name: (m.state, m.reason) for m in grpc_client.get_model_repository_index().models}
    assert over_grpc == {name: (e["state"], e["reason"]) for name, e in index.items()}
    status, ready = _post_index(gateway, b'{"ready": true}')
    assert status == 200 and {e["name"] for e in ready} == set(index) - {"offline"}
    status, error = _post_index(gateway, b'{"ready": "yes"}')
    assert status == 400 and "'ready' must be a boolean" in error["error"]


# --- classification ----------------------------------------------------------------------


def _expected_top(values: np.ndarray, count: int, labels: list[str] | None) -> list[list[str]]:
    rows = []
    for row in values.reshape(values.shape[0], -1):
        order = sorted(range(row.size), key=lambda i: (-row[i], i))[:count]
        rows.append([f"{row[i]}:{i}" + (f":{labels[i]}" if labels else "") for i in order])
    return rows


@pytest.mark.parametrize("binary", [False, True])
def test_classification_over_http(http: httpclient.InferenceServerClient, binary: bool) -> None:
    arrays = _simple(3)
    arrays["INPUT1"] = np.array([np.random.default_rng(7).permutation(16) for _ in range(3)], dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary, class_count=4),
               httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = http.infer("simple", _inputs(httpclient, arrays), outputs=outputs)
    out = result.as_numpy("OUTPUT1")
    assert out.shape == (3, 4)
    got = [[x.decode() if isinstance(x, bytes) else x for x in row] for row in out]
    assert got == _expected_top(arrays["INPUT0"] - arrays["INPUT1"], 4, LABELS)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])
    assert result.get_output("OUTPUT1")["datatype"] == "BYTES"


def test_classification_over_grpc_without_labels_and_unbatched(
        grpc_client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[0.5, 2.0], [1.0, 0.25]], dtype=np.float32)
    y = np.array([[1.0], [3.0]], dtype=np.float32)
    inputs = [grpcclient.InferInput("x", [2, 2], "FP32"), grpcclient.InferInput("y", [2, 1], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = grpc_client.infer("trig", inputs, outputs=[grpcclient.InferRequestedOutput("f", class_count=1)])
    f = np.stack([np.sin(x[:, 0]) * y[:, 0], x[:, 0] * x[:, 1] ** 2], axis=1)
    expected = [[f"{f[r].max():f}:{int(f[r].argmax())}"] for r in range(2)]
    assert [[v.decode() for v in row] for row in result.as_numpy("f")] == expected
    # identity declares [-1]: no batch dimension, the whole tensor is one row
    data = np.array([[3.0, 9.0], [7.0, 1.0]], dtype=np.float32)
    item = grpcclient.InferInput("INPUT0", [2, 2], "FP32")
    item.set_data_from_numpy(data)
    result = grpc_client.infer("identity", [item], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    assert [v.decode() for v in result.as_numpy("OUTPUT0")] == ["9.000000:1", "7.000000:2", "3.000000:0"]


def test_classification_of_strings_is_refused(http: httpclient.InferenceServerClient,
                                              grpc_client: grpcclient.InferenceServerClient) -> None:
    arrays = {name: array.astype(np.bytes_).astype(object) for name, array in _simple(1).items()}
    for module, client, status in ((httpclient, http, "400"), (grpcclient, grpc_client, "StatusCode.INVALID_ARGUMENT")):
        inputs = []
        for name, array in arrays.items():
            item = module.InferInput(name, [1, 16], "BYTES")
            item.set_data_from_numpy(array)
            inputs.append(item)
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple_string", inputs, outputs=[module.InferRequestedOutput("OUTPUT0", class_count=2)])
        assert info.value.status() == status and "classification needs a numeric output" in info.value.message()


# --- refusals ------------------------------------------------------------------------------


HANDLE = base64.b64encode(b"cuda ipc handle")  # tritonclient.grpc decodes it before sending


def _refusals(client: Any) -> dict[str, Callable[[], Any]]:
    calls: dict[str, Callable[[], Any]] = {
        "load_model": lambda: client.load_model("simple"),
        "unload_model": lambda: client.unload_model("simple"),
        # turned off unless the configuration names it (tests/test_triton_extensions_shm.py)
        "get_system_shared_memory_status": client.get_system_shared_memory_status,
        "register_system_shared_memory": lambda: client.register_system_shared_memory("r", "/key", 64),
        "unregister_system_shared_memory": client.unregister_system_shared_memory,
        "register_cuda_shared_memory": lambda: client.register_cuda_shared_memory("r", HANDLE, 0, 64),
        "get_trace_settings": client.get_trace_settings,
        "update_trace_settings": lambda: client.update_trace_settings("simple", {"trace_rate": "1"}),
        "get_log_settings": client.get_log_settings,
        "update_log_settings": lambda: client.update_log_settings({"log_verbose_level": 1}),
    }
    return calls


EXTENSION_OF_CALL = {"load_model": "model_repository", "unload_model": "model_repository", "trace": "trace",
                     "log": "logging", "system": "system_shared_memory", "cuda": "cuda_shared_memory"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_calls_the_gateway_cannot_honour_are_refused_with_a_reason(
        protocol: str, http: httpclient.InferenceServerClient,
        grpc_client: grpcclient.InferenceServerClient) -> None:
    client = http if protocol == "http" else grpc_client
    expected_status = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
    for name, call in _refusals(client).items():
        extension = next(ext for key, ext in EXTENSION_OF_CALL.items() if key in name)
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == expected_status, name
        assert info.value.message().startswith(f"{extension}: "), (name, info.value.message())


def test_streaming_is_served(grpc_client: grpcclient.InferenceServerClient) -> None:
    """ModelStreamInfer is no refused extension (tests/test_grpc_stream.py covers it)."""
    answers: list[Any] = []
    grpc_client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        grpc_client.async_stream_infer("simple", _inputs(grpcclient, _simple(1)), request_id="s")
        wait_for(lambda: answers, 5, "the stream's answer")
    finally:
        grpc_client.stop_stream()
    result, error = answers[0]
    assert error is None and result.get_response().id == "s"


# --- server identity: the advertised list is what is served ---------------------------------


def _served(module: Any, client: Any) -> set[str]:
    """Probe each extension: served unless the listener refuses it
    (classification: unless the output comes back as it was)."""
    refused = "501" if module is httpclient else "StatusCode.UNIMPLEMENTED"
    probes: dict[str, Callable[[], Any]] = {
        "statistics": lambda: client.get_inference_statistics("simple"),
        "model_configuration": lambda: client.get_model_config("simple"),
        "model_repository": client.get_model_repository_index,
        "system_shared_memory": client.get_system_shared_memory_status,
        "classification": lambda: client.infer(
            "simple", _inputs(module, _simple(1)),
            outputs=[module.InferRequestedOutput("OUTPUT0", class_count=1)]).as_numpy("OUTPUT0").dtype == object,
    }
    if module is httpclient:
        probes["binary_tensor_data"] = lambda: client.infer("simple", _inputs(module, _simple(1), binary_data=True))
    return {name for name, probe in probes.items() if _answers(probe, refused)}


def _answers(probe: Callable[[], Any], refused: str) -> bool:
    try:
        return probe() is not False
    except InferenceServerException as exc:
        assert exc.status() == refused, exc
        return False


def test_advertised_extensions_are_the_served_ones(http: httpclient.InferenceServerClient,
                                                   grpc_client: grpcclient.InferenceServerClient) -> None:
    assert set(http.get_server_metadata()["extensions"]) == _served(httpclient, http) == {
        *DEFAULT_EXTENSIONS, "binary_tensor_data"}
    assert set(grpc_client.get_server_metadata().extensions) == _served(grpcclient, grpc_client) == set(
        DEFAULT_EXTENSIONS)


def test_configured_identity_and_extensions(tmp_path: Path) -> None:
    config = CONFIG.format(closed=free_port()).replace("classification:\n  labels: {simple: labels.txt}\n", "") + """
server: {name: triton, version: "2.99.0", extensions: [statistics, model_repository]}
"""
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gw.log") as gw, \
            httpclient.InferenceServerClient(gw.url("rest")) as http, \
            grpcclient.InferenceServerClient(gw.url("grpc")) as grpc_client:
        metadata = http.get_server_metadata()
        assert (metadata["name"], metadata["version"]) == ("triton", "2.99.0")
        assert set(metadata["extensions"]) == _served(httpclient, http) == {
            "statistics", "model_repository", "binary_tensor_data"}
        assert set(grpc_client.get_server_metadata().extensions) == _served(grpcclient, grpc_client) == {
            "statistics", "model_repository"}
        with pytest.raises(InferenceServerException) as info:
            http.get_model_config("simple")
        assert "model_configuration: this extension is turned off" in info.value.message()
