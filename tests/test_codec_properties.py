"""Round-trip properties of every codec (hypothesis): canonical -> wire ->
canonical is the identity for every datatype and shape the wire form can
carry. Where a form cannot carry a value (JSON has no NaN, no infinities and
no non-UTF-8 strings), the strategy leaves it out and the test says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gateway.config.limits import Limits
from gateway.core.errors import GatewayError
from gateway.core.graphtensors import NODE_TASKS, GraphTensors, prediction_name
from gateway.core.modelnames import check_model
from gateway.core.types import (
    DATATYPES,
    NUMPY_DTYPES,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    element_count,
)
from gateway.protocols.graphstorm import codec as graphstorm
from gateway.protocols.graphstorm.payload import decode_payload, encode_payload
from gateway.protocols.umbridge import codec as umbridge
from gateway.protocols.umbridge import passthrough as umbridge_passthrough
from gateway.protocols.v2_grpc import codec as v2_grpc
from gateway.protocols.v2_grpc import messages as pb
from gateway.protocols.v2_rest import codec as v2_rest

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


# --- hostile input: only the gateway's own errors -------------------------------------------
#
# JSON text is written here by hand, so it can hold what no encoder writes:
# NaN/Infinity literals (read by the Python-json path), lone surrogate
# escapes, integers beyond 64 bits, duplicate keys, shapes of many or huge
# dimensions. Every decoder may only raise GatewayError, and every such
# error must be encodable in each protocol's error form.

HOSTILE_STRINGS = st.one_of(st.text(max_size=6), st.sampled_from(["\ud800", "a\udfff", "\udbff\udc00", "", "\x00"]))
HOSTILE_LEAVES = st.one_of(
    st.integers(-(2 ** 70), 2 ** 70), st.floats(), st.booleans(), st.none(), HOSTILE_STRINGS)
HUGE_DIMS = st.one_of(st.integers(-1, 4), st.integers(2 ** 31, 2 ** 66), st.just(0))
GRPC_SHAPES = st.one_of(  # int64 dimensions, as the message carries them
    st.lists(st.one_of(st.integers(-1, 4), st.integers(2 ** 31, 2 ** 63 - 1)), max_size=4),
    st.lists(st.just(1), min_size=30, max_size=70))
SHAPES_HOSTILE = st.one_of(
    st.lists(HUGE_DIMS, max_size=4), st.lists(st.just(1), min_size=30, max_size=70),
    st.lists(HOSTILE_LEAVES, max_size=3), HOSTILE_LEAVES)


class Pairs(list):  # type: ignore[type-arg]
    """A JSON object as (key, value) pairs: keys may repeat."""


def json_text(value: Any, ascii_only: bool = True) -> str:
    """``value`` as JSON text, with NaN/Infinity literals, repeated keys
    (Pairs) and lone surrogates: escaped (``ascii_only``) or raw."""
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=ascii_only)}:{json_text(v, ascii_only)}"
                              for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def bodies(value: Any) -> tuple[bytes, bytes]:
    """``value`` as JSON bodies: with escapes, and with raw characters (a
    lone surrogate then becomes bytes that are not UTF-8)."""
    return json_text(value).encode(), json_text(value, ascii_only=False).encode("utf-8", "surrogatepass")


def _pairs(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> Pairs:
    """Some of ``fields`` (maybe twice), maybe an unknown key, in any order."""
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=len(fields) + 1))
    pairs = Pairs((key, draw(fields[key])) for key in chosen)
    if draw(st.booleans()):
        pairs.append((draw(HOSTILE_STRINGS), draw(HOSTILE_LEAVES)))
    return pairs


NESTED = st.recursive(HOSTILE_LEAVES, lambda inner: st.lists(inner, max_size=3), max_leaves=12)
OBJECTS = st.recursive(HOSTILE_LEAVES, lambda inner: st.lists(inner, max_size=3) | st.lists(
    st.tuples(HOSTILE_STRINGS, inner), max_size=3).map(Pairs), max_leaves=8)


@st.composite
def hostile_tensor(draw: st.DrawFn) -> Pairs:
    return _pairs(draw, {"name": HOSTILE_STRINGS, "datatype": st.sampled_from([*sorted(DATATYPES), "X"]),
                         "shape": SHAPES_HOSTILE, "data": st.one_of(NESTED, st.just([1.0]), st.just([])),
                         "parameters": st.builds(lambda size, extra: Pairs([("binary_data_size", size), *extra]),
                                                 st.integers(-1, 64), st.lists(st.tuples(HOSTILE_STRINGS,
                                                                                         HOSTILE_LEAVES), max_size=2))})


@st.composite
def hostile_v2_json(draw: st.DrawFn) -> Pairs:
    tensors = st.lists(hostile_tensor(), max_size=3)
    return _pairs(draw, {"id": HOSTILE_STRINGS, "inputs": tensors, "outputs": tensors, "parameters": OBJECTS,
                         "model_name": HOSTILE_STRINGS})


def assert_encodable(error: GatewayError) -> None:
    """The error in every protocol's form: none of these may raise."""
    v2_rest.encode_error(error)
    v2_grpc.encode_error(error)[1].encode("utf-8")
    umbridge.encode_error(error)
    graphstorm.encode_error(error, "")


