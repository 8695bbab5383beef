"""Triton extensions without sockets: classification, synthesized model
configurations, the statistics accumulator, their configuration keys, and
the gRPC messages read by tritonclient's own generated classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gateway.config.classification import ClassificationConfig
from gateway.config.extensions import DEFAULT_EXTENSIONS
from gateway.config.node import ConfigError
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import RequestRecord
from gateway.core.tensors import float_to_bf16
from gateway.core.types import InferRequest, ModelMetadata, RequestedOutput, Tensor, TensorSpec
from gateway.observability.statistics import StatisticsStore, batch_size
from gateway.protocols.triton.classification import classify, requested, without_parameter
from gateway.protocols.triton.modelconfig import SYNTHESIZED_PARAMETER, UNKNOWN_MAX_BATCH_SIZE, batches, synthesize
from support import parse_yaml_config

# --- classification -------------------------------------------------------------


def _texts(tensor: Tensor) -> list[str]:
    return [item.decode() for item in tensor.data.reshape(-1)]


def test_classification_of_a_non_batching_output_is_one_row() -> None:
    """Triton's documented example: [1.1, 3.3, 0.5, 2.4], top 2."""
    out = classify(Tensor.from_numpy("o", np.array([1.1, 3.3, 0.5, 2.4], dtype=np.float32)), 2, batched=False)
    assert (out.datatype, out.shape) == ("BYTES", (2,))
    assert _texts(out) == ["3.300000:1", "2.400000:3"]


def test_classification_per_batch_row_with_labels_and_ties() -> None:
    data = np.array([[1, 5, 10, 4], [7, 7, 1, 9]], dtype=np.int32)
    out = classify(Tensor.from_numpy("o", data), 3, batched=True, labels=("apple", "pear", "plum"))
    assert out.shape == (2, 3)
    # equal values rank by the lower index; index 3 has no label
    assert _texts(out) == ["10:2:plum", "5:1:pear", "4:3", "9:3", "7:0:apple", "7:1:pear"]
    # more equal values at the cut than places left: the lower indices win
    ties = classify(Tensor.from_numpy("o", np.array([1, 3, 3, 3, 3], dtype=np.int64)), 2, batched=False)
    assert _texts(ties) == ["3:1", "3:2"]
    unsigned = classify(Tensor.from_numpy("o", np.array([0, 2**64 - 1, 5], dtype=np.uint64)), 3, batched=False)
    assert _texts(unsigned) == [f"{2**64 - 1}:1", "5:2", "0:0"]
    signed = classify(Tensor.from_numpy("o", np.array([-128, 127, 0], dtype=np.int8)), 3, batched=False)
    assert _texts(signed) == ["127:1", "0:2", "-128:0"]


def test_classification_count_beyond_the_row_and_empty_batches() -> None:
    out = classify(Tensor.from_numpy("o", np.array([[2, 1]], dtype=np.uint8)), 10, batched=True)
    assert (out.shape, _texts(out)) == ((1, 2), ["2:0", "1:1"])
    empty = classify(Tensor.from_numpy("o", np.zeros((0, 4), dtype=np.float64)), 3, batched=True)
    assert empty.shape == (0, 3)


def test_classification_nan_ranks_last_and_half_floats_are_read() -> None:
    out = classify(Tensor.from_numpy("o", np.array([np.nan, -1.0, np.inf])), 3, batched=False)
    assert _texts(out) == ["inf:2", "-1.000000:1", "nan:0"]
    half = classify(Tensor.from_numpy("o", np.array([0.5, 2.0], dtype=np.float16)), 1, batched=False)
    assert _texts(half) == ["2.000000:1"]
    bf16 = Tensor("o", "BF16", (3,), float_to_bf16(np.array([1.0, 8.0, -3.0])))
    assert _texts(classify(bf16, 2, batched=False)) == ["8.000000:1", "1.000000:0"]


def test_classification_refuses_non_numeric_outputs() -> None:
    with pytest.raises(GatewayError) as info:
        classify(Tensor.from_numpy("o", np.array([b"a"], dtype=object)), 1, batched=False)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "numeric" in info.value.message


@pytest.mark.parametrize("bad", [-1, "2", 1.5, True, None])
def test_classification_parameter_must_be_a_count(bad: object) -> None:
    request = InferRequest("m", outputs=[RequestedOutput("o", {"classification": bad})])
    with pytest.raises(GatewayError) as info:
        requested(request)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "'classification'" in info.value.message


