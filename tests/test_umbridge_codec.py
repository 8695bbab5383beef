"""UM-Bridge codec: pure functions, no sockets."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import Derivative
from gateway.protocols.umbridge import codec


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_error_kind_has_a_type_and_status(kind: ErrorKind) -> None:
    status, body = codec.encode_error(GatewayError(kind, "boom"))
    error = orjson.loads(body)["error"]
    assert set(error) == {"type", "message"} and error["message"] == "boom"
    assert 400 <= status <= 599
    assert codec.ERROR_TYPES[kind] == (error["type"], status)


def test_reference_types_and_statuses() -> None:
    assert codec.ERROR_TYPES[ErrorKind.MODEL_NOT_FOUND] == ("ModelNotFound", 400)
    assert codec.ERROR_TYPES[ErrorKind.UNSUPPORTED] == ("UnsupportedFeature", 400)
    assert codec.ERROR_TYPES[ErrorKind.INVALID_INPUT] == ("InvalidInput", 400)
    assert codec.ERROR_TYPES[ErrorKind.MALFORMED_REQUEST] == ("InvalidInput", 400)
    assert codec.ERROR_TYPES[ErrorKind.UPSTREAM_BAD_RESPONSE] == ("InvalidOutput", 500)


@pytest.mark.parametrize(("body", "needle"), [
    (b"", "empty"),
    (b"  \n", "empty"),
    (b"{", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"input": [[1]]}', "no model 'name'"),
    (b'{"name": 3}', "'name' must be a string"),
    (b'{"name": "m", "config": [1]}', "'config' must be a JSON object"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_structurally_bad_calls(body: bytes, needle: str) -> None:
    with pytest.raises(GatewayError) as info:
        codec.decode_call(body)
    assert info.value.kind == ErrorKind.MALFORMED_REQUEST
    assert needle in info.value.message


def test_call_with_config() -> None:
    call = codec.decode_call(b'{"name": "m", "config": {"b": 1, "a": [2]}, "input": [[1, 2]]}')
    assert (call.name, call.config) == ("m", {"b": 1, "a": [2]})
    assert call.config_text == '{"a":[2],"b":1}'  # canonical: sorted keys
    assert codec.decode_call(b'{"name": "m", "config": null}').config_text == ""
    assert codec.config_from_text(call.config_text) == call.config


@pytest.mark.parametrize(("text", "needle"), [(3, "must be a string"), ("{", "not valid JSON"),
                                               ("[1]", "must hold a JSON object")])
def test_bad_config_parameter(text: object, needle: str) -> None:
    with pytest.raises(GatewayError, match=needle):
        codec.config_from_text(text)


def test_inputs_accept_ints_null_and_nonfinite_literals() -> None:
    call = codec.decode_call(b'{"name": "m", "input": [[1, 2.5, null], [NaN, Infinity, -Infinity]]}')
    first, second = codec.decode_inputs(call, [3, 3])
    assert first.dtype == np.float64 and first[:2].tolist() == [1.0, 2.5] and math.isnan(first[2])
    assert math.isnan(second[0]) and second[1] == math.inf and second[2] == -math.inf


@pytest.mark.parametrize(("inputs", "needle"), [
    ([[1.0, 2.0]], "has 1 vectors but the model takes 2"),
    ([[1.0, 2.0], [1.0], [3.0]], "has 3 vectors but the model takes 2"),
    ([[1.0], [1.0]], "vector 0 has length 1 but the model expects 2"),
    ([[1.0, 2.0], [1.0, 2.0]], "vector 1 has length 2 but the model expects 1"),
    ([[1.0, "2"], [1.0]], "must hold only numbers, found a string"),
    ([[1.0, True], [1.0]], "found a boolean"),
    ([[1.0, [2.0]], [1.0]], "found a list"),
    ([[1.0, {}], [1.0]], "found an object"),
    ([[1.0, 2.0], 5], "vector 1 must be a list of numbers, got a number"),
    ("x", "'input' must be a list of lists"),
])
def test_bad_inputs(inputs: object, needle: str) -> None:
    call = codec.decode_call(orjson.dumps({"name": "m", "input": inputs}))
    with pytest.raises(GatewayError) as info:
        codec.decode_inputs(call, [2, 1])
    assert info.value.kind == ErrorKind.INVALID_INPUT
    assert needle in info.value.message


def test_missing_input() -> None:
    with pytest.raises(GatewayError, match="missing 'input'"):
        codec.decode_inputs(codec.decode_call(b'{"name": "m"}'), [1])


def _derivative(kind: str, **fields: object) -> Derivative:
    call = codec.decode_call(orjson.dumps({"name": "m", **fields}))
    return codec.decode_derivative(kind, call, [2, 1], [3, 4])


def test_derivatives_decode() -> None:
    g = _derivative("Gradient", outWrt=1, inWrt=0, sens=[1, 2, 3, 4])
    assert (g.kind, g.out_wrt, g.in_wrt, g.vec) == ("Gradient", 1, 0, None)
    assert g.sens is not None and g.sens.tolist() == [1, 2, 3, 4]
    j = _derivative("ApplyJacobian", outWrt=0, inWrt=1, vec=[5])
    assert j.vec is not None and (j.in_wrt, j.vec.tolist(), j.sens) == (1, [5.0], None)
    h = _derivative("ApplyHessian", outWrt=0, inWrt1=0, inWrt2=1, sens=[1, 1, 1], vec=[2])
    assert (h.in_wrt, h.in_wrt2) == (0, 1)
    assert _derivative("Gradient", outWrt=0.0, inWrt=1, sens=[0, 0, 0]).out_wrt == 0  # integral floats pass


@pytest.mark.parametrize(("kind", "fields", "needle"), [
    ("Gradient", {"inWrt": 0, "sens": [1, 2, 3]}, "missing 'outWrt'"),
    ("Gradient", {"outWrt": 2, "inWrt": 0, "sens": [1, 2, 3]}, "'outWrt' is 2 but the model has 2 outputs"),
    ("Gradient", {"outWrt": -1, "inWrt": 0, "sens": [1, 2, 3]}, "'outWrt' is -1"),
    ("Gradient", {"outWrt": 0, "inWrt": 2, "sens": [1, 2, 3]}, "'inWrt' is 2 but the model has 2 inputs"),
    ("Gradient", {"outWrt": 0, "inWrt": "0", "sens": [1, 2, 3]}, "'inWrt' must be an integer, got a string"),
    ("Gradient", {"outWrt": 0, "inWrt": True, "sens": [1, 2, 3]}, "got a boolean"),
    ("Gradient", {"outWrt": 0, "inWrt": 0.5, "sens": [1, 2, 3]}, "must be an integer"),
    ("Gradient", {"outWrt": 0, "inWrt": 0, "sens": [1, 2]}, "'sens' has length 2 but output 0 has size 3"),
    ("Gradient", {"outWrt": 0, "inWrt": 0}, "missing 'sens'"),
    ("Gradient", {"outWrt": 0, "inWrt": 0, "sens": [1, "a", 3]}, "'sens' must hold only numbers"),
    ("ApplyJacobian", {"outWrt": 0, "inWrt": 0, "vec": [1]}, "'vec' has length 1 but input 0 has size 2"),
    ("ApplyJacobian", {"outWrt": 0, "inWrt": 0}, "missing 'vec'"),
    ("ApplyHessian", {"outWrt": 0, "inWrt1": 0, "inWrt2": 5, "sens": [1, 1, 1], "vec": [1]}, "'inWrt2' is 5"),
    ("ApplyHessian", {"outWrt": 0, "inWrt1": 3, "inWrt2": 0, "sens": [1, 1, 1], "vec": [1]}, "'inWrt1' is 3"),
    ("ApplyHessian", {"outWrt": 0, "inWrt1": 0, "inWrt2": 1, "sens": [1, 1, 1], "vec": [1, 2]},
     "'vec' has length 2 but input 1 has size 1"),
    ("ApplyHessian", {"outWrt": 1, "inWrt1": 0, "inWrt2": 1, "sens": [1, 1, 1], "vec": [1]},
     "'sens' has length 3 but output 1 has size 4"),
    # Reference order: outWrt before inWrt before vector lengths.
    ("Gradient", {"outWrt": 9, "inWrt": 9, "sens": []}, "'outWrt' is 9"),
    ("Gradient", {"outWrt": 0, "inWrt": 9, "sens": []}, "'inWrt' is 9"),
])
def test_bad_derivatives(kind: str, fields: dict[str, object], needle: str) -> None:
    with pytest.raises(GatewayError) as info:
        _derivative(kind, **fields)
    assert info.value.kind == ErrorKind.INVALID_INPUT
    assert needle in info.value.message


def test_answers() -> None:
    assert orjson.loads(codec.encode_info(["a", "b"])) == {"protocolVersion": 1.0, "models": ["a", "b"]}
    assert b'"protocolVersion":1.0' in codec.encode_info([])  # a number, not a string
    assert orjson.loads(codec.encode_sizes("inputSizes", (2, 1))) == {"inputSizes": [2, 1]}
    assert orjson.loads(codec.encode_support({"Evaluate", "Gradient"})) == {"support": {
        "Evaluate": True, "Gradient": True, "ApplyJacobian": False, "ApplyHessian": False}}
    out = orjson.loads(codec.encode_outputs([np.array([1.0, 2.0]), np.arange(3, dtype=np.float32)], "null"))
    assert out == {"output": [[1.0, 2.0], [0.0, 1.0, 2.0]]}
    assert orjson.loads(codec.encode_vector_output(np.array([0.5]), "null")) == {"output": [0.5]}


def test_nonfinite_policies() -> None:
    values = [np.array([math.nan, math.inf, -math.inf, 1.0])]
    assert orjson.loads(codec.encode_outputs(values, "null")) == {"output": [[None, None, None, 1.0]]}
    literal = codec.encode_outputs(values, "literal")
    assert literal == b'{"output":[[NaN,Infinity,-Infinity,1.0]]}'
    parsed = json.loads(literal)["output"][0]  # what Python clients (json, requests) read
    assert math.isnan(parsed[0]) and parsed[1:] == [math.inf, -math.inf, 1.0]
    with pytest.raises(GatewayError) as info:
        codec.encode_vector_output(values[0], "error")
    assert info.value.kind == ErrorKind.UPSTREAM_BAD_RESPONSE
    finite = [np.array([1.0])]
    assert codec.encode_outputs(finite, "literal") == codec.encode_outputs(finite, "error") == b'{"output":[[1.0]]}'


# --- upstream side -----------------------------------------------------------------


def test_encode_requests() -> None:
    body = orjson.loads(codec.encode_request("m", {"k": 1}))
    assert body == {"name": "m", "config": {"k": 1}}
    d = Derivative("ApplyHessian", 0, 1, 0, np.array([1.0]), np.array([2.0, 3.0]))
    body = json.loads(codec.encode_request("m", {}, [np.array([math.nan]), np.array([1.0, 2.0])], d))
    assert math.isnan(body.pop("input")[0][0])
    assert body == {"name": "m", "config": {}, "outWrt": 0, "inWrt1": 1, "inWrt2": 0, "sens": [1.0],
                    "vec": [2.0, 3.0]}
    g = Derivative("Gradient", 0, 1, 0, np.array([1.0]))
    body = orjson.loads(codec.encode_request("m", {}, [np.array([math.inf])], g, policy="null"))
    assert body["input"] == [[None]] and body["inWrt"] == 1 and "vec" not in body


def test_decode_answers_tolerates_the_python_reference_server() -> None:
    # The reference server formats outputs with str(list): nan/inf are Python reprs.
    obj = codec.decode_answer(b'{"output": [[nan, inf, -inf, 1e-5, 2]] }', "u")
    (values,) = codec.decode_outputs(obj, "u")
    assert math.isnan(values[0]) and values[1:].tolist() == [math.inf, -math.inf, 1e-5, 2.0]
    assert codec.decode_vector_output(codec.decode_answer(b'{"output": [null, 1]}', "u"), "u")[1] == 1.0
    assert codec.decode_info({"protocolVersion": 1, "models": ["a"]}, "u") == ["a"]
    assert codec.decode_sizes({"inputSizes": [0, 3]}, "inputSizes", "u") == (0, 3)
    assert codec.decode_support({"support": {"Evaluate": True, "Gradient": False}}, "u") == {"Evaluate"}


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: codec.decode_answer(b"<html>500</html>", "u"), "bad body"),
    (lambda: codec.decode_info({"protocolVersion": 0.9, "models": []}, "u"), "protocolVersion 0.9"),
    (lambda: codec.decode_info({"protocolVersion": "1.0", "models": []}, "u"), "protocolVersion 1.0;"),
    (lambda: codec.decode_info({"protocolVersion": 1.0, "models": [1]}, "u"), "not a list of names"),
    (lambda: codec.decode_sizes({"inputSizes": [-1]}, "inputSizes", "u"), "non-negative integers"),
    (lambda: codec.decode_sizes({}, "inputSizes", "u"), "without 'inputSizes'"),
    (lambda: codec.decode_outputs({"output": [["x"]]}, "u"), "bad output"),
    (lambda: codec.decode_outputs({"output": 3}, "u"), "not a list of lists"),
    (lambda: codec.decode_vector_output({"output": [[1.0]]}, "u"), "bad output"),
])
def test_bad_upstream_answers(call: object, needle: str) -> None:
    with pytest.raises(GatewayError) as info:
        call()  # type: ignore[operator]
    assert info.value.kind == ErrorKind.UPSTREAM_BAD_RESPONSE
    assert needle in info.value.message


@pytest.mark.parametrize(("status", "error_type", "kind"), [
    (400, "ModelNotFound", ErrorKind.MODEL_NOT_FOUND),
    (400, "UnsupportedFeature", ErrorKind.UNSUPPORTED),
    (400, "InvalidInput", ErrorKind.INVALID_INPUT),
    (500, "InvalidOutput", ErrorKind.UPSTREAM_BAD_RESPONSE),
    (200, "InvalidInput", ErrorKind.INVALID_INPUT),  # the reference client trusts the body, not the status
    (503, "UpstreamUnavailable", ErrorKind.UPSTREAM_UNAVAILABLE),  # another gateway upstream
    (504, "UpstreamTimeout", ErrorKind.UPSTREAM_TIMEOUT),
    (500, "InternalError", ErrorKind.UPSTREAM_BAD_RESPONSE),  # its bug, not this gateway's
    (429, "Overloaded", ErrorKind.UPSTREAM_OVERLOADED),  # its own limit, not this gateway's listener
    (413, "InvalidInput", ErrorKind.TOO_LARGE),
    (503, "", ErrorKind.UPSTREAM_UNAVAILABLE),
    (500, "", ErrorKind.UPSTREAM_BAD_RESPONSE),
    (404, "", ErrorKind.MODEL_NOT_FOUND),
    (418, "Teapot", ErrorKind.UPSTREAM_BAD_RESPONSE),
])
def test_upstream_errors_map_to_kinds(status: int, error_type: str, kind: ErrorKind) -> None:
    obj = {"error": {"type": error_type, "message": "why"}} if error_type else None
    error = codec.decode_error(status, obj, "u (127.0.0.1:1)")
    assert error.kind == kind
    assert str(status) in error.message and (not obj or "why" in error.message)