def only_gateway_errors(decode: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``decode(*args, **kwargs)`` raises nothing, or a GatewayError every protocol can encode."""
    try:
        decode(*args, **kwargs)
    except GatewayError as error:
        assert_encodable(error)


HOSTILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _v2_body(shape: Any, data: Any = (1,), name: str = "t", datatype: str = "FP32", **top: Any) -> Pairs:
    tensor = Pairs([("name", name), ("datatype", datatype), ("shape", shape), ("data", list(data))])
    return Pairs([*top.items(), ("inputs", [tensor])])


@HOSTILE
@given(hostile_v2_json(), st.binary(max_size=16))
@example(_v2_body([1] * 65), b"")
@example(_v2_body([2 ** 62, 4, 0], ()), b"")
@example(_v2_body([1], [float("nan")], "\ud800"), b"")
@example(_v2_body([1], ["\udfff"], datatype="BYTES", x=float("nan")), b"")
def test_v2_rest_decoders_raise_only_gateway_errors(request: Pairs, tail: bytes) -> None:
    for body in bodies(request):
        only_gateway_errors(v2_rest.decode_infer_request, body, None, "m", "", MAX, LIMITS, keep_raw=True)
        only_gateway_errors(v2_rest.decode_infer_request, body + tail, str(len(body)), "m", "", MAX, LIMITS,
                            keep_raw=True)
        only_gateway_errors(v2_rest.decode_infer_response, body, None, MAX)
        only_gateway_errors(v2_rest.renamed_response, body, None, "m", "1")
        only_gateway_errors(v2_rest.decode_model_metadata, body)


@HOSTILE
@given(st.lists(st.tuples(st.sampled_from(sorted(DATATYPES)), GRPC_SHAPES, st.booleans()), min_size=1, max_size=3))
def test_v2_grpc_decoder_raises_only_gateway_errors(items: list[tuple[str, list[int], bool]]) -> None:
    message = pb.ModelInferRequest(model_name="m")
    for datatype, shape, raw in items:
        message.inputs.add(name="t", datatype=datatype, shape=shape)
        if raw:
            message.raw_input_contents.append(b"\0" * 8)
    only_gateway_errors(v2_grpc.decode_infer_request, message.SerializeToString(), MAX, LIMITS)


@st.composite
def hostile_umbridge(draw: st.DrawFn) -> Pairs:
    index = st.one_of(st.integers(-2, 3), HOSTILE_LEAVES)
    return _pairs(draw, {"name": HOSTILE_STRINGS, "config": OBJECTS, "input": NESTED, "outWrt": index,
                         "inWrt": index, "inWrt1": index, "inWrt2": index, "sens": NESTED, "vec": NESTED})


@HOSTILE
@given(hostile_umbridge())
def test_umbridge_decoders_raise_only_gateway_errors(call: Pairs) -> None:
    def decode(body: bytes) -> None:
        decoded, _ = umbridge_passthrough.read_call(body)  # the listener's reader
        umbridge.config_text(decoded.config)
        umbridge.decode_inputs(decoded, (2, 1))
        for kind in ("Gradient", "ApplyJacobian", "ApplyHessian"):
            only_gateway_errors(umbridge.decode_derivative, kind, decoded, (2, 1), (3,))

    def answer(body: bytes) -> None:
        umbridge.decode_outputs(umbridge.decode_answer(body, "up"), "up")
        umbridge_passthrough.read_outputs(200, body, "up")  # the upstream client's reader

    for body in bodies(call):
        only_gateway_errors(decode, body)
        only_gateway_errors(answer, body)


@st.composite
def hostile_graphstorm(draw: st.DrawFn) -> Pairs:
    """Mostly valid graphs (so that answers get encoded too) with hostile
    ids, types and features."""
    types = st.sampled_from(["user", "movie", "\ud800"])
    ids = st.one_of(st.sampled_from(["a1", "m1", "\udfff"]), HOSTILE_LEAVES)
    feature = st.one_of(st.just([1.0, 2.0]), NESTED, st.just([[[[[[[[[[[[1.0]]]]]]]]]]]]))
    nodes = draw(st.lists(st.tuples(types, ids), min_size=1, max_size=4))
    features = draw(feature)
    graph = Pairs([("nodes", [Pairs([("node_type", t), ("node_id", i), ("features", Pairs([("feat", features)]))])
                              for t, i in nodes]),
                   ("edges", [Pairs([("edge_type", [nodes[0][0], draw(HOSTILE_STRINGS), nodes[-1][0]]),
                                     ("src_node_id", nodes[0][1]), ("dest_node_id", nodes[-1][1])])])])
    targets = [Pairs([("node_type", t), ("node_id", i)]) for t, i in draw(st.lists(st.sampled_from(nodes),
                                                                                   min_size=1, max_size=3))]
    return _pairs(draw, {"version": st.just("gs-realtime-v0.1"), "gml_task": st.sampled_from(NODE_TASKS),
                         "graph": st.just(graph), "targets": st.just(targets)})


@HOSTILE
@given(hostile_graphstorm())
def test_graphstorm_decoders_raise_only_gateway_errors(payload: Pairs) -> None:
    def invoke(body: bytes) -> None:
        invocation = graphstorm.decode_invocation(graphstorm.parse_json(body), None, NODE_TASKS)
        invocation.graph.to_tensors()
        predictions = [Tensor(prediction_name(t), "FP32", (len(ids), 1), np.zeros((len(ids), 1), np.float32))
                       for t, ids in invocation.node_targets.items()]
        graphstorm.encode_results(invocation, predictions, "uid")

    for body in bodies(payload):
        only_gateway_errors(invoke, body)


@HOSTILE
@given(st.binary(max_size=12), st.text(max_size=6))
def test_names_from_headers_raise_only_gateway_errors(raw: bytes, text: str) -> None:
    """A header value as aiohttp hands it over (non-UTF-8 bytes as lone
    surrogates) is refused as a model name in every protocol's form."""
    for name in (raw.decode("utf-8", "surrogateescape"), text):
        only_gateway_errors(check_model, name, "")
        only_gateway_errors(element_count, [name], name)


def test_v2_grpc_request_with_a_lone_surrogate_is_invalid_input() -> None:
    """What a GraphStorm client may send (its parser reads lone surrogates)
    cannot become protobuf text: the client's error, not a crash."""
    tensor = Tensor("node_ids/\ud800", "INT32", (1,), np.zeros(1, np.int32))
    with pytest.raises(GatewayError) as info:
        v2_grpc.encode_infer_request(InferRequest("m", inputs=[tensor]))
    assert info.value.kind.value == "invalid_input"
    assert_encodable(info.value)