def test_classification_parameter_is_taken_off_before_the_upstream() -> None:
    request = InferRequest("m", outputs=[RequestedOutput("a", {"classification": 2, "binary_data": True}),
                                         RequestedOutput("b", {"classification": 0}), RequestedOutput("c")])
    assert requested(request) == {"a": 2}  # 0 means none, as tritonclient's default class_count
    stripped = without_parameter(request)
    assert [(o.name, o.parameters) for o in stripped.outputs] == [("a", {"binary_data": True}), ("b", {}),
                                                                  ("c", {})]
    assert request.outputs[0].parameters["classification"] == 2  # the client's request is left alone


# --- synthesized model configuration -----------------------------------------------


def _metadata(shape: tuple[int, ...], out_shape: tuple[int, ...] | None = None) -> ModelMetadata:
    return ModelMetadata("up", ("1",), "onnxruntime_onnx", (TensorSpec("x", "FP32", shape),),
                         (TensorSpec("y", "BYTES", out_shape or shape),))


def test_synthesized_config_of_a_batching_model(tmp_path: Path) -> None:
    labels = tmp_path / "classes.txt"
    labels.write_text("a\nb\n")
    config = synthesize("alias", _metadata((-1, 3, 4)), ClassificationConfig({"alias": {"y": str(labels)}}))
    assert config["name"] == "alias" and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == UNKNOWN_MAX_BATCH_SIZE
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 4]}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_STRING", "dims": [3, 4],
                                 "label_filename": "classes.txt"}]
    assert SYNTHESIZED_PARAMETER in config["parameters"]


@pytest.mark.parametrize(("shape", "out_shape", "batching"), [
    ((-1, 16), None, True),
    ((-1,), None, False),         # one variable dimension: a length, not a batch
    ((1, 1000), None, False),     # fixed leading dimension
    ((-1, 16), (16,), False),     # every tensor must have the batch dimension
])
def test_batching_is_inferred_from_a_leading_variable_dimension(
        shape: tuple[int, ...], out_shape: tuple[int, ...] | None, batching: bool) -> None:
    metadata = _metadata(shape, out_shape)
    assert batches(metadata) is batching
    config = synthesize("m", metadata, ClassificationConfig())
    assert config["max_batch_size"] == (UNKNOWN_MAX_BATCH_SIZE if batching else 0)
    assert config["input"][0]["dims"] == list(shape[1:] if batching else shape)


# --- statistics accumulator --------------------------------------------------------


def _record(model: str = "m", version: str = "", outcome: str = "ok", batch: int | None = 1) -> RequestRecord:
    return RequestRecord(model=model, version=version, outcome=outcome, batch_size=batch, decode_seconds=0.001,
                         upstream_seconds=0.002, encode_seconds=0.003)


def test_statistics_accumulate_what_finished_requests_report() -> None:
    store = StatisticsStore(clock=lambda: 1234.5678)
    for batch in (1, 4, 4):
        store.observe(_record(batch=batch), 0.01)
    store.observe(_record(outcome="upstream_unavailable"), 0.5)
    store.observe(_record(outcome="model_not_found"), 0.5)  # nobody serves it: not tracked
    store.observe(_record(batch=None), 0.5)  # not an inference (e.g. metadata)
    (stats,) = store.snapshot("m")
    assert (stats.execution_count, stats.inference_count) == (3, 9)
    assert (stats.success.count, stats.success.ns) == (3, 30_000_000)
    assert (stats.fail.count, stats.fail.ns) == (1, 500_000_000)
    assert (stats.compute_input.ns, stats.compute_infer.ns, stats.compute_output.ns) == (
        3_000_000, 6_000_000, 9_000_000)
    assert (stats.queue.count, stats.queue.ns) == (3, 0)
    assert stats.last_inference_ms == 1234567
    assert {size: b.compute_infer.count for size, b in stats.batches.items()} == {1: 1, 4: 2}


def test_statistics_keep_versions_apart_and_are_bounded() -> None:
    store = StatisticsStore(max_models=2)
    for model, version in (("a", ""), ("a", "2"), ("b", "")):
        store.observe(_record(model, version), 0.01)
    assert [(s.name, s.version) for s in store.snapshot()] == [("a", ""), ("a", "2")]
    assert [s.version for s in store.snapshot("a", "2")] == ["2"]
    snapshot = store.snapshot("a", "")[0]
    store.observe(_record("a"), 0.01)
    assert snapshot.execution_count == 1  # a snapshot does not move


def test_batch_size_is_the_shared_leading_dimension_of_matrix_inputs() -> None:
    def tensors(*shapes: tuple[int, ...]) -> list[Tensor]:
        return [Tensor.from_numpy(f"i{n}", np.zeros(shape, np.float32)) for n, shape in enumerate(shapes)]

    assert batch_size(tensors((8, 16), (8, 2))) == 8
    assert batch_size(tensors((8, 16), (4, 2))) == 1
    assert batch_size(tensors((8, 16), (8,))) == 1
    assert batch_size(tensors((5,))) == 1


