"""Round-trip properties of every codec (hypothesis): canonical -> wire ->
canonical is the identity for every datatype and shape the wire form can
carry. Where a form cannot carry a value (JSON has no NaN, no infinities and
no non-UTF-8 strings), the strategy leaves it out and the test says so."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gateway.config import Limits
from gateway.protocols.graphstorm.graph import NODE_TASKS, GraphTensors
from gateway.protocols.graphstorm.payload import decode_payload, encode_payload
from gateway.protocols.umbridge import codec as umbridge
from gateway.protocols.v2_grpc import codec as v2_grpc
from gateway.protocols.v2_grpc import messages as pb
from gateway.protocols.v2_rest import codec as v2_rest
from gateway.types import DATATYPES, NUMPY_DTYPES, InferRequest, InferResponse, RequestedOutput, Tensor

PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = Limits()
MAX = LIMITS.max_tensor_elements
SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)


def _float_elements(width: int, finite: bool) -> st.SearchStrategy[float]:
    return st.floats(width=width, allow_nan=not finite, allow_infinity=not finite)  # type: ignore[arg-type]


@st.composite
def tensors(draw: st.DrawFn, datatype: str, json_safe: bool, name: str = "t") -> Tensor:
    """A tensor of ``datatype``; ``json_safe``: only values JSON carries."""
    shape = draw(SHAPES)
    count = int(np.prod(shape, dtype=np.int64))
    if datatype == "BYTES":
        items = st.text(max_size=6).map(str.encode) if json_safe else st.binary(max_size=6)
        array = np.empty(count, dtype=object)
        array[:] = draw(st.lists(items, min_size=count, max_size=count))
        return Tensor(name, datatype, shape, array.reshape(shape))
    dtype = NUMPY_DTYPES[datatype]
    if datatype in ("FP16", "FP32", "FP64"):
        elements: st.SearchStrategy[Any] = _float_elements(dtype.itemsize * 8, json_safe)
        array = draw(hnp.arrays(dtype, shape, elements=elements))
    elif datatype == "BF16":  # raw bit patterns; JSON cannot carry inf/NaN (all-ones exponent)
        bits = st.integers(0, 0xFFFF).filter(lambda b: not json_safe or (b & 0x7F80) != 0x7F80)
        array = draw(hnp.arrays(dtype, shape, elements=bits))
    else:
        array = draw(hnp.arrays(dtype, shape))
    return Tensor(name, datatype, shape, array)


@st.composite
def requests(draw: st.DrawFn, json_safe: bool) -> InferRequest:
    types = draw(st.lists(st.sampled_from(sorted(DATATYPES)), min_size=1, max_size=4))
    inputs = [draw(tensors(dt, json_safe, f"in{i}")) for i, dt in enumerate(types)]
    scalars = st.one_of(st.booleans(), st.integers(-(2 ** 62), 2 ** 62), st.text(max_size=8))
    parameters = draw(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: not k.startswith("binary")),
                                      scalars, max_size=3))
    outputs = [RequestedOutput(n) for n in draw(st.lists(NAMES, max_size=2, unique=True))]
    return InferRequest("m", "1", draw(st.text(max_size=8)), inputs, outputs, parameters)


def assert_same_tensors(got: list[Tensor], want: list[Tensor]) -> None:
    assert [(t.name, t.datatype, t.shape) for t in got] == [(t.name, t.datatype, tuple(t.shape)) for t in want]
    for a, b in zip(got, want, strict=True):
        assert a.data.shape == b.data.shape
        if b.datatype == "BYTES":
            assert list(a.data.reshape(-1)) == list(b.data.reshape(-1))
        else:  # bit for bit (NaN payloads and -0.0 included)
            assert a.data.dtype == NUMPY_DTYPES[b.datatype]
            assert np.ascontiguousarray(a.data).tobytes() == np.ascontiguousarray(b.data).tobytes()


def _json_equal(a: Tensor, b: Tensor) -> None:
    if b.datatype in ("FP16", "FP32", "FP64"):  # JSON writes -0.0 and 0.0 alike only if equal as numbers
        np.testing.assert_array_equal(a.data, b.data)
    else:
        assert_same_tensors([a], [b])


# --- V2 REST ------------------------------------------------------------------------


@PROPERTIES
@given(requests(json_safe=False))
def test_v2_rest_binary_request_round_trip(request: InferRequest) -> None:
    body, headers = v2_rest.encode_infer_request(request, binary=True)
    decoded = v2_rest.decode_infer_request(body, headers.get(v2_rest.HEADER_LENGTH), "m", "1", MAX, LIMITS)
    assert_same_tensors(decoded.inputs, request.inputs)
    assert (decoded.id, [o.name for o in decoded.outputs]) == (request.id, [o.name for o in request.outputs])
    assert {k: v for k, v in decoded.parameters.items() if k != "binary_data_output"} == request.parameters


@PROPERTIES
@given(requests(json_safe=True))
def test_v2_rest_json_request_round_trip(request: InferRequest) -> None:
    body, headers = v2_rest.encode_infer_request(request, binary=False)
    assert v2_rest.HEADER_LENGTH not in headers
    decoded = v2_rest.decode_infer_request(body, None, "m", "1", MAX, LIMITS)
    assert [(t.name, t.datatype, t.shape) for t in decoded.inputs] == [
        (t.name, t.datatype, t.shape) for t in request.inputs]
    for got, want in zip(decoded.inputs, request.inputs, strict=True):
        _json_equal(got, want)
    assert decoded.parameters == request.parameters


@PROPERTIES
@given(requests(json_safe=False))
def test_v2_rest_binary_response_round_trip(request: InferRequest) -> None:
    response = InferResponse("m", "1", "id", request.inputs, {"p": 1})
    asked = InferRequest("m", parameters={"binary_data_output": True})
    body, headers = v2_rest.encode_infer_response(response, asked)
    decoded = v2_rest.decode_infer_response(body, headers.get(v2_rest.HEADER_LENGTH), MAX)
    assert (decoded.model_name, decoded.model_version, decoded.id, decoded.parameters) == ("m", "1", "id", {"p": 1})
    assert_same_tensors(decoded.outputs, response.outputs)


@PROPERTIES
@given(requests(json_safe=True), st.dictionaries(st.text(min_size=1, max_size=6), st.integers(-99, 99), max_size=2))
def test_v2_rest_json_response_round_trip(request: InferRequest, parameters: dict[str, Any]) -> None:
    response = InferResponse("m", "1", request.id, request.inputs, parameters)
    body, headers = v2_rest.encode_infer_response(response, InferRequest("m"))  # JSON unless asked
    assert v2_rest.HEADER_LENGTH not in headers
    decoded = v2_rest.decode_infer_response(body, None, MAX)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", request.id)
    assert decoded.parameters == parameters
    assert [(t.name, t.datatype, t.shape) for t in decoded.outputs] == [
        (t.name, t.datatype, t.shape) for t in response.outputs]
    for got, want in zip(decoded.outputs, response.outputs, strict=True):
        _json_equal(got, want)


# --- V2 gRPC ------------------------------------------------------------------------

# The typed contents field of each datatype, as the Open Inference Protocol's
# InferTensorContents declares them (FP16 and BF16 have none: raw only).
TYPED_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                  "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
                  "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


@PROPERTIES
@given(requests(json_safe=False))
def test_v2_grpc_raw_request_round_trip(request: InferRequest) -> None:
    wire = v2_grpc.encode_infer_request(request)
    decoded = v2_grpc.decode_infer_request(wire, MAX, LIMITS)
    assert_same_tensors(decoded.inputs, request.inputs)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", request.id)
    assert decoded.parameters == request.parameters
    assert [o.name for o in decoded.outputs] == [o.name for o in request.outputs]


@PROPERTIES
@given(requests(json_safe=False))
def test_v2_grpc_raw_response_round_trip(request: InferRequest) -> None:
    """Raw output contents: the only form tritonclient.grpc reads."""
    response = InferResponse("m", "1", request.id, request.inputs, request.parameters)
    wire = v2_grpc.encode_infer_response(response)
    message = pb.ModelInferResponse.FromString(wire)
    assert len(message.raw_output_contents) == len(response.outputs)
    assert not any(o.HasField("contents") for o in message.outputs)
    decoded = v2_grpc.decode_infer_response(wire, MAX)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", request.id)
    assert decoded.parameters == request.parameters
    assert_same_tensors(decoded.outputs, response.outputs)


def test_typed_contents_table_matches_the_codec() -> None:
    assert dict(v2_grpc.TYPED_FIELD) == TYPED_CONTENTS


@PROPERTIES
@given(st.lists(st.sampled_from(sorted(TYPED_CONTENTS)), min_size=1, max_size=4).flatmap(
    lambda types: st.tuples(*(tensors(dt, False, f"in{i}") for i, dt in enumerate(types)))), st.text(max_size=8))
def test_v2_grpc_typed_request_round_trip(inputs: tuple[Tensor, ...], request_id: str) -> None:
    """A request with typed contents (what clients other than tritonclient
    send), built here with protobuf alone, decodes to the same tensors."""
    message = pb.ModelInferRequest(model_name="m", model_version="1", id=request_id)
    for tensor in inputs:
        item = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        values = tensor.data.reshape(-1).tolist()
        getattr(item.contents, TYPED_CONTENTS[tensor.datatype]).extend(values)
    decoded = v2_grpc.decode_infer_request(message.SerializeToString(), MAX, LIMITS)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", request_id)
    assert [(t.name, t.datatype, t.shape) for t in decoded.inputs] == [(t.name, t.datatype, t.shape) for t in inputs]
    for got, want in zip(decoded.inputs, inputs, strict=True):
        # Equal values, not bits: building the message from Python floats
        # may quieten a signalling NaN (a fact of the builder, not the codec).
        _json_equal(got, want)


@PROPERTIES
@given(st.lists(st.sampled_from(sorted(v2_grpc.TYPED_FIELD)), min_size=1, max_size=4).flatmap(
    lambda types: st.tuples(*(tensors(dt, False, f"out{i}") for i, dt in enumerate(types)))))
def test_v2_grpc_typed_response_round_trip(outputs: tuple[Tensor, ...]) -> None:
    response = InferResponse("m", "1", "id", list(outputs))
    wire = v2_grpc.encode_infer_response(response, typed=True)
    assert not pb.ModelInferResponse.FromString(wire).raw_output_contents  # every datatype here has a typed field
    decoded = v2_grpc.decode_infer_response(wire, MAX)
    assert_same_tensors(decoded.outputs, list(outputs))


# --- UM-Bridge -------------------------------------------------------------------------

VECTORS = st.lists(hnp.arrays(np.float64, st.integers(0, 5), elements=_float_elements(64, True)), max_size=4)
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 53), 2 ** 53) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=3), max_leaves=8)


@PROPERTIES
@given(VECTORS, st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3), st.booleans())
def test_umbridge_call_round_trip(inputs: list[np.ndarray], config: dict[str, Any], nonfinite: bool) -> None:
    if nonfinite and inputs and inputs[0].size:  # NaN and infinities travel as literals
        inputs[0][0] = np.nan
        inputs[0][-1] = -np.inf
    body = umbridge.encode_request("model", config, inputs, policy="literal")
    call = umbridge.decode_call(body)
    assert (call.name, call.config) == ("model", config)
    decoded = umbridge.decode_inputs(call, [len(x) for x in inputs])
    assert len(decoded) == len(inputs)
    for got, want in zip(decoded, inputs, strict=True):
        np.testing.assert_array_equal(got, want)


@PROPERTIES
@given(VECTORS, st.sampled_from(umbridge.NONFINITE_POLICIES))
def test_umbridge_outputs_round_trip(outputs: list[np.ndarray], policy: str) -> None:
    answer = umbridge.decode_answer(umbridge.encode_outputs(outputs, policy), "up")
    for got, want in zip(umbridge.decode_outputs(answer, "up"), outputs, strict=True):
        np.testing.assert_array_equal(got, want)


# --- GraphStorm graph tensors ---------------------------------------------------------------


@st.composite
def graphs(draw: st.DrawFn) -> GraphTensors:
    graph = GraphTensors()
    types = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    for node_type in types:
        ids = draw(st.lists(st.text(max_size=5), min_size=1, max_size=5, unique=True))
        column = np.empty(len(ids), dtype=object)
        column[:] = [i.encode() for i in ids]
        graph.node_ids[node_type] = column
        for feature in draw(st.lists(NAMES, max_size=2, unique=True)):
            width = draw(st.integers(1, 3))
            graph.node_features.setdefault(node_type, {})[feature] = draw(hnp.arrays(
                np.float32, (len(ids), width), elements=_float_elements(32, True)))
    for _ in range(draw(st.integers(0, 2))):
        src, dst = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        relation = (src, draw(NAMES), dst)
        if relation in graph.edge_index:
            continue
        edges = draw(st.integers(1, 4))
        graph.edge_index[relation] = np.array(
            [draw(st.lists(st.integers(0, graph.node_count(end) - 1), min_size=edges, max_size=edges))
             for end in (src, dst)], dtype=np.int64)
    for node_type in types:  # targets grouped in graph order, as GraphStorm answers
        if draw(st.booleans()) or not graph.node_targets:
            positions = draw(st.lists(st.integers(0, graph.node_count(node_type) - 1), min_size=1, max_size=3))
            graph.node_targets[node_type] = np.array(positions, dtype=np.int64)
    return graph


@PROPERTIES
@given(graphs(), st.sampled_from(NODE_TASKS))
def test_graphstorm_graph_tensors_round_trip(graph: GraphTensors, task: str) -> None:
    """Graph tensors -> a GraphStorm payload on the wire -> graph tensors
    (the path of a V2 client calling a GraphStorm endpoint, and back)."""
    payload = orjson.loads(orjson.dumps(encode_payload(graph, task)))
    invocation = decode_payload(payload, None, NODE_TASKS)
    assert invocation.task == task
    got, want = invocation.graph.to_tensors(), graph.to_tensors()
    assert_same_tensors(got, want)