# --- configuration keys --------------------------------------------------------------

BASE = """
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams: [{name: local, protocol: builtin}]
routes: [{upstream: local}]
"""


def test_server_extensions_default_to_all_and_reject_unknown_names() -> None:
    assert parse_yaml_config(BASE).server.extensions == DEFAULT_EXTENSIONS
    config = parse_yaml_config(BASE + "server: {name: triton, extensions: [statistics]}")
    assert (config.server.name, config.server.extensions) == ("triton", ("statistics",))
    with pytest.raises(ConfigError) as info:
        parse_yaml_config(BASE + "server: {extensions: [statistics, shared_memory]}")
    assert "server.extensions[1]: unknown extension 'shared_memory'" in str(info.value)


def test_label_files_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    from gateway.app.configure import load_config

    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    path = tmp_path / "gateway.yaml"
    path.write_text(BASE + "classification: {labels: {simple: labels.txt, trig: {f: labels.txt}}}")
    labels = load_config(path).classification
    assert labels.label_file("simple", "OUTPUT0") == str(tmp_path / "labels.txt")
    assert labels.label_file("trig", "f") == str(tmp_path / "labels.txt")
    assert labels.label_file("trig", "g") is None
    path.write_text(BASE + "classification: {labels: {simple: missing.txt}}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "classification.labels.simple: cannot read label file" in str(info.value)


# --- gRPC messages, read by tritonclient's classes -------------------------------------


def test_model_config_round_trip_keeps_every_field_tritonclient_writes() -> None:
    """A configuration as a Triton upstream sends it survives message -> JSON
    (REST form, numbers for 64-bit integers) -> message, field for field."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from gateway.protocols.v2_grpc import extensions, messages

    theirs = text_format.Parse("""
        name: "densenet" platform: "onnxruntime_onnx" max_batch_size: 8
        version_policy { specific { versions: [1, 3] } }
        input { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 224, 224]
                reshape { shape: [1, 3, 224, 224] } }
        output { name: "y" data_type: TYPE_FP32 dims: [1000] label_filename: "labels.txt" }
        dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100
                           priority_queue_policy { key: 2 value { max_queue_size: 5 } } }
        instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }
        parameters { key: "k" value { string_value: "v" } }
        model_warmup { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [3]
                                                                         random_data: true } } }
        """, model_config_pb2.ModelConfig())
    ours = messages.ModelConfig.FromString(theirs.SerializeToString())
    as_json = extensions.config_to_json(ours)
    assert as_json["input"][0]["dims"] == [3, 224, 224]  # numbers, as Triton's REST writes them
    assert as_json["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert as_json["dynamic_batching"]["priority_queue_policy"]["2"]["max_queue_size"] == 5
    back = extensions.config_from_json(as_json)
    assert model_config_pb2.ModelConfig.FromString(back.SerializeToString()) == theirs


def test_config_that_does_not_fit_is_a_bad_upstream_answer() -> None:
    from gateway.protocols.v2_grpc import extensions

    with pytest.raises(GatewayError) as info:
        extensions.config_from_json({"name": "m", "max_batch_size": "many"})
    assert info.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE


def test_statistics_and_index_messages_parse_with_tritonclient() -> None:
    from tritonclient.grpc import service_pb2

    from gateway.protocols.triton.repository import IndexEntry
    from gateway.protocols.v2_grpc import extensions

    store = StatisticsStore(clock=lambda: 2.0)
    store.observe(_record("simple", "1", batch=2), 0.25)
    theirs = service_pb2.ModelStatisticsResponse.FromString(
        extensions.statistics_message(store.snapshot()).SerializeToString())
    (stats,) = theirs.model_stats
    assert (stats.name, stats.version, stats.last_inference, stats.inference_count) == ("simple", "1", 2000, 2)
    assert (stats.inference_stats.success.count, stats.inference_stats.success.ns) == (1, 250_000_000)
    assert stats.inference_stats.HasField("cache_hit")
    assert stats.batch_stats[0].batch_size == 2 and stats.batch_stats[0].compute_infer.ns == 2_000_000
    index = service_pb2.RepositoryIndexResponse.FromString(extensions.index_message(
        [IndexEntry("a"), IndexEntry("b", state="UNAVAILABLE", reason="down")]).SerializeToString())
    assert [(m.name, m.state, m.reason) for m in index.models] == [("a", "READY", ""), ("b", "UNAVAILABLE", "down")]
